// OpenAI request bodies -> typed requests. Field names, defaults and validation messages follow
// vLLM's protocol (CompletionRequest / ChatCompletionRequest): unknown fields are ignored, a field
// of the wrong type or out of range is a 400 (ApiError) naming the parameter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/sampling_params.h"
#include "model/config.h"
#include "server/tool_choice.h"

namespace specula::server {

// Server-wide limits and defaults the parser applies.
struct RequestDefaults {
  int max_logprobs = 20;              // vLLM's --max-logprobs default
  GenerationConfig generation;        // generation_config.json sampling defaults (vLLM: --generation-config auto)
};

// Fields shared by /v1/completions and /v1/chat/completions.
struct CommonRequest {
  std::optional<std::string> model;
  SamplingParams params;              // max_tokens is resolved per prompt by resolve_max_tokens()
  std::optional<int64_t> max_tokens;  // as requested (chat: max_completion_tokens wins)
  const char* max_tokens_param = "max_tokens";
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage
  bool continuous_usage_stats = false;    // stream_options.continuous_usage_stats (vLLM extra)
  bool tokens_as_ids = false;             // return_tokens_as_token_ids (vLLM extra): "token_id:N"
  // The field that set params.structured_outputs (response_format, guided_json, ...), for the 400
  // when a forced tool_choice would set a second constraint; "" when none did.
  std::string structured_outputs_source;
  bool any_whitespace = true;             // structured_outputs.disable_any_whitespace, negated
  // Fields of the body this server does not act on (unknown ones, best_of, ...): vLLM logs them
  // once per request instead of dropping them silently.
  std::vector<std::string> ignored_fields;
};

// One prompt of a completion request: text to tokenize, or token ids as given.
struct PromptSpec {
  std::optional<std::string> text;
  std::vector<int32_t> token_ids;
};

struct CompletionRequest : CommonRequest {
  std::vector<PromptSpec> prompts;    // prompt: string | [string] | [int] | [[int]]
  bool echo = false;
  bool add_special_tokens = true;
};

// Template inputs keep the client's key order (ordered_json): a template's tojson writes tool
// schemas in that order, as Python's json.dumps does.
struct ChatRequest : CommonRequest {
  nlohmann::ordered_json messages;    // normalised: content flattened to a string where given as parts
  nlohmann::ordered_json tools;       // null when absent
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_special_tokens = false;    // the template already holds bos etc.
  bool echo = false;                  // vLLM extra: prepend the last message when it is the assistant's
  bool logprobs = false;              // chat: a boolean; top_logprobs gives the count
  int top_logprobs = 0;
  ToolChoice tool_choice;             // a forced one has already set params.structured_outputs
};

// Both throw ApiError (400) naming the offending parameter. `ordered` is the same body parsed as
// ordered_json: JSON schemas (structured outputs, tools) keep the client's key order.
CompletionRequest parse_completion_request(const nlohmann::json& body, const nlohmann::ordered_json& ordered,
                                           const RequestDefaults& defaults);
// The same, ordering keys as nlohmann::json does (tests).
CompletionRequest parse_completion_request(const nlohmann::json& body, const RequestDefaults& defaults);
ChatRequest parse_chat_request(const nlohmann::json& body, const nlohmann::ordered_json& ordered,
                               const RequestDefaults& defaults);

// The chat messages array (validated and normalised), shared with /tokenize.
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages);

// max_tokens for one prompt of `prompt_len` tokens: the request's value (400 stating both numbers
// when prompt + max_tokens exceed max_model_len), else generation_config's max_new_tokens or what
// is left of the context. A prompt that alone fills the context is a 400 too.
int resolve_max_tokens(const CommonRequest& req, std::optional<int64_t> default_max_tokens, int prompt_len,
                       int max_model_len);

// Checks the sampling parameters the way vLLM's SamplingParams does (400 naming the parameter).
void validate_sampling_params(const SamplingParams& p, const RequestDefaults& defaults);

}  // namespace specula::server
