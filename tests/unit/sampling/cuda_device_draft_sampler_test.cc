// The device DraftSampler (spec/device_draft_sampler.h over the CUDA TokenSampler) against the
// CPU one on the same draft logits on the GPU: the same draft token for every row (greedy and
// sampled, temperature, top-k, top-p, min-p, penalties, masked ids, exact ties) and the same q
// store afterwards: row q_row of every non-greedy row = the final distribution (1e-5, the same
// support), every other row untouched. Ragged row sets: logits rows out of order and skipped, q rows scattered or absent,
// more rows than one launch takes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "sampling/sampler.h"
#include "sampling/device_draft_sampler.h"
#include "sampling/draft_sampler.h"
#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/sampling/sampling_test_inputs.h"

namespace specula {
namespace {

using testing::to_host;



std::vector<SamplingParams> settings() {
  std::vector<SamplingParams> s = testing::common_sampling_settings();
  SamplingParams p;
  p.temperature = 0.8f;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = 0.25f;
  s.push_back(p);
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.repetition_penalty = 1.5f;  // greedy with penalties
  s.push_back(p);
  p = SamplingParams{};
  p.top_p = 0.3f;  // few tokens kept: ties at the threshold matter
  p.top_k = 3;
  s.push_back(p);
  return s;
}

struct Rows {
  std::vector<SamplingParams> params = settings();
  std::vector<std::vector<int32_t>> prompt, output, masked;
  std::vector<DraftSampleRow> rows;
};

// rows_per_setting rows of every setting, reading logits rows in reverse order and skipping every
// fifth; q rows scattered over a store twice as tall, every seventh row keeping none.
void make_rows(Rows& out, int64_t vocab, int64_t logits_rows, int rows_per_setting, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  const size_t n = out.params.size() * static_cast<size_t>(rows_per_setting);
  out.prompt.resize(n);
  out.output.resize(n);
  out.masked.resize(n);
  std::vector<int> q_rows(2 * n);
  std::iota(q_rows.begin(), q_rows.end(), 0);
  std::shuffle(q_rows.begin(), q_rows.end(), rng);
  int logits_row = static_cast<int>(logits_rows) - 1;
  for (size_t r = 0; r < n; ++r) {
    for (int i = 0; i < 40; ++i) out.prompt[r].push_back(tok(rng));
    for (int i = 0; i < 12; ++i) out.output[r].push_back(i % 3 == 0 && i > 0 ? out.output[r][0] : tok(rng));
    if (r % 4 == 1)
      for (int i = 0; i < 5; ++i) out.masked[r].push_back(tok(rng));
    if (r % 5 == 4) --logits_row;  // a logits row nobody samples
    DraftSampleRow d;
    d.row.logits_row = logits_row--;
    d.row.params = &out.params[r / static_cast<size_t>(rows_per_setting)];
    d.row.seed = 900 + r;
    d.row.position = 25 + static_cast<int64_t>(r);
    d.row.prompt_token_ids = out.prompt[r];
    d.row.output_token_ids = out.output[r];
    d.row.masked_token_ids = out.masked[r];
    d.q_row = r % 7 == 3 ? -1 : q_rows[r];
    out.rows.push_back(d);
  }
}

// Both samplers on the same rows, each into its own q store filled with a sentinel first.
void compare(int64_t vocab, float scale, float step, int rows_per_setting, int max_rows, uint32_t seed) {
  auto gpu = make_cuda_backend(0);
  Rows rows;
  const int64_t n = static_cast<int64_t>(rows.params.size()) * rows_per_setting;
  const int64_t logits_rows = n + n / 5 + 1;  // every fifth skipped
  make_rows(rows, vocab, logits_rows, rows_per_setting, seed);
  ASSERT_GE(rows.rows.back().row.logits_row, 0);
  const int64_t store_rows = 2 * static_cast<int64_t>(rows.rows.size());
  Tensor logits = testing::upload_f32(*gpu, testing::random_logits(logits_rows, vocab, seed + 1, scale, step), logits_rows, vocab);
  const std::vector<float> sentinel(static_cast<size_t>(store_rows * vocab), -7.0f);
  Tensor cpu_store = testing::upload_f32(*gpu, sentinel, store_rows, vocab);
  Tensor dev_store = testing::upload_f32(*gpu, sentinel, store_rows, vocab);

  auto cpu = make_cpu_draft_sampler(*gpu);
  auto dev = make_device_draft_sampler(*gpu, max_rows, vocab);
  ASSERT_NE(dev, nullptr);
  const std::vector<int32_t> want = cpu->sample(logits, rows.rows, &cpu_store);
  const std::vector<int32_t> got = dev->sample(logits, rows.rows, &dev_store);
  const std::vector<float> wq = to_host(*gpu, cpu_store), gq = to_host(*gpu, dev_store);
  ASSERT_EQ(got.size(), want.size());

  int sampled_rows = 0;
  std::vector<bool> written(static_cast<size_t>(store_rows), false);
  for (size_t r = 0; r < rows.rows.size(); ++r) {
    const DraftSampleRow& d = rows.rows[r];
    const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) + " setting " +
                             std::to_string(r / static_cast<size_t>(rows_per_setting));
    EXPECT_EQ(got[r], want[r]) << what;
    if (d.q_row < 0 || d.row.params->greedy()) continue;
    written[static_cast<size_t>(d.q_row)] = true;
    ++sampled_rows;
    const float* w = wq.data() + d.q_row * vocab;
    const float* g = gq.data() + d.q_row * vocab;
    double sum = 0.0;
    int kept = 0, mismatches = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      sum += g[i];
      kept += g[i] > 0.0f ? 1 : 0;
      // The same support, except for masses below the device's fixed-point resolution (2^-40 of
      // the most likely token's): it drops those, and draws from exactly what it wrote.
      const bool support_differs = (g[i] > 0.0f && !(w[i] > 0.0f)) || (w[i] > 1e-12f && !(g[i] > 0.0f));
      if (std::fabs(g[i] - w[i]) > 1e-5f || support_differs) {
        if (++mismatches <= 3) ADD_FAILURE() << what << " q[" << i << "] " << g[i] << " vs the CPU's " << w[i];
      }
    }
    EXPECT_EQ(mismatches, 0) << what;
    EXPECT_NEAR(sum, 1.0, 1e-5) << what;
    EXPECT_GT(kept, 0) << what;
    EXPECT_GT(g[got[r]], 0.0f) << what << ": the drafted token has no mass in q";
  }
  EXPECT_GT(sampled_rows, static_cast<int>(rows.rows.size()) / 2);
  // Rows no sampled row owns (greedy, no q, unused) keep the sentinel in both stores.
  for (int64_t q = 0; q < store_rows; ++q) {
    if (written[static_cast<size_t>(q)]) continue;
    for (int64_t i = 0; i < vocab; ++i) {
      ASSERT_EQ(gq[q * vocab + i], -7.0f) << "q store row " << q << " written by a row that keeps no q";
      ASSERT_EQ(wq[q * vocab + i], -7.0f) << "q store row " << q;
    }
  }
}

