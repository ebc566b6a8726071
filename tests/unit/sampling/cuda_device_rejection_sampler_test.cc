// The device RejectionSampler (spec/device_rejection_sampler.h) against the CPU one on the same
// target logits and draft distributions on the GPU: the same accepted prefix and replacement or
// bonus token for every request (stochastic drafts with min(1, p/q) and residual draws,
// deterministic drafts, greedy rows, filters, penalties), and the same logprobs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sampling/sampler.h"
#include "sampling/device_rejection_sampler.h"
#include "sampling/rejection_sampler.h"
#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/sampling/sampling_test_inputs.h"

namespace specula {
namespace {


struct Case {
  SamplingParams params;
  bool stochastic;
};

TEST(DeviceRejectionSampler, MatchesTheCpuRejectionSampler) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  const int64_t vocab = 32000;
  std::mt19937 rng(21);
  std::normal_distribution<float> logit(0.0f, 2.5f);

  std::vector<Case> cases;
  auto add = [&](SamplingParams p, bool stochastic) { cases.push_back({p, stochastic}); };
  SamplingParams p;
  add(p, true);  // temperature 1
  p.temperature = 0.7f;
  p.top_k = 50;
  p.top_p = 0.9f;
  add(p, true);
  p = SamplingParams{};
  p.min_p = 0.02f;
  p.logprobs = 3;
  add(p, true);
  p = SamplingParams{};
  add(p, false);  // deterministic drafts (ngram-like)
  p.temperature = 0.0f;
  add(p, false);  // greedy
  p = SamplingParams{};
  p.repetition_penalty = 1.2f;
  p.logprobs = 0;
  add(p, true);

  const int per_case = 8, k = 3;
  const int num_requests = static_cast<int>(cases.size()) * per_case;
  const int64_t rows = static_cast<int64_t>(num_requests) * (k + 1);
  std::vector<float> target(static_cast<size_t>(rows * vocab));
  for (float& x : target) x = logit(rng);
  // q: the softmax of draft logits that are the target's plus noise (drafts agree often).
  std::vector<float> q(static_cast<size_t>(num_requests * k * vocab));
  std::vector<std::vector<int32_t>> drafts(static_cast<size_t>(num_requests));
  for (int r = 0; r < num_requests; ++r) {
    for (int j = 0; j < k; ++j) {
      const float* t = target.data() + (static_cast<int64_t>(r) * (k + 1) + j) * vocab;
      float* qr = q.data() + (static_cast<int64_t>(r) * k + j) * vocab;
      double sum = 0;
      float m = -INFINITY;
      for (int64_t i = 0; i < vocab; ++i) m = std::max(m, qr[i] = t[i] + 0.7f * logit(rng));
      for (int64_t i = 0; i < vocab; ++i) sum += qr[i] = std::exp(qr[i] - m);
      for (int64_t i = 0; i < vocab; ++i) qr[i] = static_cast<float>(qr[i] / sum);
      // The draft token: q's argmax half of the time, else a draw from q.
      int32_t x = 0;
      if (j % 2 == 0) {
        x = static_cast<int32_t>(std::max_element(qr, qr + vocab) - qr);
      } else {
        double u = std::uniform_real_distribution<double>(0, 1)(rng), c = 0;
        for (x = 0; x < vocab - 1 && (c += qr[x]) <= u; ++x) {
        }
      }
      drafts[r].push_back(x);
    }
  }
  Tensor logits = testing::upload_f32(*gpu, target, rows, vocab);
  Tensor draft_probs = testing::upload_f32(*gpu, q, num_requests * k, vocab);

  std::vector<std::vector<int32_t>> context(static_cast<size_t>(num_requests));
  std::vector<std::vector<SamplingRow>> srows(static_cast<size_t>(num_requests));
  std::vector<VerifyRequest> requests;
  for (int r = 0; r < num_requests; ++r) {
    const Case& c = cases[static_cast<size_t>(r / per_case)];
    for (int i = 0; i < 20; ++i) context[r].push_back(static_cast<int32_t>(rng() % vocab));
    context[r].insert(context[r].end(), drafts[r].begin(), drafts[r].end());
    for (int j = 0; j <= k; ++j) {
      SamplingRow row;
      row.logits_row = r * (k + 1) + j;
      row.params = &c.params;
      row.seed = 77 + static_cast<uint64_t>(r);
      row.position = 30 + j;
      row.prompt_token_ids = std::span<const int32_t>(context[r].data(), 10);
      row.output_token_ids = std::span<const int32_t>(context[r].data() + 10, static_cast<size_t>(10 + j));
      row.logprobs = c.params.logprobs;
      srows[r].push_back(row);
    }
    requests.push_back(VerifyRequest{srows[r], drafts[r], c.stochastic ? r * k : -1});
  }
  auto cpu = make_cpu_rejection_sampler(*gpu);
  auto dev = make_device_rejection_sampler(*gpu, static_cast<int>(rows), vocab);
  ASSERT_NE(dev, nullptr);
  const std::vector<VerifyResult> want = cpu->verify(logits, &draft_probs, requests);
  const std::vector<VerifyResult> got = dev->verify(logits, &draft_probs, requests);
  ASSERT_EQ(got.size(), want.size());
  int accepted = 0, rejected = 0;
  for (int r = 0; r < num_requests; ++r) {
    EXPECT_EQ(got[r].tokens, want[r].tokens) << "request " << r << " case " << r / per_case;
    ASSERT_EQ(got[r].logprobs.size(), want[r].logprobs.size()) << "request " << r;
    for (size_t i = 0; i < got[r].logprobs.size(); ++i) {
      EXPECT_EQ(got[r].logprobs[i].chosen.token_id, want[r].logprobs[i].chosen.token_id);
      EXPECT_NEAR(got[r].logprobs[i].chosen.logprob, want[r].logprobs[i].chosen.logprob, 2e-5);
      ASSERT_EQ(got[r].logprobs[i].top.size(), want[r].logprobs[i].top.size());
      for (size_t t = 0; t < got[r].logprobs[i].top.size(); ++t)
        EXPECT_EQ(got[r].logprobs[i].top[t].token_id, want[r].logprobs[i].top[t].token_id);
    }
    accepted += static_cast<int>(want[r].tokens.size()) - 1;
    rejected += want[r].tokens.size() <= static_cast<size_t>(k) ? 1 : 0;
  }
  // The batch exercises both outcomes.
  EXPECT_GT(accepted, 10);
  EXPECT_GT(rejected, 10);
}

}  // namespace
}  // namespace specula
