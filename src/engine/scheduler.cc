#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace specula {

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config),
      kv_(config.num_blocks, config.block_size, config.max_model_len, config.enable_prefix_caching) {
  SPECULA_CHECK(config.max_num_batched_tokens > 0, "max_num_batched_tokens must be positive, got {}",
                config.max_num_batched_tokens);
  SPECULA_CHECK(config.max_num_seqs > 0, "max_num_seqs must be positive, got {}", config.max_num_seqs);
}

void Scheduler::add_request(std::unique_ptr<Request> request) {
  SPECULA_CHECK(!request->prompt_token_ids.empty(), "request {}: the prompt is empty", request->request_id);
  SPECULA_CHECK(requests_.count(request->request_id) == 0, "request id {} is already in use", request->request_id);
  request->status = RequestStatus::kWaiting;
  Request* r = request.get();
  requests_.emplace(r->request_id, std::move(request));
  waiting_.push_back(r);
}

const Request* Scheduler::find(const std::string& id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

int Scheduler::num_structured_requests() const {
  int n = 0;
  for (const auto& [id, r] : requests_) n += r->grammar ? 1 : 0;
  return n;
}

void Scheduler::set_draft_tokens(const std::string& id, std::vector<int32_t> tokens) {
  auto it = requests_.find(id);
  if (it != requests_.end()) it->second->spec_token_ids = std::move(tokens);
}

NewRequestData Scheduler::new_request_data(const Request& r) const {
  NewRequestData d;
  d.req_id = r.request_id;
  d.prompt_token_ids = r.prompt_token_ids;
  d.output_token_ids = r.output_token_ids;
  d.params = r.params;
  d.sampling_seed = r.sampling_seed;
  if (r.params->min_tokens > 0) {
    if (r.eos_token_id) d.min_tokens_stop_ids.push_back(*r.eos_token_id);
    d.min_tokens_stop_ids.insert(d.min_tokens_stop_ids.end(), r.stop_token_ids.begin(), r.stop_token_ids.end());
  }
  d.want_prompt_logprobs = r.wants_prompt_logprobs();
  d.block_ids = kv_.block_ids(r.request_id);
  return d;
}

void Scheduler::preempt(Request* r) {
  kv_.free(*r);
  r->status = RequestStatus::kPreempted;
  r->num_computed_tokens = 0;  // recomputed on resumption (mostly prefix-cache hits)
  r->spec_token_ids.clear();
  r->num_output_placeholders = 0;
  r->num_preemptions += 1;
  stats_.num_preemptions += 1;
  waiting_.push_front(r);
}

SchedulerOutput Scheduler::schedule(double now) {
  SchedulerOutput out;
  out.step_id = ++step_id_;
  out.finished_req_ids = std::move(finished_since_last_step_);
  finished_since_last_step_.clear();

  int budget = config_.max_num_batched_tokens;
  std::vector<Request*> scheduled;  // in batch order
  std::vector<int> num_tokens;

  // 1. Running requests, in admission order.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    if (r->num_output_placeholders > 0 &&
        (r->num_output_tokens() + r->num_output_placeholders >= r->max_tokens ||
         r->num_tokens() + r->num_output_placeholders >= config_.max_model_len)) {
      // Async scheduling: the step in flight ends it on length and update() finishes it. Its seat
      // (and its state in the runner and proposer) is taken until then: admission may come a step
      // later than synchronously.
      ++i;
      continue;
    }
    int grammar_cut = 0;
    if (r->grammar && !r->spec_token_ids.empty()) {
      // A draft the grammar forbids is never accepted, so the drafts after it are not verified.
      // It is verified itself: rejected, its position is sampled from the residual of the masked
      // target and the draft's q, which is what keeps sampled drafts lossless (sampling it from
      // the masked target alone would over-weight the tokens q favours).
      const int keep = std::min(r->grammar->num_valid_drafts(r->spec_token_ids) + 1,
                                static_cast<int>(r->spec_token_ids.size()));
      grammar_cut = static_cast<int>(r->spec_token_ids.size()) - keep;
      r->spec_token_ids.resize(static_cast<size_t>(keep));
    }
    int n = r->num_tokens_with_spec() + r->num_output_placeholders - r->num_computed_tokens;
    n = std::min(n, budget);
    // No input position may reach max_model_len (drafts past it are dropped).
    n = std::min(n, config_.max_model_len - 1 - r->num_computed_tokens);
    if (n <= 0) {  // everything scheduled already (async scheduling waits for its placeholders)
      ++i;
      continue;
    }
    std::optional<std::vector<int32_t>> new_blocks;
    while (!(new_blocks = kv_.allocate_slots(*r, n, {}, config_.num_speculative_tokens))) {
      Request* victim = running_.back();
      running_.pop_back();
      preempt(victim);
      out.preempted_req_ids.push_back(victim->request_id);
      if (victim == r) break;
    }
    if (!new_blocks) break;  // r preempted itself: nothing after it is left in running_
    ScheduledRequest s;
    s.req_id = r->request_id;
    s.num_scheduled_tokens = n;
    s.num_computed_tokens = r->num_computed_tokens;
    s.new_block_ids = std::move(*new_blocks);
    s.num_grammar_cut_drafts = grammar_cut;
    const int num_spec = n + r->num_computed_tokens - r->num_tokens() - r->num_output_placeholders;
    if (num_spec > 0) s.spec_token_ids.assign(r->spec_token_ids.begin(), r->spec_token_ids.begin() + num_spec);
    out.scheduled.push_back(std::move(s));
    scheduled.push_back(r);
    num_tokens.push_back(n);
    budget -= n;
    ++i;
  }

  // 2. Waiting requests, first come first served; none while this step had to preempt.
  if (out.preempted_req_ids.empty()) {
    while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < config_.max_num_seqs) {
      Request* r = waiting_.front();
      SPECULA_ASSERT(r->num_computed_tokens == 0);
      ComputedBlocks hit = kv_.get_computed_blocks(*r);
      int n = std::min(r->num_tokens() - hit.num_tokens, budget);
      if (!config_.enable_chunked_prefill && n < r->num_tokens() - hit.num_tokens) break;  // next step, whole
      std::optional<std::vector<int32_t>> new_blocks = kv_.allocate_slots(*r, n, hit, config_.num_speculative_tokens);
      if (!new_blocks) break;  // FCFS: nobody overtakes the head of the queue
      kv_.record_prefix_cache_query(*r, hit.num_tokens);
      waiting_.pop_front();
      running_.push_back(r);
      r->status = RequestStatus::kRunning;
      if (r->scheduled_time == 0.0) r->scheduled_time = now;
      r->num_computed_tokens = hit.num_tokens;
      if (r->num_cached_tokens < 0) r->num_cached_tokens = hit.num_tokens;
      out.new_requests.push_back(new_request_data(*r));
      ScheduledRequest s;
      s.req_id = r->request_id;
      s.num_scheduled_tokens = n;
      s.num_computed_tokens = r->num_computed_tokens;
      out.scheduled.push_back(std::move(s));
      scheduled.push_back(r);
      num_tokens.push_back(n);
      budget -= n;
    }
  }

  // 3. Scheduled tokens count as computed from now on; drafts are consumed. Requests with a
  // grammar that sample this step hand it to the runner for their rows' token masks.
  for (size_t k = 0; k < scheduled.size(); ++k) {
    Request& r = *scheduled[k];
    r.num_computed_tokens += num_tokens[k];
    r.spec_token_ids.clear();
    out.total_num_scheduled_tokens += num_tokens[k];
    if (r.grammar && r.num_computed_tokens >= r.num_tokens()) {
      // The masks follow the output's values: async scheduling runs these requests' steps one
      // at a time (EngineCore), so no placeholder is ahead of the grammar here.
      SPECULA_ASSERT(r.num_output_placeholders == 0);
      out.scheduled[k].grammar = r.grammar.get();
    }
  }
  // The runner sees only outputs that schedule something (an empty one is dropped: under async
  // scheduling while every running request waits on the step in flight): the ids whose state it
  // must drop wait for the next output, or its state (and a proposer's) would outlive them.
  if (out.empty()) {
    finished_since_last_step_ = std::move(out.finished_req_ids);
    out.finished_req_ids.clear();
    preempted_unreported_.insert(preempted_unreported_.end(), out.preempted_req_ids.begin(), out.preempted_req_ids.end());
    out.preempted_req_ids.clear();
  } else if (!preempted_unreported_.empty()) {
    out.preempted_req_ids.insert(out.preempted_req_ids.begin(), preempted_unreported_.begin(), preempted_unreported_.end());
    preempted_unreported_.clear();
  }
  return out;
}

