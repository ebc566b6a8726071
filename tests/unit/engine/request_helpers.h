// Building Requests directly for scheduler and KV cache tests.
#pragma once

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/request.h"

namespace specula::testing {

inline std::unique_ptr<Request> make_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens = 16,
                                             SamplingParams params = {}) {
  auto r = std::make_unique<Request>();
  r->request_id = id;
  r->parent_id = id;
  r->prompt_token_ids = prompt;
  r->all_token_ids = prompt;
  params.max_tokens = max_tokens;
  r->params = std::make_shared<const SamplingParams>(params);
  r->max_tokens = max_tokens;
  return r;
}

// Tokens first, first+1, ... (distinct prompts for distinct `first`).
inline std::vector<int32_t> iota_tokens(int n, int32_t first = 1) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

}  // namespace specula::testing
