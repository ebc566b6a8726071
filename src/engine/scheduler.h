// The continuous-batching scheduler (vLLM v1 style). Each step has a token budget; running
// requests go first (decodes, continuing chunked prefills, draft tokens to verify), then waiting
// requests are admitted first-come-first-served, their prompts split into chunks that fit what is
// left of the budget. When KV blocks run out, the most recently admitted running request is
// preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed.
//
// Accounting is "scheduled = computed": num_computed_tokens advances when a step is scheduled and
// is rolled back for rejected draft tokens when the step's counts are known. Synchronously that is
// update(); with async scheduling apply_counts() does it as soon as the runner has submitted the
// step, adding the tokens it will sample as Request::num_output_placeholders, so that step N+1 is
// planned while step N runs; update() then replaces the placeholders with the values.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache_manager.h"
#include "engine/request.h"
#include "engine/scheduler_output.h"

namespace specula {

struct SchedulerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int max_model_len = 2048;
  int block_size = 16;
  int num_blocks = 0;
  bool enable_prefix_caching = true;
  int num_speculative_tokens = 0;  // KV slots reserved ahead of each request for draft tokens
  // false (--no-enable-chunked-prefill): a prompt is admitted only when all of it fits the step's
  // token budget, so it runs in one step.
  bool enable_chunked_prefill = true;
};

// Cumulative counters (the engine turns them into metrics and the periodic stats line).
struct SchedulerStats {
  int64_t num_preemptions = 0;
  int64_t prompt_tokens = 0;       // prompts of requests that produced their first token
  int64_t generation_tokens = 0;
  int64_t requests_finished = 0;   // stopped or length-capped
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  const SchedulerConfig& config() const { return config_; }
  void add_request(std::unique_ptr<Request> request);
  // Ends requests outside a step's result (abort, a stop string, a failed step) and frees their
  // blocks; unknown or already finished ids are ignored. Returns the ids it ended.
  std::vector<std::string> finish_requests(const std::vector<std::string>& ids, RequestStatus status,
                                           bool kv_contents_valid = true);
  // Drafts for the request's next step (from a proposer); trimmed to what the budget allows.
  void set_draft_tokens(const std::string& id, std::vector<int32_t> tokens);

  // now: the engine's clock (seconds), for the requests' phase times (RequestTimes).
  SchedulerOutput schedule(double now = 0.0);
  // Async scheduling: applies a submitted step's counts before its values reach the host (rolls
  // back rejected drafts, counts the tokens it samples as output placeholders, sets the drafts of
  // the next step), so that the next step can be scheduled while this one runs.
  void apply_counts(const SchedulerOutput& scheduled, const StepCounts& counts);
  // Applies a step's result: appends the accepted tokens (rolling back rejected drafts unless
  // apply_counts did), checks stop conditions, frees finished requests' blocks. A request that
  // ended while the step ran (a late stop, an abort) gets nothing: its tokens are discarded.
  std::vector<EngineCoreOutput> update(const SchedulerOutput& scheduled, const ModelRunnerOutput& result,
                                       double now = 0.0);

  const Request* find(const std::string& id) const;
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  bool has_unfinished_requests() const { return !running_.empty() || !waiting_.empty(); }
  // Unfinished requests with a grammar (structured outputs).
  int num_structured_requests() const;
  const KVCacheManager& kv_cache() const { return kv_; }
  KVCacheManager& kv_cache() { return kv_; }
  const SchedulerStats& stats() const { return stats_; }

 private:
  bool check_stop(Request& r) const;
  // num_sampled tokens came out of a step that verified s.spec_token_ids: the rejected drafts'
  // KV slots are rolled back, the verification counted (the SpecDecoding metrics).
  void roll_back_rejected(Request& r, const ScheduledRequest& s, int num_sampled);
  void count_verification(const ScheduledRequest& s, int num_sampled);
  void preempt(Request* r);
  void finish(Request* r, RequestStatus status, bool kv_contents_valid);
  NewRequestData new_request_data(const Request& r) const;

  SchedulerConfig config_;
  KVCacheManager kv_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;  // unfinished only
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // admission order; the back is preempted first
  std::vector<std::string> finished_since_last_step_;
  // Preempted by a step that scheduled nothing (the runner never saw it): for the next output.
  std::vector<std::string> preempted_unreported_;
  uint64_t step_id_ = 0;
  uint64_t counts_applied_step_ = 0;  // steps up to this one had apply_counts (update must not redo it)
  SchedulerStats stats_;
};

}  // namespace specula
