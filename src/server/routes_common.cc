// Shared handler helpers and the small routes: /v1/models, /tokenize, /detokenize, /metrics.
#include <ctime>

#include <fmt/format.h>

#include "core/logging.h"
#include "engine/llm_engine.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/json_fields.h"
#include "server/routes.h"
#include "tokenizer/tokenizer.h"

namespace specula::server {

using nlohmann::json;

json parse_body(const httplib::Request& req) {
  json body = fields::parse_limited<json>(req.body, "the request body");
  if (!body.is_object()) {
    throw bad_request(fmt::format("The request body must be a JSON object, got {}.", fields::type_name(body)));
  }
  return body;
}

void check_model(const ServerState& state, const json& body) {
  auto model = fields::string(body, "model");
  if (!model || model->empty() || *model == state.served_model_name) return;
  throw not_found(fmt::format("The model `{}` does not exist.", *model), "model");
}

void log_ignored_fields(const std::vector<std::string>& fields) {
  if (fields.empty()) return;
  std::string names;
  for (const std::string& f : fields) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", f);
  LOG_WARN("The following fields were present in the request but ignored: {{{}}}", names);
}

std::vector<int32_t> encode_prompt(const ServerState& state, const std::string& text, bool add_special_tokens,
                                   const char* param) {
  if (state.max_prompt_bytes > 0 && text.size() > state.max_prompt_bytes) {
    throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, your prompt is {} bytes "
                                  "long, more than any prompt of {} tokens can be. Please reduce the length of the "
                                  "input.", state.max_model_len, text.size(), state.max_model_len), param);
  }
  return state.tokenizer.encode(text, add_special_tokens);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void set_json(httplib::Response& res, const json& j, int status) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

json stop_reason_json(const std::variant<std::monostate, int32_t, std::string>& r) {
  if (auto* id = std::get_if<int32_t>(&r)) return *id;
  if (auto* s = std::get_if<std::string>(&r)) return *s;
  return nullptr;
}

json finish_reason_json(FinishReason r) {
  if (r == FinishReason::kNone) return nullptr;
  return finish_reason_name(r);
}

json usage_json(const ServerState& state, int prompt_tokens, int completion_tokens, int cached_tokens) {
  json usage = {{"prompt_tokens", prompt_tokens},
                {"total_tokens", prompt_tokens + completion_tokens},
                {"completion_tokens", completion_tokens}};
  if (state.enable_prompt_tokens_details) usage["prompt_tokens_details"] = {{"cached_tokens", cached_tokens}};
  return usage;
}

void check_token_ids(const ServerState& state, const std::vector<int32_t>& ids, const char* param) {
  int64_t vocab = state.tokenizer.vocab_size();
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      throw bad_request(fmt::format("Token id {} is out of vocabulary (vocab size {}).", id, vocab), param);
    }
  }
}

SamplingParams params_for_prompt(const ServerState& state, const CommonRequest& req, int prompt_len) {
  SamplingParams p = req.params;
  std::vector<int32_t> biased;
  for (const auto& [id, bias] : p.logit_bias) biased.push_back(id);
  check_token_ids(state, biased, "logit_bias");
  std::optional<int64_t> default_max;
  if (state.defaults.generation.max_new_tokens) default_max = *state.defaults.generation.max_new_tokens;
  p.max_tokens = resolve_max_tokens(req, default_max, prompt_len, state.max_model_len);
  if (p.min_tokens > *p.max_tokens) {
    throw bad_request(fmt::format("min_tokens must be less than or equal to max_tokens={}, got {}.", *p.max_tokens,
                                  p.min_tokens), "min_tokens");
  }
  return p;
}

void handle_models(ServerState& state, const httplib::Request&, httplib::Response& res) {
  auto now = static_cast<int64_t>(std::time(nullptr));
  json permission = {{"id", "modelperm-specula"}, {"object", "model_permission"}, {"created", now},
                     {"allow_create_engine", false}, {"allow_sampling", true}, {"allow_logprobs", true},
                     {"allow_search_indices", false}, {"allow_view", true}, {"allow_fine_tuning", false},
                     {"organization", "*"}, {"group", nullptr}, {"is_blocking", false}};
  json card = {{"id", state.served_model_name}, {"object", "model"}, {"created", now}, {"owned_by", "specula"},
               {"root", state.model_root}, {"parent", nullptr}, {"max_model_len", state.max_model_len},
               {"permission", json::array({permission})}};
  set_json(res, {{"object", "list"}, {"data", json::array({card})}});
}

void handle_tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  json body = parse_body(req);
  check_model(state, body);
  std::vector<int32_t> tokens;
  if (body.contains("messages") && !body["messages"].is_null()) {
    if (!state.chat_template) throw bad_request("The tokenizer has no chat template.", "messages");
    nlohmann::ordered_json ordered = fields::parse_limited<nlohmann::ordered_json>(req.body, "the request body");
    nlohmann::ordered_json messages = normalize_messages(ordered["messages"]);
    nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
    if (fields::object(body, "chat_template_kwargs")) kwargs = ordered["chat_template_kwargs"];
    nlohmann::ordered_json tools;
    if (fields::array(body, "tools")) tools = ordered["tools"];
    ChatPromptInputs in;
    in.messages = &messages;
    in.tools = &tools;
    in.chat_template_kwargs = &kwargs;
    in.add_generation_prompt = fields::boolean(body, "add_generation_prompt").value_or(true);
    in.continue_final_message = fields::boolean(body, "continue_final_message").value_or(false);
    if (in.add_generation_prompt && in.continue_final_message) {
      throw bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                        "continue_final_message");
    }
    std::string text = render_chat_prompt(*state.chat_template, state.tokenizer, in);
    tokens = encode_prompt(state, text, fields::boolean(body, "add_special_tokens").value_or(false), "messages");
  } else {
    auto prompt = fields::string(body, "prompt");
    if (!prompt) throw bad_request("Either 'prompt' or 'messages' must be given.", "prompt");
    tokens = encode_prompt(state, *prompt, fields::boolean(body, "add_special_tokens").value_or(true), "prompt");
  }
  json out = {{"count", tokens.size()}, {"max_model_len", state.max_model_len}, {"tokens", tokens},
              {"token_strs", nullptr}};
  if (fields::boolean(body, "return_token_strs").value_or(false)) {
    json strs = json::array();
    for (int32_t id : tokens) strs.push_back(state.tokenizer.id_to_token(id));
    out["token_strs"] = std::move(strs);
  }
  set_json(res, out);
}

void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  json body = parse_body(req);
  check_model(state, body);
  auto tokens = fields::int_list(body, "tokens");
  if (!tokens) throw bad_request("Field required: 'tokens'.", "tokens");
  check_token_ids(state, *tokens, "tokens");
  set_json(res, {{"prompt", state.tokenizer.decode(*tokens, /*skip_special_tokens=*/false)}});
}

void handle_metrics(ServerState& state, const httplib::Request&, httplib::Response& res) {
  res.status = 200;
  res.set_content(state.metrics.render(state.engine.metrics(), state.served_model_name),
                  "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace specula::server