TEST(DeviceDraftSampler, MatchesTheCpuDraftSamplerOnADraftSizedVocabulary) {
  SKIP_WITHOUT_GPU();
  compare(8192, 2.5f, 0.0f, 6, 64, 31);
}

TEST(DeviceDraftSampler, MatchesTheCpuDraftSamplerOnALlama3SizedVocabulary) {
  SKIP_WITHOUT_GPU();
  compare(128256, 2.0f, 0.0f, 3, 64, 32);
}

TEST(DeviceDraftSampler, MatchesTheCpuDraftSamplerWithManyExactTiesAndSmallLaunches) {
  SKIP_WITHOUT_GPU();
  compare(3001, 1.5f, 0.5f, 7, 5, 33);  // logits on a 0.5 grid; 5 rows a launch: many launches
}

TEST(DeviceDraftSampler, GreedyTiesDraftTheFirstMaximum) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  const int64_t vocab = 8192;
  std::vector<float> host = testing::random_logits(1, vocab, 41, 1.0f, 0.0f);
  for (int64_t i : {5000, 700, 6000}) host[static_cast<size_t>(i)] = 9.0f;  // three equal maxima
  Tensor logits = testing::upload_f32(*gpu, host, 1, vocab);
  SamplingParams greedy, topk;
  greedy.temperature = 0.0f;
  topk.top_k = 2;  // the k-th value is tied three ways: all three kept
  topk.temperature = 0.05f;
  std::vector<DraftSampleRow> rows(2);
  rows[0].row.params = &greedy;
  rows[0].q_row = 0;
  rows[1].row.params = &topk;
  rows[1].row.seed = 3;
  rows[1].q_row = 1;
  Tensor store = testing::upload_f32(*gpu, std::vector<float>(static_cast<size_t>(2 * vocab), -1.0f), 2, vocab);
  auto dev = make_device_draft_sampler(*gpu, 4, vocab);
  const std::vector<int32_t> got = dev->sample(logits, rows, &store);
  EXPECT_EQ(got[0], 700);
  const std::vector<float> q = to_host(*gpu, store);
  for (int64_t i = 0; i < vocab; ++i) {
    const bool tie = i == 700 || i == 5000 || i == 6000;
    EXPECT_FLOAT_EQ(q[static_cast<size_t>(vocab + i)], tie ? 1.0f / 3.0f : 0.0f) << "token " << i;
    ASSERT_EQ(q[static_cast<size_t>(i)], -1.0f) << "the greedy row wrote q";
  }
  EXPECT_TRUE(got[1] == 700 || got[1] == 5000 || got[1] == 6000) << got[1];
}

