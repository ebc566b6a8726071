// Logprobs in OpenAI's two shapes, with vLLM's conventions: a token is shown as its decoded text
// (or "token_id:N" with return_tokens_as_token_ids), -inf becomes -9999.0 (JSON has no -inf).
//   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
//   completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}], "text_offset": [...]}
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/api.h"

namespace specula {
class Tokenizer;
}

namespace specula::server {

class LogprobsFormatter {
 public:
  LogprobsFormatter(const Tokenizer& tokenizer, bool tokens_as_ids) : tok_(tokenizer), as_ids_(tokens_as_ids) {}

  std::string token_string(int32_t id) const;

  // Chat: one entry per position; top_n alternatives each (the most likely first).
  nlohmann::json chat_content(const std::vector<PositionLogprobs>& positions, int top_n) const;

  // Completions: accumulates positions (a prompt position may be absent: the first one) and the
  // running text offset in characters.
  struct Completion {
    nlohmann::json tokens = nlohmann::json::array();
    nlohmann::json token_logprobs = nlohmann::json::array();
    nlohmann::json top_logprobs = nlohmann::json::array();
    nlohmann::json text_offset = nlohmann::json::array();
    size_t offset = 0;  // characters of text before the next token
    nlohmann::json to_json() const;
  };
  // `token_id` is the token at the position (needed when its logprobs are absent).
  void append_completion(Completion* acc, int32_t token_id, const std::optional<PositionLogprobs>& lp, int top_n) const;

  // vLLM's prompt_logprobs extra: [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...].
  nlohmann::json prompt_logprobs(const std::vector<std::optional<PositionLogprobs>>& positions) const;

 private:
  const Tokenizer& tok_;
  bool as_ids_;
};

// OpenAI cannot carry -inf: vLLM clamps to -9999.0.
inline double clamp_logprob(float lp) { return lp < -9999.0f ? -9999.0 : static_cast<double>(lp); }

}  // namespace specula::server
