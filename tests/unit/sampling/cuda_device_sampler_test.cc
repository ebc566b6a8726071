// The device sampler (sampling/device_sampler.h over the CUDA TokenSampler) against the CPU sampler
// on the same F32 logits on the GPU: the same token for every row (greedy, temperature, top-k,
// top-p, min-p, their combinations, penalties, masked ids, seeded draws), the same logprobs
// (value, rank, top N in order), and the same prompt logprobs. Vocabularies at real sizes (Qwen3,
// Llama-3) and a small one with many exact ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "sampling/device_sampler.h"
#include "sampling/sampler.h"
#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/sampling/sampling_test_inputs.h"

namespace specula {
namespace {



std::vector<SamplingParams> settings() {
  std::vector<SamplingParams> s = testing::common_sampling_settings();
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = 0.25f;
  s.push_back(p);
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.repetition_penalty = 1.5f;  // greedy with penalties
  s.push_back(p);
  p = SamplingParams{};
  p.logprobs = 5;
  s.push_back(p);
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.logprobs = 0;
  s.push_back(p);
  p = SamplingParams{};
  p.top_p = 0.8f;
  p.logprobs = 20;
  s.push_back(p);
  p = SamplingParams{};
  p.logprobs = 100;  // more than the device computes: the host fills it in
  s.push_back(p);
  return s;
}

void expect_same_logprobs(const PositionLogprobs& got, const PositionLogprobs& want, const std::string& what) {
  EXPECT_EQ(got.chosen.token_id, want.chosen.token_id) << what;
  EXPECT_NEAR(got.chosen.logprob, want.chosen.logprob, 2e-5) << what;
  EXPECT_EQ(got.chosen.rank, want.chosen.rank) << what;
  ASSERT_EQ(got.top.size(), want.top.size()) << what;
  for (size_t i = 0; i < got.top.size(); ++i) {
    EXPECT_EQ(got.top[i].token_id, want.top[i].token_id) << what << " top " << i;
    EXPECT_NEAR(got.top[i].logprob, want.top[i].logprob, 2e-5) << what << " top " << i;
    EXPECT_EQ(got.top[i].rank, want.top[i].rank) << what << " top " << i;
  }
}

void compare_samplers(int64_t vocab, float scale, float step, int rows_per_setting, uint32_t seed) {
  auto gpu = make_cuda_backend(0);
  const std::vector<SamplingParams> params = settings();
  const int64_t rows = static_cast<int64_t>(params.size()) * rows_per_setting;
  Tensor logits = testing::upload_f32(*gpu, testing::random_logits(rows, vocab, seed, scale, step), rows, vocab);
  std::mt19937 rng(seed + 1);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  std::vector<std::vector<int32_t>> prompt(static_cast<size_t>(rows)), output(prompt.size()), masked(prompt.size());
  // Every third row has a structured-output mask allowing about a quarter of the vocabulary.
  std::vector<std::vector<uint32_t>> allowed(prompt.size());
  std::vector<SamplingRow> sr(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < 50; ++i) prompt[r].push_back(tok(rng));
    for (int i = 0; i < 30; ++i) output[r].push_back(i % 3 == 0 ? output[r].empty() ? tok(rng) : output[r][0] : tok(rng));
    if (r % 4 == 1)
      for (int i = 0; i < 5; ++i) masked[r].push_back(tok(rng));
    SamplingRow& row = sr[r];
    row.logits_row = static_cast<int>(rows - 1 - r);  // rows out of order
    row.params = &params[static_cast<size_t>(r / rows_per_setting)];
    row.seed = 1000 + static_cast<uint64_t>(r);
    row.position = 17 + r;
    row.prompt_token_ids = prompt[r];
    row.output_token_ids = output[r];
    row.masked_token_ids = masked[r];
    if (r % 3 == 2) {
      allowed[r].assign(static_cast<size_t>((vocab + 31) / 32), 0u);
      for (int64_t t = 0; t < vocab; ++t)
        if (rng() % 4 == 0) allowed[r][t >> 5] |= 1u << (t & 31);
      row.allowed_token_mask = allowed[r];
    }
    row.logprobs = row.params->logprobs;
  }
  auto cpu_sampler = make_cpu_sampler(*gpu);
  auto dev_sampler = make_device_sampler(*gpu, static_cast<int>(rows), vocab);
  ASSERT_NE(dev_sampler, nullptr);
  const std::vector<SampledToken> want = cpu_sampler->sample(logits, sr);
  const std::vector<SampledToken> got = dev_sampler->sample(logits, sr);
  const std::vector<SampledToken> again = dev_sampler->sample(logits, sr);
  ASSERT_EQ(got.size(), want.size());
  for (int64_t r = 0; r < rows; ++r) {
    const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) + " setting " +
                             std::to_string(r / rows_per_setting);
    EXPECT_EQ(got[r].token, want[r].token) << what;
    EXPECT_EQ(again[r].token, got[r].token) << what << " (run to run)";
    ASSERT_EQ(got[r].logprobs.has_value(), want[r].logprobs.has_value()) << what;
    if (want[r].logprobs) expect_same_logprobs(*got[r].logprobs, *want[r].logprobs, what);
  }

