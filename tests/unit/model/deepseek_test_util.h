// Shared by the DeepSeek forward tests: the transformers references committed beside each
// fixture checkpoint, and the ways the tests run a model over them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "forward_runner.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "unit/relative_error.h"

namespace specula::testing {

// reference.safetensors: per prompt i, prompt_i (I32 [T]), logits_i (F32 [T or P, V]) and
// greedy_i (I32 [N]); logits_pos_i (I32 [P]) when the logits cover only some positions.
struct DeepseekReference {
  std::vector<int32_t> prompt, greedy, logits_pos;
  std::vector<float> logits;
};

inline std::vector<DeepseekReference> load_deepseek_reference(const std::filesystem::path& file) {
  auto st = SafetensorsFile::open(file);
  auto read = [&](const std::string& name, DType dtype, auto* out) {
    const SafetensorsEntry* e = st->find(name);
    if (e == nullptr) return false;
    SPECULA_CHECK(e->dtype == dtype, "{}: {} has dtype {}", file.string(), name, e->dtype_name);
    out->resize(e->nbytes() / 4);
    std::memcpy(out->data(), st->data(*e), e->nbytes());
    return true;
  };
  std::vector<DeepseekReference> refs;
  for (int i = 0;; ++i) {
    DeepseekReference r;
    const std::string n = std::to_string(i);
    if (!read("prompt_" + n, DType::kI32, &r.prompt)) break;
    SPECULA_CHECK(read("logits_" + n, DType::kF32, &r.logits) && read("greedy_" + n, DType::kI32, &r.greedy),
                  "{}: prompt_{} lacks logits or greedy tokens", file.string(), i);
    read("logits_pos_" + n, DType::kI32, &r.logits_pos);
    refs.push_back(std::move(r));
  }
  return refs;
}

// Rows `rows` of a [T, V] logits matrix.
inline std::vector<float> select_rows(const std::vector<float>& all, int64_t v, const std::vector<int32_t>& rows) {
  std::vector<float> out;
  for (int32_t r : rows) out.insert(out.end(), all.begin() + r * v, all.begin() + (r + 1) * v);
  return out;
}

struct PromptRun {
  std::vector<float> prompt_logits;  // [T, V]: every prompt position
  std::vector<int32_t> greedy;       // greedy continuation, one token per decode step
  // Per layer, the largest |K| and |V| the cache holds at the end (CPU backends; else empty).
  std::vector<KVCacheScales> cache_amax;
};

// The KV cache a prompt runs over: its type (unset: the compute type) and, for fp8, per-layer
// scales (empty: 1.0).
struct PromptCache {
  std::optional<DType> dtype;
  std::vector<KVCacheScales> scales;
};

// One prompt alone: a single prefill (logits of every position), then greedy decode.
inline PromptRun run_prompt(Model& model, Backend& backend, const std::vector<int32_t>& prompt, size_t steps,
                            unsigned seed, const PromptCache& cache = {}) {
  const int64_t v = model.config().vocab_size;
  PagedRunner runner(model, backend, /*num_blocks=*/16, /*block_size=*/16, seed, cache.dtype);
  for (size_t l = 0; l < cache.scales.size(); ++l) {
    runner.kv()[l].k_scale = cache.scales[l].k;
    runner.kv()[l].v_scale = cache.scales[l].v;
  }
  runner.feed(0, prompt);
  PromptRun run;
  run.prompt_logits = runner.step({{0, static_cast<int64_t>(prompt.size()), true}})[0];
  std::vector<float> last(run.prompt_logits.end() - v, run.prompt_logits.end());
  for (size_t n = 0; n < steps; ++n) {
    run.greedy.push_back(argmax(last.data(), v));
    runner.feed(0, {run.greedy.back()});
    last = runner.step({{0, 1, false}})[0];
  }
  if (backend.device() != Device::kCPU) return run;
  for (const KVCacheLayer& layer : runner.kv()) {
    auto amax = [&](const Tensor& t, float scale) {
      float m = 0;
      for (float x : t.to_f32_vector()) m = std::max(m, std::fabs(x) * scale);
      return m;
    };
    run.cache_amax.push_back({amax(layer.k, layer.k_scale), amax(layer.v, layer.v_scale)});
  }
  return run;
}

// All prompts as the engine runs them: prefill in uneven chunks sharing batches (padding rows in
// some steps), then every sequence's greedy decode in one batch per step.
inline std::vector<PromptRun> run_schedule(Model& model, Backend& backend,
                                           const std::vector<std::vector<int32_t>>& prompts, size_t steps) {
  const int64_t v = model.config().vocab_size;
  const int n = static_cast<int>(prompts.size());
  PagedRunner runner(model, backend, /*num_blocks=*/48, /*block_size=*/16, /*seed=*/99);
  std::vector<PromptRun> runs(n);
  for (int s = 0; s < n; ++s) runner.feed(s, prompts[s]);
  const int64_t chunk_sizes[] = {5, 11, 8, 16, 3};
  for (int step = 0;; ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < n; ++s) {
      const int64_t left = runner.pending(s);
      if (left > 0) work.push_back({s, std::min(left, chunk_sizes[(step + s) % 5]), true});
    }
    if (work.empty()) break;
    auto out = runner.step(work, step % 2);
    for (size_t w = 0; w < work.size(); ++w) {
      auto& dst = runs[work[w].seq].prompt_logits;
      dst.insert(dst.end(), out[w].begin(), out[w].end());
    }
  }
  std::vector<std::vector<float>> last(n);
  for (int s = 0; s < n; ++s) last[s].assign(runs[s].prompt_logits.end() - v, runs[s].prompt_logits.end());
  for (size_t step = 0; step < steps; ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < n; ++s) {
      runs[s].greedy.push_back(argmax(last[s].data(), v));
      runner.feed(s, {runs[s].greedy.back()});
      work.push_back({s, 1, false});
    }
    auto out = runner.step(work, static_cast<int>(step % 3));
    for (size_t w = 0; w < work.size(); ++w) last[work[w].seq] = out[w];
  }
  return runs;
}

}  // namespace specula::testing
