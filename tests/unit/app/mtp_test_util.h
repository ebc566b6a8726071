// Shared by the mtp_* tests: specula-tiny-moe through the whole engine (LLMEngine::create on the
// CPU), its transformers greedy reference, and small stream helpers.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "app/create_engine.h"
#include "engine/llm_engine.h"
#include "unit/spec_decode/reference_fixture.h"
#include "test_paths.h"

namespace specula::testing {

inline std::filesystem::path moe_dir() { return models_dir() / "specula-tiny-moe"; }
inline std::filesystem::path moe_reference_file() {
  return fixtures_dir() / "embedded" / "specula-tiny-moe" / "reference.safetensors";
}
inline bool have_moe() {
  return std::filesystem::exists(moe_dir() / "model.safetensors") && std::filesystem::exists(moe_reference_file());
}

inline EngineConfig moe_engine_config(const std::string& spec) {
  EngineConfig ec;
  ec.model = moe_dir().string();
  ec.device = "cpu";
  ec.cpu_threads = 2;
  ec.max_num_seqs = 8;
  ec.max_model_len = 512;
  ec.max_num_batched_tokens = 40;  // chunked prefill of the ~50-token prompts beside decodes
  ec.speculative_config = spec;
  return ec;
}

inline std::string mtp_spec(int k, bool adaptive = false) {
  return R"({"method": "mtp", "num_speculative_tokens": )" + std::to_string(k) +
         R"(, "adaptive": )" + (adaptive ? "true" : "false") + "}";
}

inline SamplingParams greedy_params(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  return p;
}

// Every token of choice 0 (or of all choices, concatenated per choice index) until finished.
inline std::vector<int32_t> collect_tokens(RequestStream& stream) {
  std::vector<int32_t> tokens;
  RequestOutput o;
  while (stream.pop(&o, std::chrono::seconds(120))) {
    EXPECT_FALSE(o.error.has_value()) << *o.error;
    for (const ChoiceDelta& d : o.choices) tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
    if (o.finished) break;
  }
  return tokens;
}

// Waits for the engine loop to publish the metrics of its last step.
inline EngineMetrics settled(LLMEngine& engine) {
  EngineMetrics m = engine.metrics();
  for (int i = 0; i < 6000 && m.num_requests_running + m.num_requests_waiting > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = engine.metrics();
  }
  return m;
}

// All requests at once; returns each one's tokens.
inline std::vector<std::vector<int32_t>> run_all(LLMEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                 const std::vector<SamplingParams>& params, const std::string& tag) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i)
    streams.push_back(engine.add_request(NewRequest{tag + std::to_string(i), prompts[i], params[i]}));
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) out.push_back(collect_tokens(*s));
  return out;
}

}  // namespace specula::testing