bool Scheduler::check_stop(Request& r) const {
  if (r.num_tokens() >= config_.max_model_len || r.num_output_tokens() >= r.max_tokens) {
    r.status = RequestStatus::kFinishedLength;
    return true;
  }
  if (r.num_output_tokens() < r.params->min_tokens) return false;
  const int32_t last = r.output_token_ids.back();
  if (r.eos_token_id && last == *r.eos_token_id) {
    r.status = RequestStatus::kFinishedStopped;
    return true;
  }
  if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), last) != r.stop_token_ids.end()) {
    r.status = RequestStatus::kFinishedStopped;
    r.stop_reason = last;
    return true;
  }
  return false;
}

void Scheduler::roll_back_rejected(Request& r, const ScheduledRequest& s, int num_sampled) {
  if (s.spec_token_ids.empty() || num_sampled == 0) return;
  // k drafts verified: sampled = accepted drafts + one token from the target.
  const int num_drafts = static_cast<int>(s.spec_token_ids.size());
  const int num_accepted = num_sampled - 1;
  SPECULA_ASSERT(num_accepted >= 0 && num_accepted <= num_drafts);
  r.num_computed_tokens -= num_drafts - num_accepted;  // rejected drafts' KV is overwritten later
}

void Scheduler::count_verification(const ScheduledRequest& s, int num_sampled) {
  if (s.spec_token_ids.empty() || num_sampled == 0) return;
  const int num_drafts = static_cast<int>(s.spec_token_ids.size());
  const int num_accepted = num_sampled - 1;
  stats_.spec_num_drafts += 1;
  stats_.spec_num_draft_tokens += num_drafts;
  stats_.spec_num_accepted_tokens += num_accepted;
  if (stats_.spec_accepted_per_pos.size() < static_cast<size_t>(num_drafts))
    stats_.spec_accepted_per_pos.resize(static_cast<size_t>(num_drafts), 0);
  for (int j = 0; j < num_accepted; ++j) stats_.spec_accepted_per_pos[j] += 1;
}

