// POST /v1/chat/completions: messages -> chat template -> tokens -> engine, answered as one
// chat.completion or as a stream of chat.completion.chunk events (role chunk first, content
// deltas, a finish chunk, the usage chunk when asked, [DONE]), as OpenAI and vLLM do.
// The output splits in two steps: --reasoning-parser takes the reasoning off, then the tool
// parser (tool_choice.h) finds tool calls in what is left.
#include <ctime>
#include <memory>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/chat_prompt.h"
#include "server/logprobs_format.h"
#include "server/reasoning_parser.h"
#include "server/routes.h"
#include "server/text_util.h"
#include "server/tool_choice.h"
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
  ToolParser* tool_parser(int index);
  std::unique_ptr<ToolParser> new_tool_parser() const {
    return make_tool_choice_parser(req_.tool_choice, state_.tool_call_parser);
  }
  // OpenAI's "tool_calls" once a choice has made calls and stopped on its own.
  static json finish_json(FinishReason r, bool made_calls) {
    return made_calls && r == FinishReason::kStop ? json("tool_calls") : finish_reason_json(r);
  }
  // Delta entries for the calls' pieces: a call's first carries its id, type and name.
  void tool_call_entries(int index, const ToolParseDelta& parsed, std::vector<json>* entries);
  void delta_events(const ChoiceDelta& d, std::string* out);

  ServerState& state_;
  ChatRequest req_;
  std::shared_ptr<GenerationRun> run_;
  LogprobsFormatter lp_;
  int64_t created_;
  std::string echo_;  // echo: the last message's content, prepended to the reply
  std::vector<std::unique_ptr<ReasoningParser>> parsers_;  // one per choice, for streaming
  std::vector<std::unique_ptr<ToolParser>> tool_parsers_;  // one per choice, for streaming
  std::vector<std::vector<std::string>> call_ids_;         // per choice, per call: the id sent
  bool started_ = false;
};

ReasoningParser* ChatResponder::parser(int index) {
  if (state_.reasoning_parser.empty()) return nullptr;
  if (parsers_.empty()) parsers_.resize(run_->choices().size());
  auto& p = parsers_.at(index);
  if (!p) p = ReasoningParser::create(state_.reasoning_parser, req_.chat_template_kwargs);
  return p.get();
}

ToolParser* ChatResponder::tool_parser(int index) {
  if (req_.tool_choice.kind == ToolChoice::Kind::kNone) return nullptr;
  if (tool_parsers_.empty()) {
    tool_parsers_.resize(run_->choices().size());
    call_ids_.resize(run_->choices().size());
  }
  auto& p = tool_parsers_.at(index);
  if (!p) p = new_tool_parser();
  return p.get();
}

json ChatResponder::response() const {
  json choices = json::array();
  for (const auto& c : run_->choices()) {
    json message = {{"role", "assistant"}};
    std::string content = c.text;
    bool reasoning = !state_.reasoning_parser.empty();
    if (reasoning) {
      auto p = ReasoningParser::create(state_.reasoning_parser, req_.chat_template_kwargs);
      ReasoningDelta split = p->parse_all(c.text);
      content = std::move(split.content);
      message["reasoning_content"] = split.reasoning.empty() ? json(nullptr) : json(split.reasoning);
    }
    json tool_calls = json::array();
    std::unique_ptr<ToolParser> tools = new_tool_parser();
    if (tools) {
      ParsedToolOutput parsed = tools->parse_all(content);
      content = std::move(parsed.content);
      for (auto& call : parsed.calls) {
        tool_calls.push_back({{"id", "chatcmpl-tool-" + random_hex(32)}, {"type", "function"},
                              {"function", {{"name", std::move(call.name)}, {"arguments", std::move(call.arguments)}}}});
      }
    }
    content = echo_ + content;
    // vLLM answers null for no content where a parser split the output; plain text stays a string.
    message["content"] = (reasoning || tools) && content.empty() ? json(nullptr) : json(content);
    message["tool_calls"] = tool_calls;
    json logprobs = nullptr;
    if (req_.logprobs) logprobs = {{"content", lp_.chat_content(c.logprobs, req_.top_logprobs)}};
    choices.push_back({{"index", c.index}, {"message", std::move(message)}, {"logprobs", std::move(logprobs)},
                       {"finish_reason", finish_json(c.finish_reason, !tool_calls.empty())},
                       {"stop_reason", stop_reason_json(c.stop_reason)}});
  }
  json out = {{"id", run_->id()}, {"object", "chat.completion"}, {"created", created_},
              {"model", state_.served_model_name}, {"choices", std::move(choices)}, {"usage", usage()}};
  const auto& pl = run_->prompts().front().prompt_logprobs;
  out["prompt_logprobs"] = pl ? lp_.prompt_logprobs(*pl) : json(nullptr);
  return out;
}

