// Per-request sampling settings, as vLLM's SamplingParams (OpenAI request fields map onto these).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace specula {

// vLLM's StructuredOutputsParams: one constraint on the output's text, compiled into a grammar by
// the engine (structured_output/). The server maps response_format, structured_outputs, the older
// guided_* fields and forced tool calls onto it.
struct StructuredOutputsParams {
  enum class Kind { kJson, kJsonObject, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kJsonObject;
  std::string spec;                  // kJson: the JSON Schema's text; kRegex: the pattern; kGrammar: EBNF/GBNF
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these
  // Whitespace between JSON tokens (kJson, kJsonObject): vLLM's disable_any_whitespace is false.
  bool any_whitespace = true;
};

struct SamplingParams {
  int n = 1;
  float temperature = 1.0f;        // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;                   // 0 or -1 = off
  float min_p = 0.0f;
  std::optional<uint64_t> seed;    // reproducible whatever else shares the batch
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  // OpenAI's logit_bias: added to the token's logit before anything else; sorted by token id,
  // each id once.
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::vector<std::string> stop;   // stop strings, matched across token boundaries
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  int min_tokens = 0;
  std::optional<int> max_tokens;   // unset: up to max_model_len
  std::optional<int> logprobs;     // top-N logprobs per output token (0: only the sampled one)
  std::optional<int> prompt_logprobs;
  bool skip_special_tokens = true;
  bool spaces_between_special_tokens = true;
  std::optional<StructuredOutputsParams> structured_outputs;

  bool greedy() const { return temperature <= 1e-5f; }
  // Throws specula::Error naming the offending parameter (OpenAI-style 400 at the server).
  void validate() const;
};

}  // namespace specula