void Scheduler::apply_counts(const SchedulerOutput& scheduled, const StepCounts& counts) {
  SPECULA_CHECK(counts.num_sampled.size() == scheduled.scheduled.size(),
                "internal error: the model runner counted {} results for {} scheduled requests",
                counts.num_sampled.size(), scheduled.scheduled.size());
  counts_applied_step_ = scheduled.step_id;
  for (size_t k = 0; k < scheduled.scheduled.size(); ++k) {
    auto it = requests_.find(scheduled.scheduled[k].req_id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    roll_back_rejected(r, scheduled.scheduled[k], counts.num_sampled[k]);
    r.num_output_placeholders += counts.num_sampled[k];
    if (k < counts.draft_token_ids.size()) r.spec_token_ids = counts.draft_token_ids[k];
  }
}

std::vector<EngineCoreOutput> Scheduler::update(const SchedulerOutput& scheduled, const ModelRunnerOutput& result,
                                                double now) {
  SPECULA_CHECK(result.sampled_token_ids.size() == scheduled.scheduled.size(),
                "internal error: the model runner returned {} results for {} scheduled requests",
                result.sampled_token_ids.size(), scheduled.scheduled.size());
  const bool counts_applied = scheduled.step_id <= counts_applied_step_;
  std::vector<EngineCoreOutput> outputs;
  for (size_t k = 0; k < scheduled.scheduled.size(); ++k) {
    const ScheduledRequest& s = scheduled.scheduled[k];
    auto it = requests_.find(s.req_id);
    if (it == requests_.end()) continue;  // finished (aborted, stopped a step late) after it was scheduled
    Request* r = it->second.get();
    const std::vector<int32_t>& sampled = result.sampled_token_ids[k];
    if (counts_applied) {
      // The placeholders become values (a request preempted meanwhile has none left: its tokens
      // are still valid, and recomputed with the rest when it resumes).
      r->num_output_placeholders = std::max(0, r->num_output_placeholders - static_cast<int>(sampled.size()));
    } else {
      roll_back_rejected(*r, s, static_cast<int>(sampled.size()));
    }
    // Counted here, not in apply_counts: a verification whose request ended meanwhile is discarded.
    count_verification(s, static_cast<int>(sampled.size()));

    EngineCoreOutput o;
    o.req_id = r->request_id;
    if (k < result.prompt_logprobs.size() && !result.prompt_logprobs[k].entries.empty())
      o.prompt_logprobs = result.prompt_logprobs[k];
    const std::vector<PositionLogprobs>* logprobs =
        k < result.logprobs.size() && !result.logprobs[k].empty() ? &result.logprobs[k] : nullptr;
    bool stopped = false;
    if (!sampled.empty() && r->num_output_tokens() == 0) stats_.prompt_tokens += r->num_prompt_tokens();
    for (size_t j = 0; j < sampled.size() && !stopped; ++j) {
      // The sampler masked every token the grammar forbids: a refusal here is a bug upstream.
      SPECULA_CHECK(!r->grammar || r->grammar->accept_token(sampled[j]),
                    "internal error: request {} sampled token {}, which its grammar forbids", r->request_id,
                    sampled[j]);
      r->append_output_token(sampled[j]);
      o.new_token_ids.push_back(sampled[j]);
      if (logprobs && j < logprobs->size()) o.new_logprobs.push_back((*logprobs)[j]);
      stopped = check_stop(*r);
    }
    stats_.generation_tokens += static_cast<int64_t>(o.new_token_ids.size());
    if (r->grammar && r->grammar->failed()) {
      // Its grammar outgrew the automaton's bounds: this request ends with the error (its
      // tokens since then were sampled under end-token-only masks), the batch goes on.
      o.status = RequestStatus::kFinishedError;
      o.error = "structured output: " + r->grammar->error();
      finish(r, RequestStatus::kFinishedError, /*kv_contents_valid=*/true);
      outputs.push_back(std::move(o));
      continue;
    }
    if (!o.new_token_ids.empty()) {
      if (r->first_token_time == 0.0) r->first_token_time = now;
      r->last_token_time = now;
    }
    if (o.new_token_ids.empty() && !o.prompt_logprobs) continue;  // a prefill chunk: nothing to report yet
    o.num_cached_tokens = std::max(r->num_cached_tokens, 0);
    o.times = RequestTimes{r->arrival_time, r->scheduled_time, r->first_token_time, r->last_token_time};
    if (stopped) {
      o.status = r->status;
      o.stop_reason = r->stop_reason;
      finish(r, r->status, /*kv_contents_valid=*/true);
    }
    outputs.push_back(std::move(o));
  }
  return outputs;
}

void Scheduler::finish(Request* r, RequestStatus status, bool kv_contents_valid) {
  r->status = status;
  if (status == RequestStatus::kFinishedStopped || status == RequestStatus::kFinishedLength)
    stats_.requests_finished += 1;
  if (auto it = std::find(running_.begin(), running_.end(), r); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), r); it != waiting_.end()) waiting_.erase(it);
  kv_.free(*r, kv_contents_valid);
  finished_since_last_step_.push_back(r->request_id);
  requests_.erase(r->request_id);  // r is gone from here on
}

std::vector<std::string> Scheduler::finish_requests(const std::vector<std::string>& ids, RequestStatus status,
                                                    bool kv_contents_valid) {
  SPECULA_ASSERT(is_finished(status));
  std::vector<std::string> ended;
  for (const std::string& id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    ended.push_back(id);
    finish(it->second.get(), status, kv_contents_valid);
  }
  return ended;
}

}  // namespace specula
