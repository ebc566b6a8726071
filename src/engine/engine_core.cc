#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "core/error.h"
#include "core/phase_profile.h"
#include "core/logging.h"

namespace specula {

namespace {

SchedulerConfig scheduler_config(const EngineCoreConfig& c) {
  SchedulerConfig s;
  s.max_num_seqs = c.max_num_seqs;
  s.max_num_batched_tokens = c.max_num_batched_tokens;
  s.max_model_len = c.max_model_len;
  s.block_size = c.block_size;
  s.num_blocks = c.num_blocks;
  s.enable_prefix_caching = c.enable_prefix_caching;
  s.num_speculative_tokens = c.num_speculative_tokens;
  s.enable_chunked_prefill = c.enable_chunked_prefill;
  return s;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

EngineCore::EngineCore(const EngineCoreConfig& config, ModelExecutor& executor, const Tokenizer& tokenizer)
    : config_(config), executor_(executor), tokenizer_(tokenizer), scheduler_(scheduler_config(config)),
      outputs_(tokenizer),
      structured_outputs_(std::make_unique<StructuredOutputManager>(tokenizer, config.vocab_size)) {}

void EngineCore::validate(const NewRequest& request) const {
  request.params.validate();
  const int prompt_len = static_cast<int>(request.prompt_token_ids.size());
  SPECULA_CHECK(prompt_len > 0, "the prompt is empty: at least one prompt token is required");
  for (int32_t t : request.prompt_token_ids)
    SPECULA_CHECK(t >= 0 && (config_.vocab_size <= 0 || t < config_.vocab_size),
                  "prompt token id {} is out of vocabulary (vocab size {})", t, config_.vocab_size);
  const int max_tokens = request.params.max_tokens.value_or(1);
  const int64_t total = static_cast<int64_t>(prompt_len) + max_tokens;
  SPECULA_CHECK(total <= config_.max_model_len,
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the "
                "prompt, {} in the completion). Please reduce the length of the prompt or completion.",
                config_.max_model_len, total, prompt_len, max_tokens);
  if (request.params.structured_outputs) structured_outputs_->compile(*request.params.structured_outputs);
}

std::vector<std::string> EngineCore::child_ids(const std::string& request_id, int n) const {
  if (n == 1) return {request_id};
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back(request_id + "#" + std::to_string(i));
  return ids;
}

void EngineCore::add_request(NewRequest request, std::shared_ptr<RequestStream> stream) {
  validate(request);
  auto params = std::make_shared<const SamplingParams>(std::move(request.params));
  const std::vector<std::string> ids = child_ids(request.request_id, params->n);
  const int prompt_len = static_cast<int>(request.prompt_token_ids.size());

  // eos and the extra stop tokens (vLLM semantics, see EngineCoreConfig).
  std::optional<int32_t> eos;
  std::vector<int32_t> extra_stops;
  if (!config_.eos_token_ids.empty() && !params->ignore_eos) {
    eos = config_.eos_token_ids.front();
    extra_stops.assign(config_.eos_token_ids.begin() + 1, config_.eos_token_ids.end());
  }
  std::vector<int32_t> stop_ids = params->stop_token_ids;
  for (int32_t t : extra_stops)
    if (std::find(stop_ids.begin(), stop_ids.end(), t) == stop_ids.end()) stop_ids.push_back(t);

  outputs_.add_request(request.request_id, ids, prompt_len, params, std::move(stream));
  const double arrival = now_seconds();
  for (size_t i = 0; i < ids.size(); ++i) {
    auto r = std::make_unique<Request>();
    r->request_id = ids[i];
    r->parent_id = request.request_id;
    r->choice_index = static_cast<int>(i);
    r->prompt_token_ids = request.prompt_token_ids;
    r->all_token_ids = request.prompt_token_ids;
    r->params = params;
    r->max_tokens = params->max_tokens.value_or(config_.max_model_len - prompt_len);
    r->eos_token_id = eos;
    r->stop_token_ids = stop_ids;
    // Each choice its own stream: (seed + index) as vLLM does for n > 1; unseeded sequences take
    // the engine seed plus a counter, so a whole run is reproducible from --seed.
    r->sampling_seed = params->seed ? *params->seed + i : config_.seed + (++unseeded_counter_) * 0x9e3779b97f4a7c15ull;
    if (params->structured_outputs) {
      // Every eos id ends a constrained output where its grammar is complete (even with
      // ignore_eos, the grammar has nothing else to offer there).
      std::vector<int32_t> end_ids = config_.eos_token_ids;
      for (int32_t t : stop_ids)
        if (std::find(end_ids.begin(), end_ids.end(), t) == end_ids.end()) end_ids.push_back(t);
      r->grammar = structured_outputs_->make_matcher(*params->structured_outputs, std::move(end_ids));
    }
    r->arrival_seq = arrival_seq_++;
    r->arrival_time = arrival;
    scheduler_.add_request(std::move(r));
  }
}

void EngineCore::abort(const std::string& request_id) {
  if (!outputs_.has_request(request_id)) return;
  scheduler_.finish_requests(outputs_.children_of(request_id), RequestStatus::kFinishedAborted);
  outputs_.abort(request_id);
}

void EngineCore::abort_all() {
  for (const std::string& id : outputs_.request_ids()) abort(id);
}

void EngineCore::fail_requests(const std::vector<std::string>& request_ids, const std::string& message) {
  for (const std::string& parent : request_ids) {
    const std::vector<std::string> ids = outputs_.children_of(parent);
    // Their KV blocks may hold garbage: keep them out of the prefix cache.
    scheduler_.finish_requests(ids, RequestStatus::kFinishedError, /*kv_contents_valid=*/false);
    outputs_.fail(parent, message);
  }
}

void EngineCore::fail_all(const std::string& message) { fail_requests(outputs_.request_ids(), message); }

void EngineCore::count_iteration_tokens(const SchedulerOutput& scheduled) {
  const int tokens = scheduled.total_num_scheduled_tokens;
  const auto* end = std::end(kIterationTokenBuckets);
  const size_t bucket = static_cast<size_t>(std::lower_bound(std::begin(kIterationTokenBuckets), end, tokens) -
                                            std::begin(kIterationTokenBuckets));
  if (iteration_tokens_buckets_.empty()) iteration_tokens_buckets_.assign(std::size(kIterationTokenBuckets) + 1, 0);
  iteration_tokens_buckets_[bucket] += 1;
  iteration_tokens_sum_ += tokens;
}

void EngineCore::fail_step(const SchedulerOutput& scheduled, const std::exception& e) {
  // One batch, one failure: every request in it gets the error; the engine carries on.
  std::vector<std::string> parents;
  for (const ScheduledRequest& s : scheduled.scheduled) {
    std::string parent = outputs_.parent_of(s.req_id);
    if (!parent.empty() && std::find(parents.begin(), parents.end(), parent) == parents.end())
      parents.push_back(parent);
  }
  LOG_ERROR("engine step {} failed ({} requests): {}", scheduled.step_id, parents.size(), e.what());
  fail_requests(parents, std::string("engine step failed: ") + e.what());
}

void EngineCore::process_result(const SchedulerOutput& scheduled, ModelRunnerOutput& result) {
  phase_profile::Scope update_phase("engine.update+outputs");
  std::vector<EngineCoreOutput> outs = scheduler_.update(scheduled, result, now_seconds());
  if (!config_.async_scheduling) {
    // Drafts for the next step (finished requests are gone from the scheduler: ignored). Async
    // scheduling set them from the step's counts already.
    for (size_t i = 0; i < result.draft_token_ids.size() && i < scheduled.scheduled.size(); ++i)
      if (!result.draft_token_ids[i].empty())
        scheduler_.set_draft_tokens(scheduled.scheduled[i].req_id, std::move(result.draft_token_ids[i]));
    if (result.spec_depth >= 0) {
      spec_depth_steps_ += 1;
      spec_depth_sum_ += result.spec_depth;
    }
    spec_steps_launched_ahead_ += result.proposer_launched_ahead ? 1 : 0;
  }
  if (on_step_counted_) on_step_counted_();
  // A sequence the scheduler ended with an error fails its whole request (siblings too).
  for (const EngineCoreOutput& o : outs) {
    if (o.status != RequestStatus::kFinishedError) continue;
    LOG_WARN("request {} failed: {}", o.req_id, o.error);
    fail_requests({outputs_.parent_of(o.req_id)}, o.error);
  }
  std::vector<std::string> stopped = outputs_.process(outs);
  scheduler_.finish_requests(stopped, RequestStatus::kFinishedStopped);
}

bool EngineCore::step() {
  if (config_.async_scheduling) return step_async();
  if (!scheduler_.has_unfinished_requests()) return false;
  SchedulerOutput scheduled = [&] {
    phase_profile::Scope p("engine.schedule");
    return scheduler_.schedule(now_seconds());
  }();
  if (scheduled.empty()) {
    // Nothing fits even though requests wait: cannot happen while the cache holds a whole
    // max_model_len sequence, but never spin on it.
    fail_all("internal error: no request could be scheduled (KV cache too small?)");
    return true;
  }
  count_iteration_tokens(scheduled);
  ModelRunnerOutput result;
  try {
    result = executor_.execute(scheduled);
  } catch (const std::exception& e) {
    fail_step(scheduled, e);
    return true;
  }
  process_result(scheduled, result);
  return true;
}

// One step in flight: schedule and submit step N+1 on step N's counts (its tokens are output
// placeholders, its drafts may be placeholders the runner holds), and process step N's values
// while N+1 runs (the executor does it once N+1 is queued on the device, before waiting for N+1's
// counts). A request that step N's values stop (eos, max_tokens, a stop string) or that
// was aborted meanwhile is finished then; its tokens from step N+1 are discarded in update().
bool EngineCore::step_async() {
  if (!scheduler_.has_unfinished_requests() && !in_flight_) return false;
  if (in_flight_ && scheduler_.num_structured_requests() > 0) {
    // A grammar's next masks need the in-flight step's tokens: with structured requests running,
    // the step in flight is processed before the next is scheduled.
    process_in_flight();
    if (!scheduler_.has_unfinished_requests()) return true;
  }
  std::optional<SchedulerOutput> next;
  if (scheduler_.has_unfinished_requests()) {
    phase_profile::Scope p("engine.schedule");
    SchedulerOutput s = scheduler_.schedule(now_seconds());
    if (!s.empty()) next = std::move(s);
  }
  if (!next && !in_flight_) {
    fail_all("internal error: no request could be scheduled (KV cache too small?)");
    return true;
  }
  // The step in flight is processed while the device runs the next one. What that throws (a bug
  // in the loop, not a failed step) leaves after the next step is in flight, so that its output
  // is still collected.
  std::exception_ptr processing_error;
  const auto process = [this, &processing_error] {
    try {
      if (in_flight_) process_in_flight();
    } catch (...) {
      in_flight_.reset();
      processing_error = std::current_exception();
    }
  };
  if (next) {
    count_iteration_tokens(*next);
    try {
      StepCounts counts = executor_.submit(*next, process);
      scheduler_.apply_counts(*next, counts);
      if (counts.spec_depth >= 0) {
        spec_depth_steps_ += 1;
        spec_depth_sum_ += counts.spec_depth;
      }
      spec_steps_launched_ahead_ += counts.proposer_launched_ahead ? 1 : 0;
    } catch (const std::exception& e) {
      fail_step(*next, e);
      next.reset();
    }
  }
  process();
  in_flight_ = std::move(next);
  if (processing_error) std::rethrow_exception(processing_error);
  return true;
}

void EngineCore::process_in_flight() {
  SchedulerOutput done = std::move(*in_flight_);
  in_flight_.reset();
  ModelRunnerOutput result;
  try {
    result = executor_.collect();
  } catch (const std::exception& e) {
    fail_step(done, e);
    return;
  }
  process_result(done, result);
}

EngineMetrics EngineCore::metrics() const {
  EngineMetrics m;
  const SchedulerStats& s = scheduler_.stats();
  const KVCacheManager& kv = scheduler_.kv_cache();
  m.num_requests_running = scheduler_.num_running();
  m.num_requests_waiting = scheduler_.num_waiting();
  m.kv_cache_usage = kv.usage();
  m.prompt_tokens_total = s.prompt_tokens;
  m.generation_tokens_total = s.generation_tokens;
  m.prefix_cache_queries = kv.prefix_cache_stats().queries;
  m.prefix_cache_hits = kv.prefix_cache_stats().hits;
  m.num_preemptions = s.num_preemptions;
  m.request_success_total = s.requests_finished;
  m.spec_num_drafts = s.spec_num_drafts;
  m.spec_num_draft_tokens = s.spec_num_draft_tokens;
  m.spec_num_accepted_tokens = s.spec_num_accepted_tokens;
  m.spec_accepted_per_pos = s.spec_accepted_per_pos;
  // One entry per position up to k, as vLLM reports them: a position never drafted (an ngram
  // match followed by fewer than k tokens every time) shows as 0, not as a shorter list.
  if (m.spec_accepted_per_pos.size() < static_cast<size_t>(config_.num_speculative_tokens))
    m.spec_accepted_per_pos.resize(static_cast<size_t>(config_.num_speculative_tokens), 0);
  m.spec_num_speculative_tokens = config_.num_speculative_tokens;
  m.spec_adaptive = config_.spec_adaptive;
  m.spec_depth_steps = spec_depth_steps_;
  m.iteration_tokens_buckets = iteration_tokens_buckets_;
  m.iteration_tokens_sum = iteration_tokens_sum_;
  m.spec_depth_sum = spec_depth_sum_;
  m.spec_steps_launched_ahead = spec_steps_launched_ahead_;
  m.num_gpu_blocks = kv.num_blocks();
  m.block_size = config_.block_size;
  m.cache_dtype = config_.cache_dtype;
  m.enable_prefix_caching = config_.enable_prefix_caching;
  m.gpu_memory_utilization = config_.gpu_memory_utilization;
  return m;
}

}  // namespace specula
