#include "engine/output_processor.h"

#include <algorithm>

#include "core/error.h"
#include "engine/stop_strings.h"

namespace specula {

void OutputProcessor::add_request(const std::string& request_id, const std::vector<std::string>& child_ids,
                                  int num_prompt_tokens, std::shared_ptr<const SamplingParams> params,
                                  std::shared_ptr<RequestStream> stream) {
  SPECULA_CHECK(requests_.count(request_id) == 0, "request id {} is already in use", request_id);
  RequestState& r = requests_[request_id];
  r.request_id = request_id;
  r.params = std::move(params);
  r.stream = std::move(stream);
  r.num_prompt_tokens = num_prompt_tokens;
  if (r.params->prompt_logprobs) {
    r.prompt_logprobs.assign(static_cast<size_t>(num_prompt_tokens), std::nullopt);
    r.prompt_logprobs_missing = std::max(0, num_prompt_tokens - 1);
  }
  for (size_t i = 0; i < child_ids.size(); ++i) {
    r.choices.emplace_back(tokenizer_, r.params->skip_special_tokens, r.params->spaces_between_special_tokens);
    r.choices.back().child_id = child_ids[i];
    child_to_parent_[child_ids[i]] = {request_id, static_cast<int>(i)};
  }
  r.num_unfinished = static_cast<int>(child_ids.size());
}

std::string OutputProcessor::parent_of(const std::string& child_id) const {
  auto it = child_to_parent_.find(child_id);
  return it == child_to_parent_.end() ? std::string() : it->second.first;
}

std::vector<std::string> OutputProcessor::request_ids() const {
  std::vector<std::string> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, r] : requests_) ids.push_back(id);
  return ids;
}

std::vector<std::string> OutputProcessor::children_of(const std::string& request_id) const {
  std::vector<std::string> ids;
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return ids;
  for (const Choice& c : it->second.choices) ids.push_back(c.child_id);
  return ids;
}

bool OutputProcessor::apply(RequestState& req, Choice& choice, const EngineCoreOutput& out, ChoiceDelta& delta) {
  const SamplingParams& p = *req.params;
  // The scheduler ended the sequence on eos or a stop token: that token's text is not output.
  const bool stop_token_ended = out.status == RequestStatus::kFinishedStopped &&
                                !std::holds_alternative<std::string>(out.stop_reason);
  bool stopped_by_string = false;
  for (size_t j = 0; j < out.new_token_ids.size() && !stopped_by_string; ++j) {
    const int32_t token = out.new_token_ids[j];
    delta.token_ids.push_back(token);
    if (p.logprobs && j < out.new_logprobs.size()) delta.logprobs.push_back(out.new_logprobs[j]);
    choice.num_tokens += 1;
    const bool is_stop_token = stop_token_ended && j + 1 == out.new_token_ids.size();
    if (is_stop_token && !p.include_stop_str_in_output) continue;
    const size_t old_size = choice.text.size();
    choice.text += choice.detokenizer.add(token);
    if (p.stop.empty() || choice.num_tokens <= p.min_tokens) continue;
    if (std::optional<StopStringMatch> m = find_stop_string(choice.text, old_size, p.stop)) {
      const std::string& stop = p.stop[m->stop_index];
      choice.text.resize(p.include_stop_str_in_output ? m->position + stop.size() : m->position);
      delta.finish_reason = FinishReason::kStop;
      delta.stop_reason = stop;
      stopped_by_string = true;
    }
  }
  const bool scheduler_finished = is_finished(out.status);
  if (!stopped_by_string && scheduler_finished) {
    choice.text += choice.detokenizer.flush();
    delta.finish_reason = finish_reason_of(out.status);
    delta.stop_reason = out.stop_reason;
  }
  choice.finished = stopped_by_string || scheduler_finished;

  // Stream what cannot be the start of a stop string any more.
  size_t upto = choice.text.size();
  if (!choice.finished && !p.include_stop_str_in_output && !p.stop.empty())
    upto -= stop_string_holdback(choice.text, p.stop);
  upto = std::max(upto, choice.sent);
  delta.text = choice.text.substr(choice.sent, upto - choice.sent);
  choice.sent = upto;
  return stopped_by_string && !scheduler_finished;
}

