// LLMEngine::create: config -> tokenizer -> backend -> weights -> model -> KV cache -> engine.
#include "engine/llm_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>

#include "backend/backend.h"
#include "core/error.h"
#include "core/logging.h"
#include "sampling/device_sampler.h"
#include "engine/async_scheduling_default.h"
#include "engine/kv_cache_calibration.h"
#include "engine/kv_cache_dtype.h"
#include "engine/kv_cache_sizing.h"
#include "engine/load_progress.h"
#include "engine/memory_plan.h"
#include "engine/null_tokenizer.h"
#include "engine/step_watchdog.h"
#include "engine/threaded_engine.h"
#include "model/model.h"
#include "model/shared_expert_fusion.h"
#include "model/weight_source.h"
#include "sampling/device_rejection_sampler.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

// vLLM's defaults with chunked prefill: 8192 tokens per step on a Hopper-class GPU keeps the GPU
// busy; on the CPU a smaller step (2048) bounds how long decodes of running requests wait behind a
// long prefill chunk.
constexpr int kDefaultBatchedTokensCuda = 8192;
constexpr int kDefaultBatchedTokensCpu = 2048;

std::unique_ptr<Backend> make_backend(const EngineConfig& config) {
  if (config.device == "cpu") return make_cpu_backend(config.cpu_threads);
  if (config.device == "cuda") return make_cuda_backend(0);
  SPECULA_CHECK(config.device == "auto", "--device must be auto, cuda or cpu, got '{}'", config.device);
  return cuda_available() ? make_cuda_backend(0) : make_cpu_backend(config.cpu_threads);
}

std::unique_ptr<WeightSource> open_weights(const EngineConfig& config, const ModelConfig& mc) {
  if (config.load_format == "dummy") return make_dummy_weight_source(mc, config.seed);
  SPECULA_CHECK(config.load_format == "auto" || config.load_format == "safetensors",
                "--load-format must be auto, safetensors or dummy, got '{}'", config.load_format);
  return open_safetensors_checkpoint(config.model);
}

// eos ids: the tokenizer's first, then generation_config's (else config.json's) others.
std::vector<int32_t> eos_token_ids(const Tokenizer& tok, const GenerationConfig& gc, const ModelConfig& mc) {
  std::vector<int32_t> ids;
  auto add = [&](int64_t id) {
    if (std::find(ids.begin(), ids.end(), static_cast<int32_t>(id)) == ids.end()) ids.push_back(static_cast<int32_t>(id));
  };
  if (auto eos = tok.eos_token_id()) add(*eos);
  for (int64_t id : gc.eos_token_ids.empty() ? mc.eos_token_ids : gc.eos_token_ids) add(id);
  return ids;
}

// --dtype names the backend's compute type or auto; -pp is 1; -tp splits the
// model over that many backends of the device's kind (model/tensor_parallel_model.h).
void check_parallel_and_types(const EngineConfig& config, const Backend& backend) {
  SPECULA_CHECK(config.tensor_parallel_size >= 1, "--tensor-parallel-size must be positive, got {}",
                config.tensor_parallel_size);
  if (backend.device() == Device::kCUDA) {
    const int gpus = cuda_device_count();
    SPECULA_CHECK(config.tensor_parallel_size <= gpus,
                  "--tensor-parallel-size {}: only {} GPU{} visible (one rank per GPU)", config.tensor_parallel_size,
                  gpus, gpus == 1 ? " is" : "s are");
  }
  SPECULA_CHECK(config.pipeline_parallel_size == 1,
                "--pipeline-parallel-size {}: pipeline parallelism is not supported", config.pipeline_parallel_size);
  const DType compute = backend.compute_dtype();
  auto type_of = [](const std::string& name) -> std::optional<DType> {
    if (name == "half" || name == "float16") return DType::kF16;
    if (name == "bfloat16") return DType::kBF16;
    if (name == "float" || name == "float32") return DType::kF32;
    return std::nullopt;
  };
  if (config.dtype != "auto") {
    const std::optional<DType> want = type_of(config.dtype);
    SPECULA_CHECK(want.has_value(), "--dtype {}: expected auto, half, float16, bfloat16, float or float32", config.dtype);
    SPECULA_CHECK(*want == compute, "--dtype {}: the {} backend computes in {} (use auto or that type)", config.dtype,
                  backend.name(), dtype_name(compute));
  }
}

