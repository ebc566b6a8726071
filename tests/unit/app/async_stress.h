// A stress workload for async scheduling (async_scheduling_test.cc on the CPU,
// cuda_async_scheduling_test.cc on the device, where tools/gpu runs it under compute-sanitizer):
// requests arrive at random moments with random lengths, sampling, n and prompts (prefix-cache
// hits, several chunks), so every step's batch differs, and a quarter of them are aborted by the
// client after a random number of tokens, while the engine keeps a step in flight. What must hold
// whatever the timing: no error, each choice ends once and nothing follows its end, no more
// tokens than max_tokens, every request not aborted ends on length, the tokens counted
// (generation_tokens_total) are exactly the tokens streamed, and at the end no request, block or
// proposer slot is left (a proposer that kept a finished request's slot fails a later one).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "unit/app/async_workload.h"

namespace specula::testing {

struct StressWorkload {
  int num_requests = 200;
  int max_in_flight = 16;  // also max_num_seqs
  double abort_fraction = 0.25;
  uint32_t seed = 1;
};

struct StressOutcome {
  int finished = 0;            // requests that ended on their own (length)
  int aborted = 0;             // requests whose stream ended on the client's abort
  int64_t tokens_streamed = 0;
  EngineMetrics metrics;
};

inline StressOutcome run_stress(EngineConfig ec, const StressWorkload& w,
                                const std::vector<std::vector<int32_t>>& prompts) {
  ec.async_scheduling = true;
  ec.max_num_seqs = w.max_in_flight;
  ec.max_model_len = 512;  // the longest prompt (two end to end) plus 40 tokens
  auto engine = create_engine(ec);
  engine->start();
  std::mt19937 rng(w.seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  struct Live {
    std::string id;
    std::shared_ptr<RequestStream> stream;
    int max_tokens = 0;
    int abort_after = -1;  // tokens (all choices) after which the client aborts; -1: never
    bool abort_sent = false;
    std::map<int, int> tokens;              // per choice
    std::map<int, FinishReason> finish;     // per choice, once ended
  };
  StressOutcome out;
  std::vector<Live> live;
  int submitted = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  while ((submitted < w.num_requests || !live.empty()) && std::chrono::steady_clock::now() < deadline) {
    // Top up to a random number in flight, so batches grow and shrink.
    const int want = uniform(1, w.max_in_flight);
    while (submitted < w.num_requests && static_cast<int>(live.size()) < want) {
      SamplingParams p;
      p.temperature = uniform(0, 1) == 0 ? 0.0f : 1.0f;
      p.seed = 5000 + submitted;
      const int max_tokens = uniform(1, 40);
      p.max_tokens = max_tokens;
      p.ignore_eos = true;
      p.n = uniform(0, 9) == 0 ? 2 : 1;
      if (uniform(0, 4) == 0) p.repetition_penalty = 1.2f;
      Live l;
      l.id = "s" + std::to_string(submitted);
      l.max_tokens = max_tokens;
      if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) < w.abort_fraction)
        l.abort_after = uniform(0, max_tokens * p.n);
      l.stream = engine->add_request(NewRequest{l.id, prompt_for(uniform(0, 1000), prompts), p});
      live.push_back(std::move(l));
      ++submitted;
    }
    // Read what arrived; abort where the client decided to.
    for (size_t i = 0; i < live.size();) {
      Live& l = live[i];
      RequestOutput o;
      bool ended = false;
      while (!ended && l.stream->pop(&o, std::chrono::milliseconds(0))) {
        EXPECT_FALSE(o.error.has_value()) << l.id << ": " << *o.error;
        for (const ChoiceDelta& d : o.choices) {
          EXPECT_EQ(l.finish.count(d.index), 0u) << l.id << " choice " << d.index << ": output after its end";
          l.tokens[d.index] += static_cast<int>(d.token_ids.size());
          out.tokens_streamed += static_cast<int64_t>(d.token_ids.size());
          if (d.finish_reason != FinishReason::kNone) l.finish[d.index] = d.finish_reason;
        }
        ended = o.finished;
      }
      int total = 0;
      for (const auto& [index, n] : l.tokens) {
        EXPECT_LE(n, l.max_tokens) << l.id << " choice " << index;
        total += n;
      }
      if (!ended && l.abort_after >= 0 && !l.abort_sent && total >= l.abort_after) {
        engine->abort(l.id);
        l.abort_sent = true;
      }
      if (!ended) {
        ++i;
        continue;
      }
      bool aborted = false;
      for (const auto& [index, reason] : l.finish) {
        aborted = aborted || reason == FinishReason::kAbort;
        if (reason == FinishReason::kAbort) {
          EXPECT_TRUE(l.abort_sent) << l.id << " choice " << index << " aborted without an abort";
        } else {
          EXPECT_EQ(reason, FinishReason::kLength) << l.id << " choice " << index;
          EXPECT_EQ(l.tokens[index], l.max_tokens) << l.id << " choice " << index;
        }
      }
      ++(aborted ? out.aborted : out.finished);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(uniform(0, 2000)));
  }
  EXPECT_TRUE(live.empty()) << live.size() << " requests never ended";
  out.metrics = settled_metrics(*engine);
  engine->shutdown();
  return out;
}

// What the stress runs under: no speculation and every method, pinned and with the adaptive
// depth (whose idle steps run as plain ones, and whose hidden-state proposers are fed and probed).
// MTP runs specula-tiny-moe where its weights are present.
struct StressConfig {
  std::string name;
  EngineConfig engine;
  std::vector<std::vector<int32_t>> prompts;
};

inline std::vector<StressConfig> stress_configs(const std::string& device) {
  std::vector<StressConfig> configs;
  for (const auto& [name, spec] : std::vector<std::pair<std::string, std::string>>{
           {"no speculation", ""},
           {"draft_model k=3", draft_spec(3)},
           {"draft_model adaptive k=3", adaptive_draft_spec(3)},
           {"ngram k=4", ngram_spec(4)},
           {"eagle3 k=3", eagle3_spec(3)},
           {"eagle3 adaptive k=5", eagle3_spec(5, /*adaptive=*/true)}})
    configs.push_back({name, tiny_config(spec, device), tiny_prompts()});
  if (have_moe()) {
    EngineConfig ec = moe_engine_config(mtp_spec(3, /*adaptive=*/true));
    ec.device = device;
    if (device != "cpu") ec.num_gpu_blocks_override = 1024;
    configs.push_back({"mtp adaptive k=3", ec, moe_prompts()});
  }
  return configs;
}

// The checks every stress run shares, on its outcome.
inline void expect_stress_invariants(const StressOutcome& o, const StressWorkload& w) {
  EXPECT_EQ(o.finished + o.aborted, w.num_requests);
  EXPECT_GT(o.aborted, 0);
  EXPECT_GT(o.finished, 0);
  EXPECT_EQ(o.metrics.generation_tokens_total, o.tokens_streamed) << "usage counts tokens never streamed";
  EXPECT_EQ(o.metrics.num_requests_running + o.metrics.num_requests_waiting, 0);
  EXPECT_EQ(o.metrics.kv_cache_usage, 0.0) << "blocks still held after every request ended";
}

}  // namespace specula::testing
