// Rotary position embedding tables, computed as transformers computes them.
//
// transformers builds inv_freq once per rope type (modeling_rope_utils.py), in float32 tensor
// ops, then per forward cos/sin = cos/sin(position * inv_freq) * attention_scaling. We follow the
// same order of fp32 operations (doing each transcendental in double and rounding once, which is
// within an ulp of torch's float32 kernels) so that positions, and therefore logits, agree with
// the reference to float precision.
//
// attention_scaling (YaRN's "mscale", 1 for the other types) is folded into the table exactly as
// transformers folds it into cos and sin: both q and k are scaled, so attention logits grow by
// attention_scaling^2 while the softmax scale stays 1/sqrt(head_dim).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace specula {

struct RopeFrequencies {
  std::vector<float> inv_freq;     // [rotary_dim / 2]
  double attention_scaling = 1.0;  // multiplies cos and sin
};

// inv_freq and attention scaling for `rope` over `rotary_dim` dims. max_position_embeddings is the
// config's (the default for original_max_position_embeddings where a type needs one). Dynamic NTK
// is computed for sequences within max_position_embeddings, where transformers uses the plain
// frequencies. Throws specula::Error for an odd or non-positive rotary_dim.
RopeFrequencies rope_frequencies(const RopeConfig& rope, int64_t rotary_dim, int64_t max_position_embeddings);

// The F32 [max_positions, rotary_dim] table the backend's rope op reads: row p holds
// cos(p * inv_freq[i]) * scaling for i < rotary_dim/2, then sin(p * inv_freq[i]) * scaling.
std::vector<float> rope_cos_sin_table(const RopeFrequencies& freqs, int64_t max_positions);

}  // namespace specula
