// Async scheduling against the synchronous engine: one workload, run with --async-scheduling on
// and off through LLMEngine::create, and the comparison of the two (async_scheduling_test.cc on
// the CPU, cuda_async_scheduling_test.cc on the device).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "app/create_engine.h"
#include "engine/llm_engine.h"
#include "test_paths.h"
#include "unit/app/mtp_test_util.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula::testing {

namespace fs = std::filesystem;


inline fs::path tiny() { return models_dir() / "specula-tiny"; }
inline fs::path tiny_draft() { return models_dir() / "specula-tiny-draft"; }

struct Workload {
  int num_requests = 8;
  int concurrency = 8;        // max_num_seqs: every request is queued before the loop starts
  bool sampled = false;       // seeded temperature 1 (else greedy)
  int num_blocks = 0;         // > 0: a KV cache this small (preemption)
  // eos and stop strings on (else every request ends on max_tokens). A request they end is still
  // in the step async scheduling has in flight, so that step's batch differs from the
  // synchronous one by it. The CPU backend's GEMMs are not batch invariant in the last bits, and
  // a draft model sampled at temperature 1 leaves residual distributions max(0, p - q) of nearly
  // equal p and q, where those bits can move a draw to the neighbouring token: measured once in
  // 16 requests. Sampled drafts are compared on workloads of length stops; deterministic drafts
  // (greedy, n-gram) on everything.
  bool unpredictable_stops = true;
  // Async: some steps' drafts were launched before the host read their verification.
  bool expect_launched_ahead = false;
};

struct ChoiceResult {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  bool operator==(const ChoiceResult&) const = default;
};

struct Outcome {
  std::map<std::string, std::map<int, ChoiceResult>> requests;
  EngineMetrics metrics;
};

inline SamplingParams params_for(int i, const Workload& w) {
  SamplingParams p;
  p.temperature = w.sampled ? 1.0f : 0.0f;
  p.seed = 1000 + i;
  p.max_tokens = 12 + (i * 7) % 29;
  switch (i % 6) {
    case 1:  // penalties see the drafts before each verified row
      p.repetition_penalty = 1.3f;
      p.frequency_penalty = 0.4f;
      p.presence_penalty = 0.2f;
      break;
    case 2:  // two sequences from one prompt
      p.n = 2;
      break;
    case 3:  // stop strings end the request a step late under async scheduling
      if (w.unpredictable_stops) p.stop = {"e ", "."};
      break;
    case 4:  // ends inside a draft of k = 3 or 4
      p.max_tokens = 6;
      break;
    default:
      break;
  }
  p.ignore_eos = !w.unpredictable_stops || i % 5 != 0;
  return p;
}

// Prompts: the reference prompts, some repeated whole (prefix-cache hits), some cut short, some
// two of them end to end (several chunks).
inline std::vector<int32_t> prompt_for(int i, const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<int32_t> p = prompts[static_cast<size_t>(i) % prompts.size()];
  if (i % 7 == 5) p.insert(p.end(), prompts.back().begin(), prompts.back().end());
  const int cut = i % 3 == 0 ? 0 : (i % 11) + 1;
  p.resize(p.size() - static_cast<size_t>(cut));
  return p;
}

inline EngineMetrics settled_metrics(LLMEngine& engine) {
  EngineMetrics m = engine.metrics();
  for (int i = 0; i < 6000 && m.num_requests_running + m.num_requests_waiting > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = engine.metrics();
  }
  return m;
}

inline void collect(RequestStream& stream, std::map<int, ChoiceResult>& choices) {
  RequestOutput o;
  bool finished = false;
  while (!finished && stream.pop(&o, std::chrono::seconds(120))) {
    ASSERT_FALSE(o.error.has_value()) << *o.error;
    for (const ChoiceDelta& d : o.choices) {
      ChoiceResult& c = choices[d.index];
      ASSERT_EQ(c.finish, FinishReason::kNone) << "output after choice " << d.index << " finished";
      c.tokens.insert(c.tokens.end(), d.token_ids.begin(), d.token_ids.end());
      c.text += d.text;
      c.finish = d.finish_reason;
    }
    finished = o.finished;
  }
  ASSERT_TRUE(finished) << "the request did not finish";
}

// make_speculator: the engine's speculator instead of the one ec.speculative_config describes.
inline Outcome run(EngineConfig ec, bool async, const Workload& w, const std::vector<std::vector<int32_t>>& prompts,
                   const SpeculatorFactory& make_speculator = {}) {
  ec.async_scheduling = async;
  ec.max_num_seqs = w.concurrency;
  ec.max_model_len = 256;
  if (w.num_blocks > 0) ec.num_gpu_blocks_override = w.num_blocks;
  auto engine = make_speculator ? LLMEngine::create(ec, make_speculator) : create_engine(ec);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < w.num_requests; ++i)
    streams.push_back(engine->add_request(NewRequest{"r" + std::to_string(i), prompt_for(i, prompts), params_for(i, w)}));
  engine->start();  // after every request is queued: the same batches in both runs
  Outcome out;
  for (int i = 0; i < w.num_requests; ++i) collect(*streams[static_cast<size_t>(i)], out.requests["r" + std::to_string(i)]);
  out.metrics = settled_metrics(*engine);
  EXPECT_EQ(out.metrics.kv_cache_usage, 0.0) << "blocks still held after every request finished";
  engine->shutdown();
  return out;
}

