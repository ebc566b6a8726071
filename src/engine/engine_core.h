// EngineCore: one engine iteration, synchronous and single-threaded: new requests and aborts in,
// schedule -> execute -> update -> outputs to the RequestStreams. The threaded LLMEngine drives it
// from its loop thread; tests drive it step by step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/api.h"
#include "engine/llm_engine.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/scheduler.h"
#include "engine/structured_output_manager.h"
#include "tokenizer/tokenizer.h"

namespace specula {

struct EngineCoreConfig {
  int max_model_len = 2048;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int block_size = 16;
  int num_blocks = 0;
  bool enable_prefix_caching = true;
  std::string cache_dtype = "auto";    // (for the metrics) --kv-cache-dtype as given
  double gpu_memory_utilization = 0.9; // (for the metrics)
  int num_speculative_tokens = 0;      // k: KV slots reserved ahead of each request for its drafts
  bool enable_chunked_prefill = true;
  bool spec_adaptive = false;   // (for the metrics) the speculator adapts the depth per step
  // --async-scheduling: one step in flight; step N+1 is scheduled and submitted before step N's
  // tokens are processed (engine/README.md).
  bool async_scheduling = false;
  uint64_t seed = 0;            // requests without a seed draw from seed + a per-sequence counter
  int64_t vocab_size = 0;       // prompt token ids must lie below it
  // eos: the tokenizer's eos_token_id when it has one, else the first generation_config eos; the
  // other generation_config eos ids also stop a sequence (reported as its stop_reason).
  std::vector<int32_t> eos_token_ids;
};

class EngineCore {
 public:
  EngineCore(const EngineCoreConfig& config, ModelExecutor& executor, const Tokenizer& tokenizer);

  const EngineCoreConfig& config() const { return config_; }
  // Throws specula::Error naming the parameter or both lengths. Thread-safe (reads config only).
  void validate(const NewRequest& request) const;
  void add_request(NewRequest request, std::shared_ptr<RequestStream> stream);
  // Finishes every sequence of the client request (blocks freed, final "abort" output).
  void abort(const std::string& request_id);
  void abort_all();
  // Fails every unfinished request with `message` (the loop itself broke).
  void fail_all(const std::string& message);

  // One iteration; false when there was nothing to run. With async scheduling an iteration submits
  // the next step and processes the one in flight while the device runs it.
  bool step();
  bool has_unfinished_requests() const { return scheduler_.has_unfinished_requests() || in_flight_.has_value(); }

  const Scheduler& scheduler() const { return scheduler_; }
  Scheduler& scheduler() { return scheduler_; }
  size_t num_client_requests() const { return outputs_.num_requests(); }
  EngineMetrics metrics() const;
  // Called once a step's tokens are counted, before its outputs reach the request streams, so a
  // client that reads /metrics after its response sees that response counted.
  void set_on_step_counted(std::function<void()> hook) { on_step_counted_ = std::move(hook); }

 private:
  void fail_requests(const std::vector<std::string>& request_ids, const std::string& message);
  void fail_step(const SchedulerOutput& scheduled, const std::exception& e);
  void count_iteration_tokens(const SchedulerOutput& scheduled);
  // The step's result into the scheduler and the request streams.
  void process_result(const SchedulerOutput& scheduled, ModelRunnerOutput& result);
  bool step_async();
  void process_in_flight();  // async scheduling: collect the step in flight and process it
  std::vector<std::string> child_ids(const std::string& request_id, int n) const;

  EngineCoreConfig config_;
  ModelExecutor& executor_;
  const Tokenizer& tokenizer_;
  Scheduler scheduler_;
  OutputProcessor outputs_;
  uint64_t arrival_seq_ = 0;
  uint64_t unseeded_counter_ = 0;
  std::vector<int64_t> iteration_tokens_buckets_;  // EngineMetrics::iteration_tokens_buckets
  int64_t iteration_tokens_sum_ = 0;
  int64_t spec_depth_steps_ = 0;  // steps whose result carried a speculative depth
  int64_t spec_depth_sum_ = 0;
  int64_t spec_steps_launched_ahead_ = 0;  // steps whose proposer work was launched ahead
  std::optional<SchedulerOutput> in_flight_;  // async scheduling: submitted, result not processed
  // Compiles structured-output constraints; validate() (any thread) uses it too.
  std::unique_ptr<StructuredOutputManager> structured_outputs_;
  std::function<void()> on_step_counted_;
};

}  // namespace specula
