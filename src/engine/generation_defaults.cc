#include "engine/generation_defaults.h"

namespace specula {

SamplingParams default_sampling_params(const GenerationConfig& g) {
  SamplingParams p;
  if (g.temperature) p.temperature = static_cast<float>(*g.temperature);
  if (g.top_p) p.top_p = static_cast<float>(*g.top_p);
  if (g.top_k) p.top_k = static_cast<int>(*g.top_k);
  if (g.min_p) p.min_p = static_cast<float>(*g.min_p);
  if (g.repetition_penalty) p.repetition_penalty = static_cast<float>(*g.repetition_penalty);
  if (g.max_new_tokens) p.max_tokens = static_cast<int>(*g.max_new_tokens);
  return p;
}

}  // namespace specula