std::vector<std::string> OutputProcessor::process(const std::vector<EngineCoreOutput>& outputs) {
  std::vector<std::string> stopped;
  // One RequestOutput per client request, in the order the requests first appear.
  std::vector<std::string> order;
  std::unordered_map<std::string, RequestOutput> pending;
  for (const EngineCoreOutput& out : outputs) {
    auto link = child_to_parent_.find(out.req_id);
    if (link == child_to_parent_.end()) continue;  // aborted in the meantime
    const auto& [request_id, index] = link->second;
    RequestState& req = requests_.at(request_id);
    Choice& choice = req.choices[static_cast<size_t>(index)];
    if (choice.finished) continue;

    auto [it, inserted] = pending.try_emplace(request_id);
    if (inserted) order.push_back(request_id);
    RequestOutput& ro = it->second;
    if (index == 0) req.num_cached_tokens = out.num_cached_tokens;
    if (out.times && (!req.times || index == 0)) req.times = out.times;
    if (out.prompt_logprobs && !req.prompt_logprobs.empty()) {
      const PromptLogprobsChunk& c = *out.prompt_logprobs;
      for (size_t i = 0; i < c.entries.size(); ++i) {
        const size_t pos = static_cast<size_t>(c.start) + i;
        if (pos == 0 || pos >= req.prompt_logprobs.size() || !c.entries[i]) continue;
        if (!req.prompt_logprobs[pos]) req.prompt_logprobs_missing -= 1;
        req.prompt_logprobs[pos] = c.entries[i];
      }
    }
    if (out.new_token_ids.empty() && !is_finished(out.status)) continue;

    ChoiceDelta delta;
    delta.index = index;
    if (apply(req, choice, out, delta)) stopped.push_back(out.req_id);
    if (choice.finished) req.num_unfinished -= 1;
    ro.choices.push_back(std::move(delta));
  }

  for (const std::string& request_id : order) {
    RequestOutput& ro = pending[request_id];
    if (ro.choices.empty()) continue;
    RequestState& req = requests_.at(request_id);
    ro.request_id = request_id;
    ro.num_prompt_tokens = req.num_prompt_tokens;
    ro.num_cached_tokens = req.num_cached_tokens;
    // Prompt logprobs go out once, complete: with n > 1 a sibling can produce tokens (its prompt
    // served from the cache) while choice 0 is still prefilling.
    if (req.params->prompt_logprobs && !req.sent_prompt_logprobs && req.prompt_logprobs_missing == 0) {
      ro.prompt_logprobs = req.prompt_logprobs;
      req.sent_prompt_logprobs = true;
    }
    ro.finished = req.num_unfinished == 0;
    if (ro.finished) ro.times = req.times;
    std::shared_ptr<RequestStream> stream = req.stream;
    if (ro.finished) {
      for (const Choice& c : req.choices) child_to_parent_.erase(c.child_id);
      requests_.erase(request_id);
    }
    stream->push(std::move(ro));
  }
  return stopped;
}

void OutputProcessor::abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  RequestState& req = it->second;
  RequestOutput ro;
  ro.request_id = request_id;
  ro.num_prompt_tokens = req.num_prompt_tokens;
  ro.num_cached_tokens = req.num_cached_tokens;
  ro.finished = true;
  for (size_t i = 0; i < req.choices.size(); ++i) {
    if (req.choices[i].finished) continue;
    ChoiceDelta d;
    d.index = static_cast<int>(i);
    d.finish_reason = FinishReason::kAbort;
    ro.choices.push_back(std::move(d));
  }
  std::shared_ptr<RequestStream> stream = req.stream;
  for (const Choice& c : req.choices) child_to_parent_.erase(c.child_id);
  requests_.erase(it);
  stream->push(std::move(ro));
}

void OutputProcessor::fail(const std::string& request_id, const std::string& message) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  RequestOutput ro;
  ro.request_id = request_id;
  ro.num_prompt_tokens = it->second.num_prompt_tokens;
  ro.finished = true;
  ro.error = message;
  std::shared_ptr<RequestStream> stream = it->second.stream;
  for (const Choice& c : it->second.choices) child_to_parent_.erase(c.child_id);
  requests_.erase(it);
  stream->push(std::move(ro));
}

}  // namespace specula
