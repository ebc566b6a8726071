// POST /v1/chat/completions: messages -> chat template -> tokens -> engine, answered as one
// chat.completion or as a stream of chat.completion.chunk events (role chunk first, content
// deltas, a finish chunk, the usage chunk when asked, [DONE]), as OpenAI and vLLM do.
#include <ctime>
#include <memory>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/chat_prompt.h"
#include "server/logprobs_format.h"
#include "server/reasoning_parser.h"
#include "server/routes.h"
#include "server/text_util.h"
#include "tokenizer/tokenizer.h"

namespace specula::server {

using nlohmann::json;

namespace {

class ChatResponder {
 public:
  ChatResponder(ServerState& state, ChatRequest req, std::shared_ptr<GenerationRun> run, std::string echo)
      : state_(state),
        req_(std::move(req)),
        run_(std::move(run)),
        lp_(state.tokenizer, req.tokens_as_ids),
        created_(static_cast<int64_t>(std::time(nullptr))),
        echo_(std::move(echo)) {}

  json response() const;
  bool pump(std::string* out);

 private:
  json chunk(json choices) const {
    return {{"id", run_->id()}, {"object", "chat.completion.chunk"}, {"created", created_},
            {"model", state_.served_model_name}, {"choices", std::move(choices)}};
  }
  json usage() const {
    return usage_json(state_, run_->prompt_tokens(), run_->completion_tokens(), run_->cached_tokens());
  }
  ReasoningParser* parser(int index);
  void delta_events(const ChoiceDelta& d, std::string* out);

