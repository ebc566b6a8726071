#include "engine/memory_plan.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/error.h"
#include "core/logging.h"

namespace specula {
namespace {

Tensor upload_i32(Backend& backend, const std::vector<int32_t>& host, Shape shape = {}) {
  Tensor src = Tensor::from_i32(host, std::move(shape));
  Tensor dst = backend.empty(src.shape(), DType::kI32);
  backend.copy(src, dst);
  return dst;
}

// The profile step: `tokens` tokens over `seqs` sequences of near-equal length, the last
// (1 + num_speculative_tokens) tokens of each producing logits (the rows a step samples at most). Every
// block table entry names block 0 of a one-block cache and no K/V is written (slot -1): the
// point is the activations' footprint, not the values.
ForwardInput profile_input(Backend& backend, int tokens, int seqs, int block_size, int logits_per_seq) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens)), positions(ids.size()), qsl{0}, seq_lens, logits_idx;
  std::vector<int64_t> slots(ids.size(), -1);
  int t = 0, max_len = 0;
  for (int s = 0; s < seqs; ++s) {
    const int n = tokens / seqs + (s < tokens % seqs ? 1 : 0);
    for (int j = 0; j < n; ++j) {
      ids[t + j] = (t + j) % 1000;
      positions[t + j] = j;
    }
    for (int j = std::max(0, n - logits_per_seq); j < n; ++j) logits_idx.push_back(t + j);
    t += n;
    qsl.push_back(t);
    seq_lens.push_back(n);
    max_len = std::max(max_len, n);
  }
  const int width = (max_len + block_size - 1) / block_size;
  ForwardInput in;
  in.token_ids = upload_i32(backend, ids);
  in.positions = upload_i32(backend, positions);
  in.logits_indices = upload_i32(backend, logits_idx);
  AttentionMetadata& md = in.attn;
  md.num_seqs = seqs;
  md.num_tokens = tokens;
  md.max_query_len = max_len;
  md.max_seq_len = max_len;
  md.block_size = block_size;
  md.query_start_loc = upload_i32(backend, qsl);
  md.seq_lens = upload_i32(backend, seq_lens);
  md.block_tables = upload_i32(backend, std::vector<int32_t>(static_cast<size_t>(seqs) * width, 0), {seqs, width});
  Tensor slot_src = Tensor::from_i64(slots);
  md.slot_mapping = backend.empty(slot_src.shape(), DType::kI64);
  backend.copy(slot_src, md.slot_mapping);
  md.query_start_loc_host = qsl;
  md.seq_lens_host = seq_lens;
  return in;
}

size_t used_bytes(const DeviceMemoryInfo& m) { return m.total - m.free - std::min(m.cached, m.total - m.free); }

}  // namespace

size_t graph_and_buffer_reserve(const MemoryPlanConfig& c, const KVCacheSpec& kv_spec) {
  const size_t k = static_cast<size_t>(c.num_speculative_tokens);
  const size_t seqs = static_cast<size_t>(c.max_num_seqs), tokens = static_cast<size_t>(c.max_num_batched_tokens);
  const size_t width = (static_cast<size_t>(c.max_model_len) + k + c.block_size - 1) / c.block_size;
  const size_t tables = 2 * seqs * width * sizeof(int32_t);  // the step's block table + the graphs' static one
  const size_t inputs = tokens * (2 * sizeof(int32_t) + sizeof(int64_t)) + (2 * seqs + 1) * sizeof(int32_t) +
                        (tokens + seqs * (1 + k)) * sizeof(int32_t);
  const size_t rounding = 2 * static_cast<size_t>(kv_spec.num_layers) * (size_t{2} << 20);  // 2 MiB granules
  const size_t graphs = size_t{128} << 20;
  return tables + inputs + rounding + graphs;
}

std::string gib(size_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1ull << 30)); }