  // Prompt logprobs: raw log_softmax rows with targets, top 3 and top 0.
  std::vector<int> lrows;
  std::vector<int32_t> targets;
  for (int64_t r = 0; r < rows; r += 3) {
    lrows.push_back(static_cast<int>(r));
    targets.push_back(tok(rng));
  }
  for (int top_n : {0, 3, -1}) {
    if (top_n == -1 && vocab > 10000) continue;  // the whole vocabulary: host work, checked on the small vocab
    const auto w = cpu_sampler->logprobs_of(logits, lrows, targets, top_n);
    const auto g = dev_sampler->logprobs_of(logits, lrows, targets, top_n);
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i) expect_same_logprobs(g[i], w[i], "prompt logprobs top " + std::to_string(top_n));
  }
}

// A few rows that only draw (greedy or at a temperature) take the cluster-per-row kernel on
// Hopper: the same tokens as the CPU sampler, in batches of 1 to 8 rows, real vocabulary sizes,
// and rows whose maximum repeats (the first index wins) or sits at either end of the vocabulary.
TEST(DeviceSampler, FewPlainRowsMatchTheCpuSampler) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  std::vector<SamplingParams> params(3);
  params[0].temperature = 0.0f;
  params[2].temperature = 0.6f;
  for (int64_t vocab : {151936, 128256, 1000}) {
    const int64_t rows = 8;
    std::vector<float> host = testing::random_logits(rows, vocab, 41, 4.0f);
    host[static_cast<size_t>(1 * vocab + 7)] = host[static_cast<size_t>(1 * vocab + vocab - 3)] = 40.0f;  // ties
    host[static_cast<size_t>(2 * vocab)] = 40.0f;
    host[static_cast<size_t>(3 * vocab + vocab - 1)] = 40.0f;
    Tensor logits = testing::upload_f32(*gpu, host, rows, vocab);
    auto cpu_sampler = make_cpu_sampler(*gpu);
    auto dev_sampler = make_device_sampler(*gpu, static_cast<int>(rows), vocab);
    ASSERT_NE(dev_sampler, nullptr);
    for (const SamplingParams& p : params) {
      for (int batch : {1, 3, 8}) {
        for (uint64_t draw = 0; draw < 6; ++draw) {
          std::vector<SamplingRow> sr(static_cast<size_t>(batch));
          for (int r = 0; r < batch; ++r) {
            sr[r].logits_row = (r * 3 + static_cast<int>(draw)) % static_cast<int>(rows);
            sr[r].params = &p;
            sr[r].seed = 7000 + draw * 100 + static_cast<uint64_t>(r);
            sr[r].position = static_cast<int>(draw);
          }
          const std::vector<SampledToken> want = cpu_sampler->sample(logits, sr);
          const std::vector<SampledToken> got = dev_sampler->sample(logits, sr);
          ASSERT_EQ(got.size(), want.size());
          for (int r = 0; r < batch; ++r)
            EXPECT_EQ(got[r].token, want[r].token) << "vocab " << vocab << " temperature " << p.temperature
                                                   << " batch " << batch << " draw " << draw << " row " << r;
        }
      }
    }
  }
}

TEST(DeviceSampler, MatchesTheCpuSamplerOnAQwen3SizedVocabulary) {
  SKIP_WITHOUT_GPU();
  compare_samplers(151936, 3.0f, 0.0f, 6, 11);
}

TEST(DeviceSampler, MatchesTheCpuSamplerOnALlama3SizedVocabulary) {
  SKIP_WITHOUT_GPU();
  compare_samplers(128256, 2.0f, 0.0f, 4, 12);
}

TEST(DeviceSampler, MatchesTheCpuSamplerWithManyExactTies) {
  SKIP_WITHOUT_GPU();
  compare_samplers(3001, 1.5f, 0.5f, 8, 13);  // logits on a 0.5 grid: hundreds of equal values
}