void ChatResponder::tool_call_entries(int index, const ToolParseDelta& parsed, std::vector<json>* entries) {
  auto& ids = call_ids_.at(index);
  for (const ToolCallDelta& call : parsed.calls) {
    if (call.name) {
      ids.push_back("chatcmpl-tool-" + random_hex(32));
      entries->push_back({{"index", call.index}, {"id", ids.back()}, {"type", "function"},
                          {"function", {{"name", *call.name}, {"arguments", ""}}}});
    }
    if (!call.arguments.empty()) entries->push_back({{"index", call.index}, {"function", {{"arguments", call.arguments}}}});
  }
}

void ChatResponder::delta_events(const ChoiceDelta& d, std::string* out) {
  bool finished = d.finish_reason != FinishReason::kNone;
  ReasoningDelta split;
  if (ReasoningParser* p = parser(d.index)) {
    split = p->feed(d.text);
    if (finished) {
      ReasoningDelta tail = p->finish();
      split.reasoning += tail.reasoning;
      split.content += tail.content;
    }
  } else {
    split.content = d.text;
  }
  std::vector<json> calls;  // tool_calls entries, each sent in a chunk of its own
  ToolParser* tools = tool_parser(d.index);
  if (tools) {
    ToolParseDelta parsed = tools->feed(split.content);
    if (finished) {
      ToolParseDelta tail = tools->finish();
      parsed.content += tail.content;
      parsed.calls.insert(parsed.calls.end(), tail.calls.begin(), tail.calls.end());
    }
    split.content = std::move(parsed.content);
    tool_call_entries(d.index, parsed, &calls);
  }
  bool made_calls = tools && !call_ids_.at(d.index).empty();
  bool has_logprobs = req_.logprobs && !d.logprobs.empty();

  std::vector<json> deltas;
  if (!split.content.empty() || !split.reasoning.empty()) {
    json delta = json::object();
    if (!split.reasoning.empty()) delta["reasoning_content"] = split.reasoning;
    if (!split.content.empty()) delta["content"] = split.content;
    deltas.push_back(std::move(delta));
  }
  for (auto& entry : calls) deltas.push_back({{"tool_calls", json::array({std::move(entry)})}});
  if (deltas.empty()) {
    if (!has_logprobs && !finished) return;  // nothing to say
    deltas.push_back(made_calls ? json::object() : json{{"content", ""}});
  }
  for (size_t k = 0; k < deltas.size(); ++k) {
    bool first = k == 0, last = k + 1 == deltas.size();
    json choice = {{"index", d.index}, {"delta", std::move(deltas[k])},
                   {"logprobs", first && has_logprobs ? json{{"content", lp_.chat_content(d.logprobs, req_.top_logprobs)}}
                                                      : json(nullptr)},
                   {"finish_reason", last ? finish_json(d.finish_reason, made_calls) : json(nullptr)}};
    if (last && finished) choice["stop_reason"] = stop_reason_json(d.stop_reason);
    json c = chunk(json::array({std::move(choice)}));
    if (req_.continuous_usage_stats) c["usage"] = usage();
    *out += sse_event(c);
  }
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
  if (req.tool_choice.kind == ToolChoice::Kind::kAuto) {
    if (!state.enable_auto_tool_choice || state.tool_call_parser.empty()) {
      throw bad_request("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                        "tool_choice");
    }
    // The parser must see its markers, which some checkpoints make special tokens.
    if (ToolParser::keeps_special_tokens(state.tool_call_parser)) req.params.skip_special_tokens = false;
  }
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
