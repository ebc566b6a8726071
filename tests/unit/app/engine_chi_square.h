// The engine-level lossless test shared by spec_embedded_test and mtp_engine_test: sampling through
// a whole engine (temperature 1, top_k 4, n = 16, three tokens: the first a plain sample, the
// second verified by the rejection sampler against the speculator's q), and Pearson's chi-square
// of the (first, second) pairs against the target's exact p1(y1) p2(y2 | y1).
//
// engine_with_verifier builds the engine with a rejection sampler of the test's choice: the
// negative controls swap in a broken one (unit/sampling/broken_samplers.h), which the same
// statistic must reject.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/llm_engine.h"
#include "model/config.h"
#include "mtp_test_util.h"
#include "sampling/rejection_sampler.h"
#include "sampling/sampling_math.h"
#include "spec_decode/speculative_config.h"
#include "spec_decode/speculator_factory.h"
#include "tokenizer/tokenizer.h"
#include "unit/sampling/broken_samplers.h"
#include "unit/sampling/chi_square.h"
#include "unit/spec_decode/model_logits.h"

namespace specula::testing {

// The broken verifiers of unit/sampling/broken_samplers.h, by name.
struct BrokenSampler {
  const char* name;
  std::function<std::unique_ptr<RejectionSampler>()> make;
};
inline std::vector<BrokenSampler> broken_samplers() {
  return {{"always accept", [] { return std::make_unique<AlwaysAccept>(); }},
          {"resample from p", [] { return std::make_unique<ResampleFromP>(); }}};
}

// The engine LLMEngine::create builds from `config` (config.speculative_config set), with
// `verifier` as its rejection sampler.
inline std::unique_ptr<LLMEngine> engine_with_verifier(const EngineConfig& config,
                                                       std::unique_ptr<RejectionSampler> verifier) {
  SpeculativeConfig spec = parse_speculative_config(config.speculative_config);
  resolve_speculative_config(spec, load_model_config(config.model), config.model);
  return LLMEngine::create(config, make_speculator_factory(spec), std::move(verifier));
}

// Temperature 1, top_k 4, n = 16; three tokens: after the first, one draft (max_tokens leaves room
// for no more).
inline SamplingParams chi_square_params() {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 4;
  p.max_tokens = 3;
  p.ignore_eos = true;
  p.n = 16;
  return p;
}

// The engine settings of the chi-square runs: every request at once, a fixed seed, and drafts
// drawn as `draft_sampling` says ("sampled": from q, verified against it, the stochastic path the
// broken samplers break; "argmax": deterministic drafts).
inline EngineConfig chi_square_engine_config(EngineConfig ec, const std::string& draft_sampling = "sampled") {
  ec.max_num_seqs = 128;
  ec.max_num_batched_tokens = 2048;
  ec.seed = 11;
  if (!ec.speculative_config.empty()) {
    nlohmann::json spec = nlohmann::json::parse(ec.speculative_config);
    if (spec.value("method", "") != "ngram") spec["draft_sampling"] = draft_sampling;
    ec.speculative_config = spec.dump();
  }
  return ec;
}

// The target's exact distributions: p1 after the prompt, p2[y1] after prompt + y1 (top-k, as the
// sampler shapes them; with `allowed`, restricted to the tokens it allows after the output so far,
// as a structured-output request's grammar mask does).
struct TargetPairs {
  std::vector<float> p1;
  std::map<int32_t, std::vector<float>> p2;
};

using AllowedTokens = std::function<std::vector<uint32_t>(const std::vector<int32_t>& output)>;

inline TargetPairs target_pairs(const std::filesystem::path& model_dir, const std::vector<int32_t>& prompt,
                                const SamplingParams& p, int cpu_threads, const AllowedTokens& allowed = {}) {
  auto backend = make_cpu_backend(cpu_threads);
  auto target = create_model(load_model_config(model_dir), *open_safetensors_checkpoint(model_dir), *backend);
  SamplingRow r0;
  r0.params = &p;
  r0.prompt_token_ids = prompt;
  std::vector<uint32_t> mask0;
  if (allowed) r0.allowed_token_mask = mask0 = allowed({});
  TargetPairs t;
  t.p1 = last_logits(*target, *backend, {prompt})[0];
  logits_to_probs(t.p1, r0);
  for (int32_t y = 0; y < static_cast<int32_t>(t.p1.size()); ++y) {
    if (t.p1[y] <= 0) continue;
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(y);
    t.p2[y] = last_logits(*target, *backend, {ctx})[0];
    SamplingRow r1 = r0;
    r1.output_token_ids = std::span<const int32_t>(&ctx.back(), 1);
    std::vector<uint32_t> mask1;
    if (allowed) r1.allowed_token_mask = mask1 = allowed({y});
    logits_to_probs(t.p2[y], r1);
  }
  return t;
}

struct EngineChiSquare {
  ChiSquareResult chi;
  int64_t samples = 0;  // requests * n
  int64_t seen = 0;     // samples whose pair the target's top-k allows
  EngineMetrics metrics;
};

// Starts `engine`, samples `requests` requests of `prompt` at once, shuts it down, and tests the
// (first, second) token pairs against `target`.
inline EngineChiSquare engine_chi_square(LLMEngine& engine, const TargetPairs& target,
                                         const std::vector<int32_t>& prompt, const SamplingParams& p, int requests) {
  engine.start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < requests; ++i) streams.push_back(engine.add_request(NewRequest{"s" + std::to_string(i), prompt, p}));
  std::map<std::pair<int32_t, int32_t>, int64_t> counts;
  for (auto& s : streams) {
    std::map<int, std::vector<int32_t>> choices;
    RequestOutput o;
    while (s->pop(&o, std::chrono::seconds(120))) {
      EXPECT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices)
        choices[d.index].insert(choices[d.index].end(), d.token_ids.begin(), d.token_ids.end());
      if (o.finished) break;
    }
    for (auto& [i, t] : choices) {
      EXPECT_EQ(t.size(), 3u);
      if (t.size() >= 2) counts[{t[0], t[1]}] += 1;
    }
  }
  EngineChiSquare r;
  r.metrics = settled(engine);
  engine.shutdown();
  r.samples = static_cast<int64_t>(requests) * p.n;
  std::vector<int64_t> observed;
  std::vector<double> expected;
  for (const auto& [y1, q] : target.p2) {
    for (int32_t y2 = 0; y2 < static_cast<int32_t>(q.size()); ++y2) {
      if (q[y2] <= 0) continue;
      auto it = counts.find({y1, y2});
      observed.push_back(it == counts.end() ? 0 : it->second);
      r.seen += observed.back();
      expected.push_back(static_cast<double>(target.p1[y1]) * q[y2]);
    }
  }
  // Pairs outside the target's top-k (possible only for a wrong sampler) count too, in a cell of
  // probability 0 (chi_square_test pools it with the smallest cell).
  observed.push_back(r.samples - r.seen);
  expected.push_back(0.0);
  r.chi = chi_square_test(observed, expected);
  return r;
}

}  // namespace specula::testing
