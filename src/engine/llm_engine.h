// LLMEngine: owns the model, tokenizer, scheduler and the engine loop thread. Construction loads
// everything (weights, KV cache sizing); start() launches the loop.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/api.h"
#include "engine/speculator.h"
#include "model/config.h"
#include "sampling/rejection_sampler.h"

namespace specula {

class Tokenizer;

struct EngineConfig {
  std::string model;                 // checkpoint folder
  std::string tokenizer;             // defaults to `model`
  std::string load_format = "auto";  // auto | safetensors | dummy
  std::string device = "auto";       // auto | cuda | cpu
  uint64_t seed = 0;
  int max_model_len = 0;             // 0: the model's max_position_embeddings
  int max_num_seqs = 256;
  int max_num_batched_tokens = 0;    // 0: chosen from max_model_len (chunked prefill on)
  int block_size = 16;
  bool enable_prefix_caching = true;
  double gpu_memory_utilization = 0.9;
  size_t cpu_kv_cache_bytes = 0;     // CPU backend KV cache size; 0: a default that fits the batch
  std::optional<int> num_gpu_blocks_override;
  bool enforce_eager = false;        // no CUDA graphs
  int cpu_threads = 0;               // 0: all cores
  // JSON, as vLLM's --speculative-config ("" = off); app/create_engine.h turns it into the
  // speculator factory that LLMEngine::create takes.
  std::string speculative_config;
  // No tokenizer (vLLM's --skip-tokenizer-init): prompts are token ids and outputs carry no text.
  // Benchmarks of checkpoints shipped without tokenizer files use it.
  bool skip_tokenizer_init = false;
  // DeepSeek MoE: shared-expert replicas fused into the routed experts; 0 = off, -1 = auto (1 on
  // CUDA for models with shared experts, 0 on the CPU; model/shared_expert_fusion.h).
  int shared_expert_fusion = -1;
  // vLLM's flags: --dtype (auto: the backend's compute type), --kv-cache-dtype (auto only for
  // now), -tp/-pp (1 until tensor parallelism lands), --no-enable-chunked-prefill (a step's
  // budget covers a whole max_model_len prompt), --disable-log-stats.
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  // --calculate-kv-scales: an fp8 cache's scales from a batch of random tokens at startup
  // (engine/kv_cache_calibration.h) instead of the checkpoint's or 1.0.
  bool calculate_kv_scales = false;
  // --quantization: "" (as the checkpoint says) or "fp8" (model/weight_quantization.h).
  std::string quantization;
  int tensor_parallel_size = 1;
  // Small all-reduces between GPUs as one peer-to-peer kernel (off: vLLM's --disable-custom-all-reduce).
  bool custom_all_reduce = true;
  int pipeline_parallel_size = 1;
  bool enable_chunked_prefill = true;
  bool log_stats = true;
  // --async-scheduling / --no-async-scheduling: one engine step in flight while the host plans the
  // next; unset: the engine's default (LLMEngine::create logs which and why).
  std::optional<bool> async_scheduling;
};

// Counters and gauges for /metrics and the periodic stats line (vLLM's names in comments).
struct EngineMetrics {
  int64_t num_requests_running = 0;        // vllm:num_requests_running
  int64_t num_requests_waiting = 0;        // vllm:num_requests_waiting
  double kv_cache_usage = 0.0;             // vllm:kv_cache_usage_perc (0..1)
  int64_t prompt_tokens_total = 0;         // vllm:prompt_tokens_total
  int64_t generation_tokens_total = 0;     // vllm:generation_tokens_total
  int64_t prefix_cache_queries = 0;        // vllm:prefix_cache_queries (tokens)
  int64_t prefix_cache_hits = 0;           // vllm:prefix_cache_hits (tokens)
  int64_t num_preemptions = 0;             // vllm:num_preemptions
  int64_t request_success_total = 0;       // vllm:request_success
  int64_t spec_num_drafts = 0;             // vllm:spec_decode_num_drafts
  int64_t spec_num_draft_tokens = 0;       // vllm:spec_decode_num_draft_tokens
  int64_t spec_num_accepted_tokens = 0;    // vllm:spec_decode_num_accepted_tokens
  std::vector<int64_t> spec_accepted_per_pos;  // vllm:spec_decode_num_accepted_tokens_per_pos
  int64_t spec_num_speculative_tokens = 0; // k of --speculative-config (0: speculation off)
  bool spec_adaptive = false;              // the depth adapts per step (0..k)
  int64_t spec_depth_steps = 0;            // steps that chose a depth
  int64_t spec_depth_sum = 0;              // sum of the depths chosen (mean depth = sum / steps)
  int64_t spec_steps_launched_ahead = 0;   // steps whose proposer work was launched before the host
                                           // read their results (launch-ahead, catch-up ahead)
  // vllm:cache_config_info's labels
  int64_t num_gpu_blocks = 0;
  int64_t block_size = 0;
  std::string cache_dtype = "auto";
  bool enable_prefix_caching = true;
  double gpu_memory_utilization = 0.0;
  // vllm:iteration_tokens_total: tokens scheduled per engine step, counts per bucket of
  // kIterationTokenBuckets (non-cumulative; the last entry counts the steps above the last bound).
  std::vector<int64_t> iteration_tokens_buckets;
  int64_t iteration_tokens_sum = 0;
};

// vLLM's bucket bounds of vllm:iteration_tokens_total.
inline constexpr double kIterationTokenBuckets[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

class LLMEngine {
 public:
  // Loads config, tokenizer, weights and sizes the KV cache. Throws specula::Error with one clear
  // line on any failure. make_speculator (null: no speculative decoding) builds the speculator
  // once the target is loaded; app/create_engine.h makes it from config.speculative_config.
  // verifier (null: the backend's, on the device where it samples there) is the rejection sampler
  // drafts are verified with; the lossless tests pass broken ones that their statistic must catch.
  static std::unique_ptr<LLMEngine> create(const EngineConfig& config, const SpeculatorFactory& make_speculator = {},
                                           std::unique_ptr<RejectionSampler> verifier = nullptr);
  virtual ~LLMEngine() = default;

  virtual const ModelConfig& model_config() const = 0;
  virtual const GenerationConfig& generation_config() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  virtual int max_model_len() const = 0;
  // Whether a step stays in flight while the next is planned (the flag, else the default chosen).
  virtual bool async_scheduling() const = 0;

  virtual void start() = 0;     // launches the engine loop thread
  virtual void shutdown() = 0;  // aborts everything in flight, joins the loop

  // Thread-safe. Validates (params, prompt length vs max_model_len: specula::Error naming both
  // numbers) and queues the request; outputs arrive on the returned stream.
  virtual std::shared_ptr<RequestStream> add_request(NewRequest request) = 0;
  // Thread-safe; unknown or finished ids are ignored. Frees the request's KV blocks.
  virtual void abort(const std::string& request_id) = 0;
  virtual EngineMetrics metrics() const = 0;
};

}  // namespace specula