DeviceMemoryPlan plan_device_memory(Model& model, Backend& backend, Sampler& sampler, const MemoryPlanConfig& config,
                                    const DeviceMemoryInfo& before_weights, const DeviceMemoryInfo& after_weights) {
  const auto t0 = std::chrono::steady_clock::now();
  DeviceMemoryPlan plan;
  plan.total = after_weights.total;
  plan.weights = after_weights.allocated - std::min(after_weights.allocated, before_weights.allocated);

  // The largest step: max_num_batched_tokens tokens (no sequence beyond max_model_len).
  const int seqs = std::max(1, std::min(config.max_num_seqs, config.max_num_batched_tokens));
  const int tokens = static_cast<int>(
      std::min<int64_t>(config.max_num_batched_tokens, static_cast<int64_t>(seqs) * config.max_model_len));
  plan.profiled_tokens = tokens;
  {
    const KVCacheSpec spec = model.kv_cache_spec();
    const DType dt = backend.compute_dtype();
    std::vector<KVCacheLayer> kv(static_cast<size_t>(spec.num_layers));
    for (KVCacheLayer& layer : kv) {
      layer.k = backend.empty({1, config.block_size, spec.num_kv_heads, spec.head_dim}, dt);
      layer.v = backend.empty({1, config.block_size, spec.num_kv_heads, spec.v_head_dim}, dt);
      backend.zero(layer.k);
      if (layer.v.numel() > 0) backend.zero(layer.v);
    }
    const int logits_per_seq = std::min(1 + config.num_speculative_tokens, std::max(1, tokens / seqs));
    ForwardInput in = profile_input(backend, tokens, seqs, config.block_size, logits_per_seq);
    backend.reset_scratch();
    ForwardOutput out = model.forward(in, kv);
    // Sample every logits row (greedy: the device sampler's buffers exist from its creation).
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    std::vector<SamplingRow> rows(static_cast<size_t>(out.logits.size(0)));
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].logits_row = static_cast<int>(i);
      rows[i].params = &greedy;
    }
    sampler.sample(out.logits, rows);
    backend.synchronize();
  }
  backend.reset_scratch();  // the arena grows to hold the whole profiled step
  const std::optional<DeviceMemoryInfo> measured = backend.memory_info();
  SPECULA_CHECK(measured.has_value(), "memory plan: the {} backend cannot report its memory", backend.name());
  const DeviceMemoryInfo& after = *measured;
  plan.activations = after.allocated - std::min(after.allocated, after_weights.allocated);
  const size_t used = used_bytes(after);
  plan.other = used - std::min(used, after.allocated);
  plan.requested = static_cast<size_t>(config.gpu_memory_utilization * static_cast<double>(plan.total));
  plan.reserve = config.reserve_bytes;
  const size_t taken = used + plan.reserve;
  plan.kv_budget = plan.requested > taken ? plan.requested - taken : 0;
  plan.profile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  LOG_INFO("Memory profiling takes {:.2f} seconds: total GPU memory {}, gpu_memory_utilization {:.2f} -> {}; model "
           "weights take {}; activations (profiled at {} tokens) take {}; CUDA context and libraries take {}; "
           "reserved for graphs and buffers {}; the rest of the memory reserved for KV Cache is {}.",
           plan.profile_seconds, gib(plan.total), config.gpu_memory_utilization, gib(plan.requested),
           gib(plan.weights), tokens, gib(plan.activations), gib(plan.other), gib(plan.reserve),
           gib(plan.kv_budget));
  return plan;
}

void check_kv_budget_fits(const DeviceMemoryPlan& plan, const MemoryPlanConfig& config, size_t kv_bytes_per_token) {
  const size_t blocks = static_cast<size_t>((config.max_model_len + config.block_size - 1) / config.block_size);
  const size_t needed = blocks * static_cast<size_t>(config.block_size) * kv_bytes_per_token;
  SPECULA_CHECK(plan.kv_budget >= needed,
                "the model does not fit: weights {}, activations {} (profiled at {} tokens), CUDA context and "
                "libraries {}, graphs and buffers {}; --gpu-memory-utilization {:.2f} of the device's {} allows {}, "
                "which leaves {} for the KV cache, but one max_model_len sequence ({} tokens) needs {}. Increase "
                "--gpu-memory-utilization, or decrease --max-model-len or --max-num-batched-tokens.",
                gib(plan.weights), gib(plan.activations), plan.profiled_tokens, gib(plan.other), gib(plan.reserve),
                config.gpu_memory_utilization, gib(plan.total), gib(plan.requested), gib(plan.kv_budget),
                config.max_model_len, gib(needed));
}

}  // namespace specula
