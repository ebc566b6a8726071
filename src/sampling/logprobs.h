// Logprobs of one position as samplers compute them and the API reports them.
#pragma once

#include <cstdint>
#include <vector>

namespace specula {

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int rank = 0;                   // 1 = most likely
};
// One generated (or prompt) position: the chosen token's logprob and the top-N alternatives.
struct PositionLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // sorted, most likely first
};

}  // namespace specula