// An fp8 cache's scales as --calculate-kv-scales, the checkpoint or the default say (empty: the
// runner takes the checkpoint's, or 1.0), with vLLM's log lines.
std::vector<KVCacheScales> fp8_kv_cache_scales(const EngineConfig& config, DType kv_dtype, Model& model,
                                               Backend& backend, int max_step_tokens) {
  if (kv_dtype != DType::kF8E4M3) {
    if (config.calculate_kv_scales) LOG_WARN("--calculate-kv-scales has no effect without --kv-cache-dtype fp8");
    return {};
  }
  LOG_INFO("Using fp8 data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. "
           "Meanwhile, it may cause accuracy drop without a proper scaling factor.");
  if (config.calculate_kv_scales) {
    const int tokens = std::clamp(max_step_tokens, 1, 512);
    std::vector<KVCacheScales> scales = calibrate_kv_cache_scales(
        model, backend, calibration_tokens(model.config().vocab_size, tokens, config.seed), config.block_size);
    auto [k_min, k_max] = std::minmax_element(scales.begin(), scales.end(), [](auto& a, auto& b) { return a.k < b.k; });
    auto [v_min, v_max] = std::minmax_element(scales.begin(), scales.end(), [](auto& a, auto& b) { return a.v < b.v; });
    LOG_INFO("Calculated KV cache scales from {} random tokens: k_scale {:.4g}..{:.4g}, v_scale {:.4g}..{:.4g}", tokens,
             k_min->k, k_max->k, v_min->v, v_max->v);
    return scales;
  }
  if (model.kv_cache_scales().empty()) {
    LOG_WARN("Using KV cache scaling factor 1.0 for fp8_e4m3. This may cause accuracy issues. Please make sure "
             "k/v_scale scaling factors are available in the fp8 checkpoint.");
  } else {
    LOG_INFO("Using the checkpoint's KV cache scaling factors (self_attn.k_scale / v_scale) for fp8_e4m3.");
  }
  return {};
}

}  // namespace

