// What the fused decoder kernels (cuda_decoder_chain.cu, cuda_decoder_forward.cu) take of a
// DecoderWeights: bf16 weights on the GPU of the shapes its dims say, a bf16 paged cache, and
// the layers' pointers in the kernels' form.
#pragma once

#include <vector>

#include "backend/attention_metadata.h"
#include "backend/cuda/cuda_decoder_chain.h"
#include "backend/decoder_weights.h"

namespace specula {

struct FusedDecoderDims {
  int64_t hidden = 0, vocab = 0, head_dim = 0, intermediate = 0;
  int64_t lm_vocab = 0;  // lm_head rows: vocab, or an EAGLE-3 head's draft vocabulary
  int64_t q_width = 0, kv_width = 0;  // Hq D, Hk D
};

// The dims of w when every weight is bf16 on the GPU of the shape they say, rows are 16-byte
// multiples and the attention's head dims are ones the kernels split into 8-wide chunks (at most
// 256); false otherwise. An EAGLE-3 head (w.hidden_norm) is one layer with its own dims.
bool fused_decoder_dims(const DecoderWeights& w, FusedDecoderDims& dims);
// Whether kv is a bf16 cache of w's kv heads, one entry per layer.
bool fused_kv_fits(const DecoderWeights& w, const std::vector<KVCacheLayer>& kv, int block_size);
// w's layers and their caches in the kernels' form (out: w.layers.size() entries).
void fill_fused_layers(const DecoderWeights& w, std::vector<KVCacheLayer>& kv, cuda::DecoderChainLayer* out);

}  // namespace specula
