#include "server/request_parser.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/structured_output_fields.h"
#include "server/text_util.h"

namespace specula::server {
namespace {

using nlohmann::json;

int clamp_int(int64_t v) {
  return static_cast<int>(std::clamp<int64_t>(v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

// Priority as vLLM: the request's value, then generation_config.json's, then the OpenAI default.
template <typename T, typename D>
T with_default(std::optional<T> requested, const std::optional<D>& model_default, T fallback) {
  if (requested) return *requested;
  if (model_default) return static_cast<T>(*model_default);
  return fallback;
}

void parse_stream_options(const json& body, CommonRequest* req) {
  req->stream = fields::boolean(body, "stream").value_or(false);
  if (const json* so = fields::object(body, "stream_options")) {
    if (!req->stream) {
      throw bad_request("Stream options can only be defined when `stream=True`.", "stream_options");
    }
    // vLLM's StreamOptions defaults include_usage to true once stream_options is given.
    req->include_usage = fields::boolean(*so, "include_usage").value_or(true);
    req->continuous_usage_stats = fields::boolean(*so, "continuous_usage_stats").value_or(false);
  }
}

// The sampling fields common to both routes (`ordered`: the same body, in the client's key order).
void parse_sampling(const json& body, const nlohmann::ordered_json& ordered, const RequestDefaults& defaults,
                    CommonRequest* req) {
  const GenerationConfig& g = defaults.generation;
  SamplingParams& p = req->params;
  req->model = fields::string(body, "model");
  p.n = clamp_int(fields::integer(body, "n").value_or(1));
  p.temperature = static_cast<float>(with_default<double>(fields::number(body, "temperature"), g.temperature, 1.0));
  p.top_p = static_cast<float>(with_default<double>(fields::number(body, "top_p"), g.top_p, 1.0));
  p.top_k = clamp_int(with_default<int64_t>(fields::integer(body, "top_k"), g.top_k, 0));
  p.min_p = static_cast<float>(with_default<double>(fields::number(body, "min_p"), g.min_p, 0.0));
  p.repetition_penalty =
      static_cast<float>(with_default<double>(fields::number(body, "repetition_penalty"), g.repetition_penalty, 1.0));
  p.presence_penalty = static_cast<float>(fields::number(body, "presence_penalty").value_or(0.0));
  p.frequency_penalty = static_cast<float>(fields::number(body, "frequency_penalty").value_or(0.0));
  if (auto seed = fields::integer(body, "seed")) p.seed = static_cast<uint64_t>(*seed);
  p.stop = fields::string_or_string_list(body, "stop");
  if (auto ids = fields::int_list(body, "stop_token_ids")) p.stop_token_ids = *ids;
  p.include_stop_str_in_output = fields::boolean(body, "include_stop_str_in_output").value_or(false);
  p.ignore_eos = fields::boolean(body, "ignore_eos").value_or(false);
  p.min_tokens = clamp_int(fields::integer(body, "min_tokens").value_or(0));
  p.skip_special_tokens = fields::boolean(body, "skip_special_tokens").value_or(true);
  p.spaces_between_special_tokens = fields::boolean(body, "spaces_between_special_tokens").value_or(true);
  if (auto pl = fields::integer(body, "prompt_logprobs")) p.prompt_logprobs = clamp_int(*pl);
  fields::string(body, "user");  // accepted and ignored, but must be a string
  req->tokens_as_ids = fields::boolean(body, "return_tokens_as_token_ids").value_or(false);

  // logit_bias: {"token id": bias in [-100, 100]} as OpenAI takes it; ids are checked against the
  // vocabulary by the route (check_token_ids).
  if (const json* bias = fields::object(body, "logit_bias")) {
    for (const auto& [key, value] : bias->items()) {
      int64_t id = -1;
      size_t used = 0;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || key.empty() || id < 0 || id > std::numeric_limits<int32_t>::max())
        throw bad_request(fmt::format("logit_bias keys must be token ids, got '{}'.", key), "logit_bias");
      if (!value.is_number())
        throw bad_request(fmt::format("logit_bias['{}'] must be a number, got {}.", key, fields::type_name(value)),
                          "logit_bias");
      const double b = value.get<double>();
      if (!(b >= -100.0 && b <= 100.0))
        throw bad_request(fmt::format("logit_bias['{}'] must be in [-100, 100], got {}.", key, py_float(b)), "logit_bias");
      p.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
    std::sort(p.logit_bias.begin(), p.logit_bias.end());
    for (size_t i = 1; i < p.logit_bias.size(); ++i)
      if (p.logit_bias[i].first == p.logit_bias[i - 1].first)
        throw bad_request(fmt::format("logit_bias names token {} twice.", p.logit_bias[i].first), "logit_bias");
  }
  if (fields::boolean(body, "use_beam_search").value_or(false)) {
    throw bad_request("Beam search is not supported by this server.", "use_beam_search");
  }
  StructuredOutputFields so = parse_structured_output_fields(ordered);
  p.structured_outputs = std::move(so.constraint);
  req->structured_outputs_source = std::move(so.source);
  req->any_whitespace = so.any_whitespace;
  req->ignored_fields.insert(req->ignored_fields.end(), so.ignored.begin(), so.ignored.end());
  parse_stream_options(body, req);
  if (p.prompt_logprobs && req->stream && (*p.prompt_logprobs > 0 || *p.prompt_logprobs == -1)) {
    throw bad_request("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs");
  }
}

using ojson = nlohmann::ordered_json;

std::string flatten_content_parts(const ojson& parts) {
  std::string text;
  bool first = true;
  for (const auto& part : parts) {
    std::string piece;
    if (part.is_string()) {
      piece = part.get<std::string>();
    } else if (part.is_object()) {
      std::string type = part.value("type", "text");
      if (type != "text" && type != "input_text") {
        throw bad_request(fmt::format("Content part type '{}' is not supported: this model takes text only.", type),
                          "messages");
      }
      auto it = part.find("text");
      if (it == part.end() || !it->is_string()) {
        throw bad_request("A text content part needs a string 'text' field.", "messages");
      }
      piece = it->get<std::string>();
    } else {
      throw bad_request(fmt::format("Invalid content part of type {}.", fields::type_name(part)), "messages");
    }
    if (!first) text += "\n";  // vLLM joins text parts with newlines
    text += piece;
    first = false;
  }
  return text;
}

std::vector<PromptSpec> parse_prompts(const json& body) {
  auto it = body.find("prompt");
  const char* kEmpty = "Either prompt or prompt_embeds must be provided and non-empty.";
  if (it == body.end() || it->is_null()) throw bad_request(kEmpty, "prompt");
  const json& prompt = *it;
  std::vector<PromptSpec> out;
  if (prompt.is_string()) {
    if (prompt.get<std::string>().empty()) throw bad_request(kEmpty, "prompt");
    out.push_back({prompt.get<std::string>(), {}});
    return out;
  }
  if (!prompt.is_array()) {
    throw bad_request(fmt::format("Invalid type for 'prompt': expected a string, a list of strings, a list of token "
                                  "ids or a list of such lists, got {}.", fields::type_name(prompt)), "prompt");
  }
  if (prompt.empty()) throw bad_request(kEmpty, "prompt");
  const json& first = prompt.front();
  if (first.is_number()) {  // [int]: one tokenized prompt
    PromptSpec spec;
    for (const auto& id : prompt) spec.token_ids.push_back(fields::to_token_id(id, "prompt"));
    out.push_back(std::move(spec));
  } else if (first.is_string()) {  // [string]
    for (const auto& s : prompt) {
      if (!s.is_string()) throw bad_request("Invalid 'prompt': a list of strings may hold only strings.", "prompt");
      out.push_back({s.get<std::string>(), {}});
    }
  } else if (first.is_array()) {  // [[int]]
    for (const auto& ids : prompt) {
      if (!ids.is_array()) throw bad_request("Invalid 'prompt': a list of token id lists may hold only lists.", "prompt");
      if (ids.empty()) throw bad_request("Invalid 'prompt': a token id list is empty.", "prompt");
      PromptSpec spec;
      for (const auto& id : ids) spec.token_ids.push_back(fields::to_token_id(id, "prompt"));
      out.push_back(std::move(spec));
    }
  } else {
    throw bad_request(fmt::format("Invalid 'prompt': unexpected list element of type {}.", fields::type_name(first)),
                      "prompt");
  }
  return out;
}

}  // namespace

void validate_sampling_params(const SamplingParams& p, const RequestDefaults& defaults) {
  auto fail = [](const std::string& msg, const char* param) { throw bad_request(msg, param); };
  if (p.n < 1) fail(fmt::format("n must be at least 1, got {}.", p.n), "n");
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    fail(fmt::format("presence_penalty must be in [-2, 2], got {}.", py_float(p.presence_penalty)), "presence_penalty");
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    fail(fmt::format("frequency_penalty must be in [-2, 2], got {}.", py_float(p.frequency_penalty)),
         "frequency_penalty");
  if (!(p.repetition_penalty > 0.0f))
    fail(fmt::format("repetition_penalty must be greater than zero, got {}.", py_float(p.repetition_penalty)),
         "repetition_penalty");
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    fail(fmt::format("temperature must be non-negative, got {}.", py_float(p.temperature)), "temperature");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail(fmt::format("top_p must be in (0, 1], got {}.", py_float(p.top_p)), "top_p");
  if (p.top_k < -1) fail(fmt::format("top_k must be 0 (disable), or at least 1, got {}.", p.top_k), "top_k");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail(fmt::format("min_p must be in [0, 1], got {}.", py_float(p.min_p)), "min_p");
  if (p.max_tokens && *p.max_tokens < 1) fail(fmt::format("max_tokens must be at least 1, got {}.", *p.max_tokens), "max_tokens");
  if (p.min_tokens < 0) fail(fmt::format("min_tokens must be greater than or equal to 0, got {}.", p.min_tokens), "min_tokens");
  if (p.max_tokens && p.min_tokens > *p.max_tokens)
    fail(fmt::format("min_tokens must be less than or equal to max_tokens={}, got {}.", *p.max_tokens, p.min_tokens),
         "min_tokens");
  // -1 asks for the whole vocabulary: only when the cap itself is -1 (vLLM's rule), else one
  // small request could make the server build and send every position's full distribution.
  if (p.logprobs && *p.logprobs == -1 && defaults.max_logprobs != -1)
    fail(fmt::format("Requested sample logprobs of -1 (the whole vocabulary), which is greater than max allowed: {}",
                     defaults.max_logprobs), "logprobs");
  if (p.logprobs && *p.logprobs != -1) {
    if (*p.logprobs < 0) fail(fmt::format("logprobs must be non-negative, got {}.", *p.logprobs), "logprobs");
    if (defaults.max_logprobs != -1 && *p.logprobs > defaults.max_logprobs)
      fail(fmt::format("Requested sample logprobs of {}, which is greater than max allowed: {}", *p.logprobs,
                       defaults.max_logprobs), "logprobs");
  }
  if (p.prompt_logprobs && *p.prompt_logprobs == -1 && defaults.max_logprobs != -1)
    fail(fmt::format("Requested prompt logprobs of -1 (the whole vocabulary), which is greater than max allowed: {}",
                     defaults.max_logprobs), "prompt_logprobs");
  if (p.prompt_logprobs && *p.prompt_logprobs != -1) {
    if (*p.prompt_logprobs < 0)
      fail(fmt::format("`prompt_logprobs` must be a positive value or -1, got {}.", *p.prompt_logprobs), "prompt_logprobs");
    if (defaults.max_logprobs != -1 && *p.prompt_logprobs > defaults.max_logprobs)
      fail(fmt::format("Requested prompt logprobs of {}, which is greater than max allowed: {}", *p.prompt_logprobs,
                       defaults.max_logprobs), "prompt_logprobs");
  }
  for (const auto& s : p.stop) {
    if (s.empty()) fail("stop cannot contain an empty string.", "stop");
  }
}

ojson normalize_messages(const ojson& messages) {
  if (!messages.is_array()) {
    throw bad_request(fmt::format("Invalid type for 'messages': expected an array, got {}.", fields::type_name(messages)),
                      "messages");
  }
  if (messages.empty()) throw bad_request("'messages' must contain at least one message.", "messages");
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) {
      throw bad_request(fmt::format("messages[{}] must be an object, got {}.", i, fields::type_name(m)), "messages");
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      throw bad_request(fmt::format("messages[{}] needs a string 'role'.", i), "messages");
    }
    ojson msg = m;
    auto content = m.find("content");
    if (content != m.end()) {
      if (content->is_array()) {
        msg["content"] = flatten_content_parts(*content);
      } else if (!content->is_string() && !content->is_null()) {
        throw bad_request(fmt::format("messages[{}].content must be a string or a list of content parts, got {}.", i,
                                      fields::type_name(*content)), "messages");
      }
    }
    // Templates index tool call arguments as objects (tojson); clients send them as JSON strings.
    if (auto calls = msg.find("tool_calls"); calls != msg.end() && calls->is_array()) {
      for (auto& call : *calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
        ojson& fn = call["function"];
        if (auto args = fn.find("arguments"); args != fn.end() && args->is_string()) {
          ojson parsed = fields::parse_limited<ojson>(args->get<std::string>(), "tool call arguments", false);
          if (parsed.is_object()) *args = std::move(parsed);
        }
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

namespace {

// The fields each route acts on (or refuses with a 400 naming them); any other field is ignored.
constexpr std::string_view kSamplingFields[] = {
    "model", "n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "seed", "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "prompt_logprobs", "user", "return_tokens_as_token_ids",
    "logit_bias", "use_beam_search", "response_format", "stream", "stream_options", "echo", "add_special_tokens",
    "max_tokens", "logprobs", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_whitespace_pattern"};
constexpr std::string_view kCompletionFields[] = {"prompt", "suffix"};
constexpr std::string_view kChatFields[] = {"messages", "top_logprobs", "max_completion_tokens",
                                            "add_generation_prompt", "continue_final_message",
                                            "chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls"};

std::vector<std::string> ignored_fields(const json& body, std::span<const std::string_view> route_fields) {
  std::vector<std::string> ignored;
  for (const auto& item : body.items()) {
    const std::string& key = item.key();
    auto known = [&key](std::span<const std::string_view> names) {
      return std::find(names.begin(), names.end(), key) != names.end();
    };
    if (!known(kSamplingFields) && !known(route_fields)) ignored.push_back(key);
  }
  return ignored;
}

}  // namespace

CompletionRequest parse_completion_request(const json& body, const RequestDefaults& defaults) {
  return parse_completion_request(body, body.is_object() ? ojson::parse(body.dump()) : ojson(), defaults);
}

CompletionRequest parse_completion_request(const json& body, const ojson& ordered, const RequestDefaults& defaults) {
  if (!body.is_object()) throw bad_request("The request body must be a JSON object.");
  CompletionRequest req;
  req.ignored_fields = ignored_fields(body, kCompletionFields);
  parse_sampling(body, ordered, defaults, &req);
  req.prompts = parse_prompts(body);
  req.echo = fields::boolean(body, "echo").value_or(false);
  req.add_special_tokens = fields::boolean(body, "add_special_tokens").value_or(true);
  if (auto lp = fields::integer(body, "logprobs")) req.params.logprobs = clamp_int(*lp);
  // OpenAI's completions default is 16 tokens (null means the default too).
  req.max_tokens = fields::integer(body, "max_tokens").value_or(16);
  if (fields::string(body, "suffix")) throw bad_request("suffix is not currently supported", "suffix");
  if (req.echo && *req.max_tokens == 0) {
    // echo without generation: vLLM generates one token and drops it.
  } else if (*req.max_tokens < 1) {
    throw bad_request(fmt::format("max_tokens must be at least 1, got {}.", *req.max_tokens), "max_tokens");
  }
  // With echo, logprobs cover the prompt too.
  if (req.echo && req.params.logprobs && !req.params.prompt_logprobs) req.params.prompt_logprobs = req.params.logprobs;
  validate_sampling_params(req.params, defaults);
  return req;
}

ChatRequest parse_chat_request(const json& body, const ojson& ordered, const RequestDefaults& defaults) {
  if (!body.is_object()) throw bad_request("The request body must be a JSON object.");
  ChatRequest req;
  req.ignored_fields = ignored_fields(body, kChatFields);
  parse_sampling(body, ordered, defaults, &req);
  auto messages = body.find("messages");
  if (messages == body.end() || messages->is_null()) throw bad_request("Field required: 'messages'.", "messages");
  req.messages = normalize_messages(ordered.at("messages"));

  req.echo = fields::boolean(body, "echo").value_or(false);
  req.logprobs = fields::boolean(body, "logprobs").value_or(false);
  if (auto top = fields::integer(body, "top_logprobs")) {
    if (*top < 0 && *top != -1) throw bad_request("`top_logprobs` must be a positive value or -1.", "top_logprobs");
    if ((*top == -1 || *top > 0) && !req.logprobs) {
      throw bad_request("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs");
    }
    req.top_logprobs = clamp_int(*top);
  }
  if (req.logprobs) req.params.logprobs = req.top_logprobs;

  // max_completion_tokens supersedes the deprecated max_tokens.
  if (auto mct = fields::integer(body, "max_completion_tokens")) {
    req.max_tokens = *mct;
    req.max_tokens_param = "max_completion_tokens";
  } else if (auto mt = fields::integer(body, "max_tokens")) {
    req.max_tokens = *mt;
  }
  if (req.max_tokens && *req.max_tokens < 1) {
    throw bad_request(fmt::format("{} must be at least 1, got {}.", req.max_tokens_param, *req.max_tokens),
                      req.max_tokens_param);
  }

  req.add_generation_prompt = fields::boolean(body, "add_generation_prompt").value_or(true);
  req.continue_final_message = fields::boolean(body, "continue_final_message").value_or(false);
  if (req.add_generation_prompt && req.continue_final_message) {
    throw bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                      "continue_final_message");
  }
  req.add_special_tokens = fields::boolean(body, "add_special_tokens").value_or(false);
  if (fields::object(body, "chat_template_kwargs")) req.chat_template_kwargs = ordered.at("chat_template_kwargs");
  req.tool_choice = parse_tool_choice(ordered);
  if (auto it = ordered.find("tools"); it != ordered.end() && !it->is_null()) req.tools = *it;
  if (auto forced = tool_choice_constraint(req.tool_choice, req.tools)) {
    if (req.params.structured_outputs) throw_structured_output_conflict(req.structured_outputs_source, "tool_choice");
    forced->any_whitespace = req.any_whitespace;
    req.params.structured_outputs = std::move(forced);
  }
  validate_sampling_params(req.params, defaults);
  return req;
}

int resolve_max_tokens(const CommonRequest& req, std::optional<int64_t> default_max_tokens, int prompt_len,
                       int max_model_len) {
  if (prompt_len >= max_model_len && max_model_len > 0) {
    throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, your request has {} "
                                  "input tokens. Please reduce the length of the input messages.",
                                  max_model_len, prompt_len), "input_tokens");
  }
  int64_t room = static_cast<int64_t>(max_model_len) - prompt_len;
  if (req.max_tokens) {
    if (*req.max_tokens > room) {
      throw bad_request(
          fmt::format("This model's maximum context length is {} tokens. However, you requested {} output tokens and "
                      "your prompt contains {} input tokens, for a total of {} tokens. Please reduce the length of "
                      "the input prompt or the number of requested output tokens.",
                      max_model_len, *req.max_tokens, prompt_len, *req.max_tokens + prompt_len),
          req.max_tokens_param);
    }
    room = *req.max_tokens;
  }
  if (default_max_tokens && *default_max_tokens > 0) room = std::min(room, *default_max_tokens);
  return static_cast<int>(std::max<int64_t>(room, 1));
}

}  // namespace specula::server