inline void expect_same(const EngineConfig& ec, const Workload& w, const std::vector<std::vector<int32_t>>& prompts,
                        bool expect_drafts = true, const SpeculatorFactory& make_speculator = {}) {
  const Outcome sync = run(ec, false, w, prompts, make_speculator);
  const Outcome async = run(ec, true, w, prompts, make_speculator);
  ASSERT_EQ(sync.requests.size(), async.requests.size());
  for (const auto& [id, choices] : sync.requests) {
    const auto& other = async.requests.at(id);
    ASSERT_EQ(choices.size(), other.size()) << id;
    for (const auto& [index, c] : choices) {
      const ChoiceResult& a = other.at(index);
      EXPECT_EQ(c.tokens, a.tokens) << id << " choice " << index;
      EXPECT_EQ(c.text, a.text) << id << " choice " << index;
      EXPECT_EQ(c.finish, a.finish) << id << " choice " << index;
    }
  }
  const EngineMetrics& s = sync.metrics;
  const EngineMetrics& a = async.metrics;
  if (expect_drafts) {
    EXPECT_GT(s.spec_num_draft_tokens, 0);
  }
  EXPECT_EQ(s.spec_num_drafts, a.spec_num_drafts);
  EXPECT_EQ(s.spec_num_draft_tokens, a.spec_num_draft_tokens);
  EXPECT_EQ(s.spec_num_accepted_tokens, a.spec_num_accepted_tokens);
  EXPECT_EQ(s.spec_accepted_per_pos, a.spec_accepted_per_pos);
  EXPECT_EQ(s.spec_steps_launched_ahead, 0);
  if (w.expect_launched_ahead) EXPECT_GT(a.spec_steps_launched_ahead, 0);
  EXPECT_EQ(s.generation_tokens_total, a.generation_tokens_total);
  EXPECT_EQ(s.prompt_tokens_total, a.prompt_tokens_total);
  EXPECT_EQ(s.request_success_total, a.request_success_total);
  if (w.num_blocks > 0) EXPECT_GT(s.num_preemptions + a.num_preemptions, 0) << "the small cache never preempted";
}

inline EngineConfig tiny_config(const std::string& spec, const std::string& device = "cpu") {
  EngineConfig ec;
  ec.model = tiny().string();
  ec.device = device;
  if (device != "cpu") {
    // A fixed small cache: the memory plan would take 90% of the GPU per engine.
    ec.num_gpu_blocks_override = 1024;
    // bf16 GEMMs and padded graphs are not batch invariant: the same request's logits move in the
    // last bits with the batch it shares, and greedy near-ties flip. Async scheduling registers a
    // prefix block one step later (its last token is a placeholder when the block is scheduled),
    // which changes later requests' prefill chunks; on the device the comparison runs without the
    // prefix cache (the CPU suite covers it).
    ec.enable_prefix_caching = false;
  }
  ec.cpu_threads = 2;
  // Prompts of ~50-110 tokens are chunked at the step's budget beside decodes. The budget covers
  // every decode with its drafts: where it does not, which drafts are cut depends on which
  // requests a step holds, and async scheduling holds a request that stops on a token or a stop
  // string one step longer (the one thing the two modes may schedule differently).
  ec.max_num_batched_tokens = 384;
  ec.speculative_config = spec;
  return ec;
}

inline std::string draft_spec(int k) {
  return R"({"method": "draft_model", "model": ")" + tiny_draft().string() + R"(", "num_speculative_tokens": )" +
         std::to_string(k) + R"(, "adaptive": false})";
}
// The same with the adaptive depth (its idle steps run as plain ones).
inline std::string adaptive_draft_spec(int k) {
  return R"({"method": "draft_model", "model": ")" + tiny_draft().string() + R"(", "num_speculative_tokens": )" +
         std::to_string(k) + R"(, "adaptive": true})";
}
// The trained EAGLE-3 head of specula-tiny (models/specula-tiny-eagle3).
inline std::string eagle3_spec(int k, bool adaptive = false) {
  return R"({"method": "eagle3", "model": ")" + (models_dir() / "specula-tiny-eagle3").string() +
         R"(", "num_speculative_tokens": )" + std::to_string(k) + R"(, "adaptive": )" + (adaptive ? "true" : "false") +
         "}";
}
// The draft model split over `ranks` tensor-parallel ranks, as the target must be.
inline std::string split_draft_spec(int k, int ranks) {
  std::string spec = draft_spec(k);
  spec.pop_back();
  return spec + R"(, "draft_tensor_parallel_size": )" + std::to_string(ranks) + "}";
}
inline std::string ngram_spec(int k) {
  return R"({"method": "ngram", "num_speculative_tokens": )" + std::to_string(k) +
         R"(, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "adaptive": false})";
}

inline std::vector<std::vector<int32_t>> tiny_prompts() {
  return read_greedy_reference(fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors")
      .prompts;
}
inline std::vector<std::vector<int32_t>> moe_prompts() { return read_greedy_reference(moe_reference_file()).prompts; }


}  // namespace specula::testing
