// `specula bench latency|throughput` end to end on the CPU: the built binary (SPECULA_BINARY, set
// by ctest) runs the engine on the embedded model and on a fixture checkpoint without tokenizer
// files (dummy weights, no detokenisation), and its JSON reports figures consistent with what it
// ran: one latency per measured batch, TTFT and TPOT that fit inside them, every requested token.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

// Runs the binary with `args`; returns the parsed --output-json file (null when it failed).
nlohmann::json run_bench(const std::string& args, const std::string& tag) {
  const char* bin = std::getenv("SPECULA_BINARY");
  const fs::path json = fs::temp_directory_path() / ("specula_bench_" + tag + "_" + std::to_string(getpid()) + ".json");
  const std::string cmd = std::string("'") + bin + "' bench " + args + " --device cpu --output-json '" +
                          json.string() + "' > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(json);
  if (!in.good()) return nullptr;
  nlohmann::json j = nlohmann::json::parse(in);
  fs::remove(json);
  return j;
}

TEST(BenchCli, LatencyReportsTtftTpotAndBatchLatencies) {
  const char* bin = std::getenv("SPECULA_BINARY");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  const fs::path model = testing::models_dir() / "specula-tiny";
  const nlohmann::json j = run_bench("latency '" + model.string() +
                                         "' --batch-size 3 --input-len 12 --output-len 6 --num-iters 2 "
                                         "--num-iters-warmup 1 --max-model-len 64",
                                     "latency");
  ASSERT_FALSE(j.is_null());
  ASSERT_EQ(j["latencies"].size(), 2u);
  EXPECT_EQ(j["batch_size"], 3);
  // Each request ends within its batch, after its first token; TTFT and TPOT are the medians
  // of the per-request figures, TPOT = (e2e - TTFT) / (6 - 1).
  const auto& ttfts = j["requests"]["ttft_ms"];
  const auto& e2es = j["requests"]["e2e_ms"];
  ASSERT_EQ(ttfts.size(), 6u);
  ASSERT_EQ(e2es.size(), 6u);
  std::vector<double> tt, tp;
  for (size_t i = 0; i < 6; ++i) {
    const double ttft = ttfts[i], e2e = e2es[i];
    EXPECT_GT(ttft, 0.0);
    EXPECT_GT(e2e, ttft);
    EXPECT_LE(e2e, j["latencies"][i / 3].get<double>() * 1000.0 + 1e-6) << "request " << i;
    tt.push_back(ttft);
    tp.push_back((e2e - ttft) / 5);
  }
  std::sort(tt.begin(), tt.end());
  std::sort(tp.begin(), tp.end());
  EXPECT_NEAR(j["ttft_ms"]["median"].get<double>(), (tt[2] + tt[3]) / 2, 1e-6);
  EXPECT_NEAR(j["tpot_ms"]["median"].get<double>(), (tp[2] + tp[3]) / 2, 1e-6);
  EXPECT_GE(j["tpot_ms"]["p90"].get<double>(), j["tpot_ms"]["median"].get<double>());
  // 3 requests x 6 tokens per batch, over the measured batches' total time.
  const double total = j["latencies"][0].get<double>() + j["latencies"][1].get<double>();
  EXPECT_NEAR(j["output_tokens_per_second"].get<double>(), 2 * 3 * 6 / total, 1e-6 * 36 / total);
}

TEST(BenchCli, ThroughputRunsEveryRequestWithoutATokenizer) {
  const char* bin = std::getenv("SPECULA_BINARY");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  // A fixture checkpoint's config with dummy weights: no tokenizer.json beside it.
  const fs::path model = testing::fixtures_dir() / "models" / "llama";
  ASSERT_FALSE(fs::exists(model / "tokenizer.json"));
  const nlohmann::json j = run_bench("throughput '" + model.string() +
                                         "' --load-format dummy --num-prompts 10 --input-len 9 --output-len 5",
                                     "throughput");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["num_requests"], 10);
  EXPECT_EQ(j["total_output_tokens"], 50);
  EXPECT_EQ(j["total_num_tokens"], 10 * (9 + 5));
  const double secs = j["elapsed_time"];
  EXPECT_NEAR(j["output_tokens_per_second"].get<double>(), 50 / secs, 1e-6 * 50 / secs);
  EXPECT_NEAR(j["requests_per_second"].get<double>(), 10 / secs, 1e-6 * 10 / secs);
}