  ServerState& state_;
  ChatRequest req_;
  std::shared_ptr<GenerationRun> run_;
  LogprobsFormatter lp_;
  int64_t created_;
  std::string echo_;  // echo: the last message's content, prepended to the reply
  std::vector<std::unique_ptr<ReasoningParser>> parsers_;  // one per choice, for streaming
  bool started_ = false;
};

ReasoningParser* ChatResponder::parser(int index) {
  if (state_.reasoning_parser.empty()) return nullptr;
  if (parsers_.empty()) parsers_.resize(run_->choices().size());
  auto& p = parsers_.at(index);
  if (!p) p = ReasoningParser::create(state_.reasoning_parser, req_.chat_template_kwargs);
  return p.get();
}

json ChatResponder::response() const {
  json choices = json::array();
  for (const auto& c : run_->choices()) {
    json message = {{"role", "assistant"}};
    if (!state_.reasoning_parser.empty()) {
      auto p = ReasoningParser::create(state_.reasoning_parser, req_.chat_template_kwargs);
      ReasoningDelta split = p->parse_all(c.text);
      std::string content = echo_ + split.content;
      message["content"] = content.empty() ? json(nullptr) : json(content);
      message["reasoning_content"] = split.reasoning.empty() ? json(nullptr) : json(split.reasoning);
    } else {
      message["content"] = echo_ + c.text;
    }
    message["tool_calls"] = json::array();
    json logprobs = nullptr;
    if (req_.logprobs) logprobs = {{"content", lp_.chat_content(c.logprobs, req_.top_logprobs)}};
    choices.push_back({{"index", c.index}, {"message", std::move(message)}, {"logprobs", std::move(logprobs)},
                       {"finish_reason", finish_reason_json(c.finish_reason)},
                       {"stop_reason", stop_reason_json(c.stop_reason)}});
  }
  json out = {{"id", run_->id()}, {"object", "chat.completion"}, {"created", created_},
              {"model", state_.served_model_name}, {"choices", std::move(choices)}, {"usage", usage()}};
  const auto& pl = run_->prompts().front().prompt_logprobs;
  out["prompt_logprobs"] = pl ? lp_.prompt_logprobs(*pl) : json(nullptr);
  return out;
}

void ChatResponder::delta_events(const ChoiceDelta& d, std::string* out) {
  ReasoningDelta split;
  if (ReasoningParser* p = parser(d.index)) {
    split = p->feed(d.text);
    if (d.finish_reason != FinishReason::kNone) {
      ReasoningDelta tail = p->finish();
      split.reasoning += tail.reasoning;
      split.content += tail.content;
    }
  } else {
    split.content = d.text;
  }
  bool finished = d.finish_reason != FinishReason::kNone;
  bool has_logprobs = req_.logprobs && !d.logprobs.empty();
  if (split.content.empty() && split.reasoning.empty() && !has_logprobs && !finished) return;  // nothing to say

  json delta = json::object();
  if (!split.reasoning.empty()) delta["reasoning_content"] = split.reasoning;
  if (!split.content.empty() || split.reasoning.empty()) delta["content"] = split.content;
  json choice = {{"index", d.index}, {"delta", std::move(delta)},
                 {"logprobs", has_logprobs ? json{{"content", lp_.chat_content(d.logprobs, req_.top_logprobs)}} : json(nullptr)},
                 {"finish_reason", finish_reason_json(d.finish_reason)}};
  if (finished) choice["stop_reason"] = stop_reason_json(d.stop_reason);
  json c = chunk(json::array({std::move(choice)}));
  if (req_.continuous_usage_stats) c["usage"] = usage();
  *out += sse_event(c);
}

bool ChatResponder::pump(std::string* out) {
  if (!started_) {
    started_ = true;
    for (const auto& c : run_->choices()) {  // the role chunk of every choice comes first
      json first = chunk(json::array({{{"index", c.index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr}, {"finish_reason", nullptr}}}));
      if (req_.continuous_usage_stats) first["usage"] = usage();
      *out += sse_event(first);
      if (!echo_.empty()) {
        *out += sse_event(chunk(json::array({{{"index", c.index}, {"delta", {{"content", echo_}}},
                                              {"logprobs", nullptr}, {"finish_reason", nullptr}}})));
      }
    }
    return true;
  }
  GenerationRun::Update update;
  if (run_->next(&update)) {
    for (const auto& d : update.output.choices) delta_events(d, out);
    return true;
  }
  if (run_->error()) {
    *out += sse_event(internal_error(*run_->error()).body());
  } else if (run_->cancelled()) {
    return false;
  } else if (req_.include_usage) {
    json last = chunk(json::array());
    last["usage"] = usage();
    *out += sse_event(last);
  }
  *out += kSseDone;
  return false;
}

}  // namespace

void handle_chat_completions(ServerState& state, const httplib::Request& http, httplib::Response& res) {
  auto arrival = GenerationRun::Clock::now();
  json body = parse_body(http);
  check_model(state, body);
  ChatRequest req = parse_chat_request(
      body, fields::parse_limited<nlohmann::ordered_json>(http.body, "the request body"), state.defaults);
  log_ignored_fields(req.ignored_fields);
  if (!state.chat_template) {
    throw bad_request("As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
                      "chat template if the tokenizer does not define one.", "messages");
  }
  ChatPromptInputs in;
  in.messages = &req.messages;
  in.tools = &req.tools;
  in.chat_template_kwargs = &req.chat_template_kwargs;
  in.add_generation_prompt = req.add_generation_prompt;
  in.continue_final_message = req.continue_final_message;
  std::string prompt = render_chat_prompt(*state.chat_template, state.tokenizer, in);
  std::vector<int32_t> ids = encode_prompt(state, prompt, req.add_special_tokens, "messages");
  if (ids.empty()) throw bad_request("The rendered chat prompt is empty.", "messages");
  SamplingParams params = params_for_prompt(state, req, static_cast<int>(ids.size()));

  // vLLM's echo: when the last message is the assistant's own, the reply continues it.
  std::string echo;
  if (req.echo) {
    const auto& last = req.messages.back();
    if (last.value("role", "") == "assistant" && last.contains("content") && last["content"].is_string()) {
      echo = last["content"].get<std::string>();
    }
  }

  auto run = std::make_shared<GenerationRun>(state, "chatcmpl-" + random_hex(32), arrival, client_probe(http));
  run->submit({std::move(ids)}, {params});
  bool stream = req.stream;
  auto responder = std::make_shared<ChatResponder>(state, std::move(req), run, std::move(echo));
  if (stream) {
    install_sse_stream(res, run, [responder](std::string* out) { return responder->pump(out); });
    return;
  }
  GenerationRun::Update update;
  while (run->next(&update)) {
  }
  if (run->error()) throw internal_error(*run->error());
  if (run->stopped_by_shutdown()) throw service_unavailable("The server is shutting down; the request was not completed.");
  if (run->cancelled()) {
    res.status = 499;  // client closed request (nginx's convention); nobody reads this
    return;
  }
  set_json(res, responder->response());
}

}  // namespace specula::server
