// POST /v1/completions: one engine request per prompt (a string, a list of strings, a list of
// token ids or a list of such lists), n choices each, indexed prompt * n + j as vLLM does;
// answered as one text_completion or as a stream of them ending in [DONE].
#include <ctime>
#include <memory>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/logprobs_format.h"
#include "server/routes.h"
#include "server/text_util.h"
#include "tokenizer/tokenizer.h"

namespace specula::server {

using nlohmann::json;

namespace {

class CompletionResponder {
 public:
  CompletionResponder(ServerState& state, CompletionRequest req, std::shared_ptr<GenerationRun> run,
                      std::vector<std::string> prompt_texts)
      : state_(state),
        req_(std::move(req)),
        run_(std::move(run)),
        lp_(state.tokenizer, req_.tokens_as_ids),
        created_(static_cast<int64_t>(std::time(nullptr))),
        prompt_texts_(std::move(prompt_texts)),
        echo_only_(req_.echo && req_.max_tokens && *req_.max_tokens == 0),
        echoed_(run_->choices().size(), false),
        offsets_(run_->choices().size(), 0) {}

  json response() const;
  bool pump(std::string* out);

 private:
  bool want_logprobs() const { return req_.params.logprobs.has_value(); }
  int top_n() const { return req_.params.logprobs.value_or(0); }
  // Logprob entries of the prompt (echo): the first prompt position has none.
  void append_prompt_logprobs(LogprobsFormatter::Completion* acc, int prompt) const;
  json usage() const {
    return usage_json(state_, run_->prompt_tokens(), echo_only_ ? 0 : run_->completion_tokens(), run_->cached_tokens());
  }
  json chunk(json choices) const {
    return {{"id", run_->id()}, {"object", "text_completion"}, {"created", created_},
            {"model", state_.served_model_name}, {"choices", std::move(choices)}};
  }