TEST(BenchCli, DatasetPromptsAndSpeculativeAcceptance) {
  const char* bin = std::getenv("SPECULA_BINARY");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  // Real Python text as prompts, greedy, the embedded pair with k = 2 pinned: the JSON reports the
  // acceptance of exactly the measured requests, consistent with itself.
  const fs::path model = testing::models_dir() / "specula-tiny";
  const fs::path draft = testing::models_dir() / "specula-tiny-draft";
  const fs::path text = testing::source_dir() / "tools" / "train" / "main.py";
  ASSERT_TRUE(fs::exists(text)) << text;
  const std::string spec = "{\"method\":\"draft_model\",\"model\":\"" + draft.string() +
                           "\",\"num_speculative_tokens\":2,\"adaptive\":false}";
  const nlohmann::json j = run_bench("latency '" + model.string() + "' --dataset '" + text.string() +
                                         "' --temperature 0 --batch-size 2 --input-len 24 --output-len 12 "
                                         "--num-iters 1 --num-iters-warmup 1 --max-model-len 128 "
                                         "--speculative-config '" + spec + "'",
                                     "dataset");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["temperature"], 0.0);
  const auto& s = j["spec_decoding"];
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["num_speculative_tokens"], 2);
  EXPECT_FALSE(s["adaptive"].get<bool>());
  const double drafts = s["drafts"], drafted = s["draft_tokens"], accepted = s["accepted_tokens"];
  EXPECT_GT(drafts, 0);
  EXPECT_LE(drafted, 2 * drafts);
  EXPECT_LE(accepted, drafted);
  // Each request's 12 tokens come from its steps: one bonus/correction token per verification
  // plus the accepted drafts (the first token comes from the prefill).
  EXPECT_LE(accepted + drafts, 2 * 12.0);
  EXPECT_NEAR(s["acceptance_rate"].get<double>(), drafted > 0 ? accepted / drafted : 0.0, 1e-9);
  EXPECT_NEAR(s["mean_acceptance_length"].get<double>(), 1.0 + accepted / drafts, 1e-9);
  ASSERT_EQ(s["per_position_acceptance"].size(), 2u);
  EXPECT_GE(s["per_position_acceptance"][0].get<double>(), s["per_position_acceptance"][1].get<double>());
  // The embedded draft agrees with the target on Python text most of the time.
  EXPECT_GT(s["acceptance_rate"].get<double>(), 0.3);
}

TEST(BenchCli, DatasetShorterThanThePromptIsRefused) {
  const char* bin = std::getenv("SPECULA_BINARY");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  const fs::path model = testing::models_dir() / "specula-tiny";
  const fs::path text = fs::temp_directory_path() / ("specula_bench_short_" + std::to_string(getpid()) + ".txt");
  { std::ofstream(text) << "def f():\n    return 1\n"; }
  const std::string cmd = std::string("'") + bin + "' bench latency '" + model.string() + "' --device cpu --dataset '" +
                          text.string() + "' --input-len 40 --output-len 4 --max-model-len 64 > /dev/null 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  fs::remove(text);
}

TEST(BenchCli, PromptsLongerThanTheContextAreRefused) {
  const char* bin = std::getenv("SPECULA_BINARY");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  const fs::path model = testing::models_dir() / "specula-tiny";
  const std::string cmd = std::string("'") + bin + "' bench latency '" + model.string() +
                          "' --device cpu --input-len 60 --output-len 10 --max-model-len 64 > /dev/null 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace specula