std::unique_ptr<LLMEngine> LLMEngine::create(const EngineConfig& config, const SpeculatorFactory& make_speculator,
                                             std::unique_ptr<RejectionSampler> verifier) {
  SPECULA_CHECK(!config.model.empty(), "no model given");
  SPECULA_CHECK(config.speculative_config.empty() || make_speculator,
                "--speculative-config given but no speculator factory: build the engine with create_engine "
                "(app/create_engine.h)");
  SPECULA_CHECK(config.block_size > 0, "--block-size must be positive, got {}", config.block_size);
  EngineComponents parts;
  parts.config = config;
  parts.step_timeout_seconds = StepWatchdog::timeout_from_env();  // a bad value fails before loading
  parts.model_config = load_model_config(config.model);
  parts.generation_config = load_generation_config(config.model);
  parts.tokenizer = config.skip_tokenizer_init
                        ? make_null_tokenizer(parts.model_config)
                        : Tokenizer::from_dir(config.tokenizer.empty() ? config.model : config.tokenizer);
  parts.backend = make_backend(config);
  check_parallel_and_types(config, *parts.backend);
  const DType compute_dtype = parts.backend->compute_dtype();
  const DType kv_dtype = kv_cache_dtype_of(config.kv_cache_dtype, compute_dtype);
  const ModelConfig& mc = parts.model_config;
  // --shared-expert-fusion -1 (auto) becomes a number here; an MTP proposer reads the same one.
  parts.config.shared_expert_fusion =
      resolve_shared_expert_fusion(config.shared_expert_fusion, mc, parts.backend->device());
  // Device memory before any weight: the memory plan measures what loading added.
  const std::optional<DeviceMemoryInfo> memory_before_weights = parts.backend->memory_info();

  // ---- weights -> model ----
  // Rank r of a CUDA model (the target, and a draft split like it) runs on GPU r; CPU ranks are
  // more CPU backends.
  const std::function<std::unique_ptr<Backend>(int)> make_rank_backend =
      [&config, on_gpu = parts.backend->device() == Device::kCUDA](int rank) {
        return on_gpu ? make_cuda_backend(rank) : make_backend(config);
      };
  {
    std::unique_ptr<WeightSource> weights = open_weights(config, mc);
    LOG_INFO("Loading {} ({}) on {}", weights->describe(), architecture_name(mc.arch), parts.backend->name());
    const auto t0 = std::chrono::steady_clock::now();
    LoadProgress progress(weights->names().size() * static_cast<size_t>(std::max(1, config.tensor_parallel_size)));
    weights->on_progress = [&](size_t tensors, size_t bytes) { progress.update(tensors, bytes); };
    ModelOptions options{parts.config.shared_expert_fusion, config.quantization};
    options.tensor_parallel_size = config.tensor_parallel_size;
    options.custom_all_reduce = config.custom_all_reduce;
    options.make_rank_backend = make_rank_backend;
    parts.model = create_model(mc, *weights, *parts.backend, options);
    progress.finish();
    LOG_INFO("Model loading took {:.2f} seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  check_kv_cache_dtype_fits(kv_dtype, compute_dtype, parts.model->kv_cache_spec(), config.kv_cache_dtype);

  // ---- limits ----
  const int derived_len = static_cast<int>(mc.max_position_embeddings);
  int max_model_len = config.max_model_len > 0 ? config.max_model_len : derived_len;
  SPECULA_CHECK(derived_len <= 0 || max_model_len <= derived_len,
                "User-specified max_model_len ({}) is greater than the derived max_model_len "
                "(max_position_embeddings={} in the model's config.json)",
                max_model_len, derived_len);
  SPECULA_CHECK(max_model_len > 0, "cannot derive max_model_len from {}: pass --max-model-len", config.model);
  const bool on_cuda = parts.backend->device() == Device::kCUDA;
  SPECULA_CHECK(config.max_num_seqs > 0, "--max-num-seqs must be positive, got {}", config.max_num_seqs);
  int batched = config.max_num_batched_tokens > 0
                          ? config.max_num_batched_tokens
                          : std::max(on_cuda ? kDefaultBatchedTokensCuda : kDefaultBatchedTokensCpu, config.max_num_seqs);
  SPECULA_CHECK(batched >= config.max_num_seqs,
                "max_num_batched_tokens ({}) must be greater than or equal to max_num_seqs ({})", batched,
                config.max_num_seqs);
  if (!config.enable_chunked_prefill) {
    // vLLM's rule: without chunking, a step must hold a whole max_model_len prompt.
    if (config.max_num_batched_tokens <= 0) batched = std::max(batched, max_model_len);
    SPECULA_CHECK(batched >= max_model_len,
                  "max_num_batched_tokens ({}) is smaller than max_model_len ({}). This effectively limits the "
                  "maximum sequence length to max_num_batched_tokens and makes the engine reject longer sequences. "
                  "Please increase max_num_batched_tokens or decrease max_model_len.", batched, max_model_len);
  }

  // ---- speculative decoding: the speculator (a draft model loads here) ----
  std::unique_ptr<Speculator> speculator;
  if (make_speculator) {
    SpeculatorContext ctx{config.model, config.load_format, config.seed, parts.config.shared_expert_fusion,
                          mc, *parts.model, *parts.tokenizer, *parts.backend, max_model_len, config.max_num_seqs,
                          batched, config.tensor_parallel_size, make_rank_backend, config.custom_all_reduce};
    speculator = make_speculator(ctx);
    SPECULA_CHECK(speculator->num_speculative_tokens() >= 1, "--speculative-config: num_speculative_tokens must be "
                  "at least 1, got {}", speculator->num_speculative_tokens());
  }

  // ---- sampler, then (on a device with a memory plan) the profile run that sizes the KV cache ----
  const int num_speculative_tokens = speculator ? speculator->num_speculative_tokens() : 0;
  const std::optional<DeviceMemoryInfo> memory_after_weights = parts.backend->memory_info();
  // Logits stay on the device where the backend can sample there; else the CPU sampler reads
  // them back.
  parts.sampler = make_sampler(*parts.backend, config.max_num_seqs * (1 + num_speculative_tokens), mc.vocab_size);
  std::optional<DeviceMemoryPlan> device_plan;
  MemoryPlanConfig mp;
  if (memory_before_weights && memory_after_weights && !config.num_gpu_blocks_override) {
    mp.max_num_batched_tokens = batched;
    mp.max_num_seqs = config.max_num_seqs;
    mp.max_model_len = max_model_len;
    mp.block_size = config.block_size;
    mp.num_speculative_tokens = num_speculative_tokens;
    mp.gpu_memory_utilization = config.gpu_memory_utilization;
    mp.reserve_bytes = graph_and_buffer_reserve(mp, parts.model->kv_cache_spec());
    device_plan =
        plan_device_memory(*parts.model, *parts.backend, *parts.sampler, mp, *memory_before_weights, *memory_after_weights);
  }

  // ---- KV cache ----
  // A draft cache shares the target's blocks, so a block costs both: size the cache by their
  // summed bytes per token (the target's in --kv-cache-dtype, a draft's in the compute type).
  size_t kv_bytes_per_token = parts.model->kv_cache_spec().bytes_per_token(kv_dtype);
  if (speculator && speculator->kv_cache_spec().num_layers > 0) {
    kv_bytes_per_token += speculator->kv_cache_spec().bytes_per_token(compute_dtype);
  }
  std::optional<size_t> kv_budget;
  if (device_plan) {  // one max_model_len sequence must fit, or the error names every size
    check_kv_budget_fits(*device_plan, mp, kv_bytes_per_token);
    kv_budget = device_plan->kv_budget;
  }
  const KVCachePlan plan = plan_kv_cache(config, kv_bytes_per_token, parts.backend->device(), max_model_len,
                                         config.max_num_seqs, kv_budget);
  LOG_INFO("KV cache: {} blocks of {} tokens ({} tokens, {:.2f} GiB, {}, {}); maximum concurrency for {} tokens "
           "per request: {:.2f}x",
           plan.num_blocks, config.block_size, static_cast<int64_t>(plan.num_blocks) * config.block_size,
           static_cast<double>(plan.bytes) / (1 << 30), dtype_name(kv_dtype), plan.source, max_model_len,
           static_cast<double>(plan.num_blocks) * config.block_size / max_model_len);
  if (on_cuda) {  // vLLM's lines
    LOG_INFO("GPU KV cache size: {} tokens", static_cast<int64_t>(plan.num_blocks) * config.block_size);
    LOG_INFO("Maximum concurrency for {} tokens per request: {:.2f}x", max_model_len,
             static_cast<double>(plan.num_blocks) * config.block_size / max_model_len);
  }

  EngineCoreConfig& cc = parts.core_config;
  cc.max_model_len = max_model_len;
  cc.max_num_seqs = config.max_num_seqs;
  cc.max_num_batched_tokens = batched;
  cc.block_size = config.block_size;
  cc.num_blocks = plan.num_blocks;
  cc.enable_prefix_caching = config.enable_prefix_caching;
  cc.cache_dtype = config.kv_cache_dtype;
  cc.gpu_memory_utilization = config.gpu_memory_utilization;
  cc.enable_chunked_prefill = config.enable_chunked_prefill;
  cc.num_speculative_tokens = num_speculative_tokens;
  cc.spec_adaptive = speculator && speculator->adaptive();
  const AsyncSchedulingChoice async_choice = choose_async_scheduling(
      config.async_scheduling, {on_cuda, speculator != nullptr, speculator && speculator->leaves_drafts_on_device(),
                                config.tensor_parallel_size, config.enforce_eager});
  cc.async_scheduling = async_choice.on;
  LOG_INFO("Async scheduling: {}", async_choice.reason);
  cc.seed = config.seed;
  cc.vocab_size = mc.vocab_size;
  cc.eos_token_ids = eos_token_ids(*parts.tokenizer, parts.generation_config, mc);

  ModelRunnerConfig rc;
  rc.max_num_seqs = cc.max_num_seqs;
  rc.max_num_batched_tokens = cc.max_num_batched_tokens;
  rc.max_model_len = cc.max_model_len;
  rc.block_size = cc.block_size;
  rc.num_blocks = cc.num_blocks;
  rc.num_speculative_tokens = cc.num_speculative_tokens;
  rc.kv_cache_dtype = kv_dtype;
  // SPECULA_SHORT_DECODE_GRAPH_LEN=0 captures one set of decode graphs (to compare the two).
  if (const char* len = std::getenv("SPECULA_SHORT_DECODE_GRAPH_LEN")) rc.short_decode_graph_len = std::atoi(len);
  rc.kv_cache_scales =
      fp8_kv_cache_scales(config, kv_dtype, *parts.model, *parts.backend, std::min(batched, max_model_len));
  auto runner = std::make_unique<ModelRunner>(*parts.model, *parts.backend, *parts.sampler, rc);
  if (speculator) {
    speculator->allocate_kv_cache(cc.num_blocks, cc.block_size);
    parts.speculator = std::move(speculator);
    runner->set_speculator(parts.speculator.get());
    // Verification on the device where the backend samples there (the draft probabilities stay).
    if (!verifier)
      verifier = make_device_rejection_sampler(*parts.backend, cc.max_num_seqs * (1 + cc.num_speculative_tokens),
                                               mc.vocab_size);
    if (verifier) runner->set_rejection_sampler(std::move(verifier));
    LOG_INFO("Speculative decoding: {}", parts.speculator->describe());
  }
  if (on_cuda && !config.enforce_eager) {
    // CUDA graphs for decode steps of up to max_num_seqs sequences (vLLM caps captures at 512).
    const auto g0 = std::chrono::steady_clock::now();
    const std::optional<DeviceMemoryInfo> before = parts.backend->memory_info();
    const std::vector<int> sizes = PaddedGraphs::default_sizes(std::min(cc.max_num_seqs, 512));
    const size_t n = runner->capture_decode_graphs(sizes);
    // The proposer's draft steps after the target's: both carve their scratch from the arena the
    // target's largest graph sized (model_runner_graphs.cc says why sharing it is safe).
    const size_t n_draft = parts.speculator ? parts.speculator->capture_graphs(sizes) : 0;
    const std::optional<DeviceMemoryInfo> after = parts.backend->memory_info();
    const size_t taken = before && after && before->free > after->free ? before->free - after->free : 0;
    LOG_INFO("Graph capturing finished in {:.1f} secs, took {} ({} decode graphs, {} of them verification graphs; {} "
             "proposer graphs)",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count(), gib(taken), n,
             runner->num_verify_graphs(), n_draft);
  }
  parts.backend->start_serving();
  parts.executor = std::move(runner);
  LOG_INFO("Engine ready: max_model_len={}, max_num_seqs={}, max_num_batched_tokens={}, prefix caching {}, "
           "tensor_parallel_size={}",
           max_model_len, cc.max_num_seqs, batched, cc.enable_prefix_caching ? "on" : "off", config.tensor_parallel_size);
  return make_threaded_engine(std::move(parts));
}

}  // namespace specula