// Chained drafts: draws queued back to back on the device (more calls than the sampler's staging
// slots, nothing waited for between them) give the tokens and q rows that sample() gives, bit for
// bit, for every setting that draws without context, with and without q rows (the plain-row
// kernel and the block-a-row one).
TEST(DeviceDraftSampler, DrawsOnTheDeviceWhatItSamples) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  const int64_t vocab = 8192, calls = 12, rows_per_call = 5;
  std::vector<SamplingParams> params;
  for (const SamplingParams& p : testing::common_sampling_settings()) {
    SamplingRow probe;
    probe.params = &p;
    if (draws_without_context(probe)) params.push_back(p);
  }
  ASSERT_GE(params.size(), 5u);
  Tensor logits = testing::upload_f32(*gpu, testing::random_logits(calls * rows_per_call, vocab, 61, 2.5f, 0.0f),
                                      calls * rows_per_call, vocab);
  std::vector<std::vector<DraftSampleRow>> rows(static_cast<size_t>(calls));
  for (int64_t c = 0; c < calls; ++c) {
    for (int64_t i = 0; i < rows_per_call; ++i) {
      DraftSampleRow d;
      d.row.logits_row = static_cast<int>(c * rows_per_call + i);
      d.row.params = &params[static_cast<size_t>((c + i) % static_cast<int64_t>(params.size()))];
      d.row.seed = 70 + static_cast<uint64_t>(c);
      d.row.position = 11 + i;
      d.q_row = c % 3 == 0 ? -1 : static_cast<int>(c * rows_per_call + i);  // every third call keeps no q
      rows[static_cast<size_t>(c)].push_back(d);
    }
  }
  const std::vector<float> sentinel(static_cast<size_t>(calls * rows_per_call * vocab), -7.0f);
  Tensor want_store = testing::upload_f32(*gpu, sentinel, calls * rows_per_call, vocab);
  Tensor got_store = testing::upload_f32(*gpu, sentinel, calls * rows_per_call, vocab);
  auto dev = make_device_draft_sampler(*gpu, 8, vocab);
  std::vector<int32_t> want;
  for (const auto& r : rows)
    for (int32_t t : dev->sample(logits, r, &want_store)) want.push_back(t);
  Tensor tokens = gpu->empty({calls * rows_per_call}, DType::kI32);
  for (int64_t c = 0; c < calls; ++c) {
    Tensor out = tokens.slice(c * rows_per_call, (c + 1) * rows_per_call);
    dev->draw_on_device(logits, rows[static_cast<size_t>(c)], &got_store, out);
  }
  Tensor host = Tensor::empty({calls * rows_per_call}, DType::kI32, Device::kCPU);
  gpu->copy(tokens, host);
  gpu->synchronize();
  const std::vector<int32_t> got(host.data_as<int32_t>(), host.data_as<int32_t>() + host.numel());
  EXPECT_EQ(got, want);
  EXPECT_EQ(to_host(*gpu, got_store), to_host(*gpu, want_store));
  SamplingParams penalised;
  penalised.repetition_penalty = 1.2f;
  SamplingRow probe;
  probe.params = &penalised;
  EXPECT_FALSE(draws_without_context(probe));
}

// Not a check: the cost of one batch-1 call at a draft's vocabulary, device vs host, for the log.
TEST(DeviceDraftSampler, ReportsTheBatchOneCost) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  const int64_t vocab = 8192;
  Tensor logits = testing::upload_f32(*gpu, testing::random_logits(1, vocab, 51, 2.5f, 0.0f), 1, vocab);
  Tensor store = gpu->empty({4, vocab}, DType::kF32);
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  std::vector<DraftSampleRow> rows(1);
  rows[0].row.params = &p;
  rows[0].q_row = 2;
  auto cpu = make_cpu_draft_sampler(*gpu);
  auto dev = make_device_draft_sampler(*gpu, 8, vocab);
  for (auto* s : {cpu.get(), dev.get()}) {
    for (int i = 0; i < 20; ++i) s->sample(logits, rows, &store);  // warm up
    const int calls = 500;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      rows[0].row.position = i;
      s->sample(logits, rows, &store);
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
    std::printf("draft sampler %s: %.1f us per batch-1 call (vocab %lld, top_p)\n", s == cpu.get() ? "cpu" : "device",
                us, static_cast<long long>(vocab));
  }
}

}  // namespace
}  // namespace specula