TEST(DeviceSampler, FlatPeakedAndMaskedRows) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  const int64_t vocab = 40000, rows = 4;
  std::vector<float> host(static_cast<size_t>(rows * vocab), 0.0f);  // row 0: flat
  host[vocab + 123] = 50.0f;                                          // row 1: one certain token
  for (int64_t i = 0; i < vocab; ++i) host[2 * vocab + i] = (i % 7 == 0) ? 1.0f : -1.0f;  // row 2: two levels
  for (int64_t i = 0; i < vocab; ++i) host[3 * vocab + i] = static_cast<float>(i % 1000) / 100.0f;
  Tensor logits = testing::upload_f32(*gpu, host, rows, vocab);
  SamplingParams temp, topk;
  topk.top_k = 5;
  topk.top_p = 0.3f;
  std::vector<int32_t> mask{123};
  std::vector<SamplingRow> sr;
  for (int r = 0; r < rows; ++r)
    for (const SamplingParams* p : {&temp, &topk}) {
      SamplingRow row;
      row.logits_row = r;
      row.params = p;
      row.seed = 5;
      row.position = 3 + r;
      if (r == 1 && p == &topk) row.masked_token_ids = mask;  // the certain token masked away
      sr.push_back(row);
    }
  auto cpu_sampler = make_cpu_sampler(*gpu);
  auto dev_sampler = make_device_sampler(*gpu, 16, vocab);
  const auto want = cpu_sampler->sample(logits, sr);
  const auto got = dev_sampler->sample(logits, sr);
  for (size_t i = 0; i < sr.size(); ++i) EXPECT_EQ(got[i].token, want[i].token) << "row " << i;
  EXPECT_EQ(got[2].token, 123);
}

TEST(DeviceSampler, EveryTokenMaskedIsAnError) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  const int64_t vocab = 8;
  Tensor logits = testing::upload_f32(*gpu, std::vector<float>(8, 1.0f), 1, vocab);
  SamplingParams p;
  std::vector<int32_t> all{0, 1, 2, 3, 4, 5, 6, 7};
  SamplingRow row;
  row.params = &p;
  row.masked_token_ids = all;
  auto dev_sampler = make_device_sampler(*gpu, 4, vocab);
  std::vector<SamplingRow> rows{row};
  EXPECT_THROW(dev_sampler->sample(logits, rows), Error);
}

// Async scheduling's token feed: between start_sample() and finish_sample(), the entries -(1 + i)
// of a device token buffer become row i's token in stream order (the plain-row cluster kernel and
// the one-block-per-row kernel, whose rows here ask for logprobs), and the entries >= 0 stay. A
// start that ran as several launches (more rows with penalties than one launch counts) cannot feed.
TEST(DeviceSampler, FeedsStartedTokensIntoTheNextInputs) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  const int64_t vocab = 151936, rows = 6;
  Tensor logits = testing::upload_f32(*gpu, testing::random_logits(rows, vocab, 43, 4.0f), rows, vocab);
  auto dev_sampler = make_device_sampler(*gpu, 128, vocab);
  std::vector<SamplingParams> params(2);
  params[0].temperature = 0.0f;
  params[1].logprobs = 3;
  for (const SamplingParams& p : params) {
    std::vector<SamplingRow> sr(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      sr[r].logits_row = static_cast<int>(rows) - 1 - r;
      sr[r].params = &p;
      sr[r].seed = 11 + static_cast<uint64_t>(r);
      sr[r].position = 5;
    }
    ASSERT_TRUE(dev_sampler->can_defer(sr));
    const std::vector<int32_t> inputs{17, -3, -1, 9, -6, 0, -2, -1};
    Tensor host_ids = Tensor::empty({static_cast<int64_t>(inputs.size())}, DType::kI32, Device::kCPU);
    std::copy(inputs.begin(), inputs.end(), host_ids.data_as<int32_t>());
    Tensor ids = gpu->empty(host_ids.shape(), DType::kI32);
    gpu->copy(host_ids, ids);
    dev_sampler->start_sample(logits, sr);
    ASSERT_TRUE(dev_sampler->can_feed_started());
    dev_sampler->feed_started_tokens(ids);
    const std::vector<SampledToken> sampled = dev_sampler->finish_sample();
    EXPECT_FALSE(dev_sampler->can_feed_started());
    gpu->copy(ids, host_ids);
    gpu->synchronize();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int32_t want = inputs[i] >= 0 ? inputs[i] : sampled.at(static_cast<size_t>(-(inputs[i] + 1))).token;
      EXPECT_EQ(host_ids.data_as<int32_t>()[i], want) << "entry " << i << " logprobs " << p.logprobs.has_value();
    }
  }
  SamplingParams penalised;
  penalised.frequency_penalty = 0.5f;
  std::vector<int32_t> history{1, 2, 3};
  std::vector<SamplingRow> many(100);
  for (size_t r = 0; r < many.size(); ++r) {
    many[r].logits_row = static_cast<int>(r % rows);
    many[r].params = &penalised;
    many[r].output_token_ids = history;
  }
  dev_sampler->start_sample(logits, many);
  EXPECT_FALSE(dev_sampler->can_feed_started());
  EXPECT_EQ(dev_sampler->finish_sample().size(), many.size());
}

}  // namespace
}  // namespace specula