  ServerState& state_;
  CompletionRequest req_;
  std::shared_ptr<GenerationRun> run_;
  LogprobsFormatter lp_;
  int64_t created_;
  std::vector<std::string> prompt_texts_;  // for echo
  bool echo_only_;                         // echo with max_tokens=0: the generated token is dropped
  std::vector<bool> echoed_;               // streaming: the prompt was sent with the choice's first chunk
  std::vector<size_t> offsets_;            // streaming: text_offset so far per choice
};

void CompletionResponder::append_prompt_logprobs(LogprobsFormatter::Completion* acc, int prompt) const {
  const auto& p = run_->prompts()[prompt];
  for (size_t k = 0; k < p.token_ids.size(); ++k) {
    std::optional<PositionLogprobs> lp;
    if (p.prompt_logprobs && k < p.prompt_logprobs->size()) lp = (*p.prompt_logprobs)[k];
    lp_.append_completion(acc, p.token_ids[k], lp, top_n());
  }
}

json CompletionResponder::response() const {
  json choices = json::array();
  for (const auto& c : run_->choices()) {
    std::string text = req_.echo ? prompt_texts_[c.prompt] : "";
    if (!echo_only_) text += c.text;
    json logprobs = nullptr;
    if (want_logprobs()) {
      LogprobsFormatter::Completion acc;
      if (req_.echo) append_prompt_logprobs(&acc, c.prompt);
      if (!echo_only_) {
        for (size_t k = 0; k < c.token_ids.size(); ++k) {
          std::optional<PositionLogprobs> lp;
          if (k < c.logprobs.size()) lp = c.logprobs[k];
          lp_.append_completion(&acc, c.token_ids[k], lp, top_n());
        }
      }
      logprobs = acc.to_json();
    }
    json choice = {{"index", c.index}, {"text", std::move(text)}, {"logprobs", std::move(logprobs)},
                   {"finish_reason", finish_reason_json(echo_only_ ? FinishReason::kLength : c.finish_reason)},
                   {"stop_reason", stop_reason_json(c.stop_reason)}};
    const auto& pl = run_->prompts()[c.prompt].prompt_logprobs;
    if (pl && req_.params.prompt_logprobs) choice["prompt_logprobs"] = lp_.prompt_logprobs(*pl);
    choices.push_back(std::move(choice));
  }
  return {{"id", run_->id()}, {"object", "text_completion"}, {"created", created_}, {"model", state_.served_model_name},
          {"choices", std::move(choices)}, {"usage", usage()}};
}

bool CompletionResponder::pump(std::string* out) {
  GenerationRun::Update update;
  if (run_->next(&update)) {
    for (const auto& d : update.output.choices) {
      const auto& c = run_->choices()[d.index];
      std::string text;
      LogprobsFormatter::Completion acc;
      acc.offset = offsets_[d.index];
      if (req_.echo && !echoed_[d.index]) {
        echoed_[d.index] = true;
        text = prompt_texts_[c.prompt];
        if (want_logprobs()) append_prompt_logprobs(&acc, c.prompt);
      }
      if (!echo_only_) {
        text += d.text;
        if (want_logprobs()) {
          for (size_t k = 0; k < d.token_ids.size(); ++k) {
            std::optional<PositionLogprobs> lp;
            if (k < d.logprobs.size()) lp = d.logprobs[k];
            lp_.append_completion(&acc, d.token_ids[k], lp, top_n());
          }
        }
      }
      offsets_[d.index] = acc.offset;
      FinishReason finish = d.finish_reason;
      if (echo_only_ && finish != FinishReason::kNone) finish = FinishReason::kLength;
      bool has_logprobs = want_logprobs() && !acc.tokens.empty();
      if (text.empty() && !has_logprobs && finish == FinishReason::kNone) continue;
      json choice = {{"index", d.index}, {"text", std::move(text)},
                     {"logprobs", want_logprobs() ? acc.to_json() : json(nullptr)},
                     {"finish_reason", finish_reason_json(finish)},
                     {"stop_reason", stop_reason_json(d.stop_reason)}};
      json ev = chunk(json::array({std::move(choice)}));
      if (req_.continuous_usage_stats) ev["usage"] = usage();
      *out += sse_event(ev);
    }
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

void handle_completions(ServerState& state, const httplib::Request& http, httplib::Response& res) {
  auto arrival = GenerationRun::Clock::now();
  json body = parse_body(http);
  check_model(state, body);
  CompletionRequest req = parse_completion_request(
      body, fields::parse_limited<nlohmann::ordered_json>(http.body, "the request body"), state.defaults);
  log_ignored_fields(req.ignored_fields);

  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  std::vector<std::string> prompt_texts;
  for (auto& spec : req.prompts) {
    std::vector<int32_t> ids;
    if (spec.text) {
      ids = encode_prompt(state, *spec.text, req.add_special_tokens, "prompt");
      if (req.echo) prompt_texts.push_back(*spec.text);
    } else {
      ids = std::move(spec.token_ids);
      check_token_ids(state, ids, "prompt");
      if (req.echo) prompt_texts.push_back(state.tokenizer.decode(ids, /*skip_special_tokens=*/false));
    }
    if (ids.empty()) throw bad_request("The prompt is empty after tokenization.", "prompt");
    params.push_back(params_for_prompt(state, req, static_cast<int>(ids.size())));
    prompts.push_back(std::move(ids));
  }
  if (!req.echo) prompt_texts.assign(prompts.size(), "");

  auto run = std::make_shared<GenerationRun>(state, "cmpl-" + random_hex(32), arrival, client_probe(http));
  run->submit(std::move(prompts), params);
  bool stream = req.stream;
  auto responder = std::make_shared<CompletionResponder>(state, std::move(req), run, std::move(prompt_texts));
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
    res.status = 499;
    return;
  }
  set_json(res, responder->response());
}

}  // namespace specula::server
