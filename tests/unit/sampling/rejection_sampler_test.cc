// The rejection sampler: exact behaviour on hand-made rows, and LOSSLESSNESS measured: the
// distribution of continuations sampled with speculation must be the target's own (a chi-square
// test at a fixed significance level with fixed seeds, so the test is deterministic), while
// deliberately broken samplers fail the same test.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "sampling/sampling_math.h"
#include "sampling/draft_sampler.h"
#include "sampling/rejection_math.h"
#include "sampling/rejection_sampler.h"
#include "broken_samplers.h"
#include "chi_square.h"
#include "unit/engine/engine_fakes.h"

namespace specula {
namespace {

using testing::AlwaysAccept;
using testing::chi_square_test;
using testing::ChiSquareResult;
using testing::mix64;
using testing::ResampleFromP;

SamplingParams sampled_params(float temperature = 1.0f, int top_k = 0) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  return p;
}

std::vector<float> final_probs(std::span<const float> raw, const SamplingRow& row) {
  std::vector<float> p(raw.begin(), raw.end());
  logits_to_probs(p, row);
  return p;
}

TEST(RejectionMath, DeterministicDraftsAreExactMatchingAgainstThePlainSample) {
  const std::vector<float> p = {0.1f, 0.6f, 0.3f};
  // greedy: the argmax, whatever u
  EXPECT_EQ(verify_deterministic(p, 1, 0.99, true).accepted, true);
  PositionVerdict v = verify_deterministic(p, 2, 0.01, true);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 1);
  // sampled: y = inverse CDF at u (0.05 -> 0, 0.5 -> 1, 0.8 -> 2)
  EXPECT_EQ(verify_deterministic(p, 0, 0.05, false).token, 0);
  EXPECT_TRUE(verify_deterministic(p, 0, 0.05, false).accepted);
  v = verify_deterministic(p, 0, 0.8, false);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 2);
}

TEST(RejectionMath, StochasticAcceptanceAndResidual) {
  std::vector<float> residual(3);
  const std::vector<float> p = {0.5f, 0.5f, 0.0f}, q = {0.25f, 0.25f, 0.5f};
  // p(0)/q(0) = 2: always accepted.
  EXPECT_TRUE(verify_stochastic(p, q, 0, 0.999, 0.5, residual).accepted);
  // p(2) = 0: never accepted; the residual max(0, p - q) = (0.25, 0.25, 0) -> 0 or 1.
  for (double u : {0.0, 0.3, 0.7, 0.999}) {
    PositionVerdict v = verify_stochastic(p, q, 2, 0.0, u, residual);
    EXPECT_FALSE(v.accepted);
    EXPECT_EQ(v.token, u < 0.5 ? 0 : 1);
  }
  // p(x)/q(x) = 0.4: accepted iff u < 0.4; the residual is then all on token 1.
  const std::vector<float> p2 = {0.2f, 0.8f, 0.0f}, q2 = {0.5f, 0.0f, 0.5f};
  EXPECT_TRUE(verify_stochastic(p2, q2, 0, 0.39, 0.5, residual).accepted);
  PositionVerdict v = verify_stochastic(p2, q2, 0, 0.41, 0.01, residual);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 1);
  // p == q: always accepted.
  EXPECT_TRUE(verify_stochastic(q, q, 2, 0.999999, 0.5, residual).accepted);
}

// ---- the CPU RejectionSampler on hand-made logits ----

struct Rows {
  Tensor logits;  // [n, V]
  std::vector<SamplingRow> rows;
};

TEST(CpuRejectionSampler, GreedyAcceptsWhileDraftsEqualTheArgmaxAndReportsLogprobs) {
  auto backend = make_cpu_backend(1);
  auto sampler = make_cpu_rejection_sampler(*backend);
  // 4 rows of 5 logits: argmaxes 3, 1, 4, 0.
  const std::vector<float> l = {0, 1, 2, 5, 1, /**/ 0, 9, 2, 1, 1, /**/ 1, 0, 2, 3, 7, /**/ 8, 0, 2, 3, 1};
  Tensor logits = Tensor::from_f32(l, {4, 5});
  SamplingParams p = sampled_params(0.0f);
  p.logprobs = 1;
  std::vector<SamplingRow> rows(4);
  for (int j = 0; j < 4; ++j) {
    rows[j].logits_row = j;
    rows[j].params = &p;
    rows[j].position = 10 + j;
    rows[j].logprobs = 1;
  }
  const std::vector<int32_t> all_right = {3, 1, 4}, second_wrong = {3, 2, 4};
  std::vector<VerifyRequest> reqs = {{rows, all_right, -1}, {rows, second_wrong, -1}};
  std::vector<VerifyResult> out = sampler->verify(logits, nullptr, reqs);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{3, 1, 4, 0}));  // all accepted + bonus
  EXPECT_EQ(out[1].tokens, (std::vector<int32_t>{3, 1}));        // the argmax replaces the wrong draft
  ASSERT_EQ(out[0].logprobs.size(), 4u);
  for (int j = 0; j < 4; ++j) {
    const PositionLogprobs ref = compute_logprobs(std::span<const float>(l.data() + 5 * j, 5), out[0].tokens[j], 1);
    EXPECT_EQ(out[0].logprobs[j].chosen.token_id, out[0].tokens[j]);
    EXPECT_FLOAT_EQ(out[0].logprobs[j].chosen.logprob, ref.chosen.logprob);
    EXPECT_EQ(out[0].logprobs[j].chosen.rank, 1);
    ASSERT_EQ(out[0].logprobs[j].top.size(), 1u);
  }
  EXPECT_EQ(out[1].logprobs.size(), 2u);
}

TEST(CpuRejectionSampler, DeterministicDraftsReturnThePlainSamplesOfEveryPosition) {
  // Seeded sampling with ngram-style drafts: whatever the drafts, the tokens returned are the ones
  // plain sampling draws at those positions (so outputs do not change with speculation).
  auto backend = make_cpu_backend(1);
  auto sampler = make_cpu_rejection_sampler(*backend);
  constexpr int V = 7, K = 4;
  std::vector<float> l;
  for (int i = 0; i < (K + 1) * V; ++i) l.push_back(static_cast<float>(mix64(i) % 1000) / 300.0f);
  Tensor logits = Tensor::from_f32(l, {K + 1, V});
  SamplingParams p = sampled_params(1.0f);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    std::vector<SamplingRow> rows(K + 1);
    std::vector<int32_t> plain(K + 1);
    for (int j = 0; j <= K; ++j) {
      rows[j].logits_row = j;
      rows[j].params = &p;
      rows[j].seed = seed;
      rows[j].position = 30 + j;
      plain[j] = sample_from_probs(final_probs(std::span<const float>(l.data() + j * V, V), rows[j]),
                                   uniform_draw(seed, 30 + j));
    }
    // Drafts right on the first two positions, then wrong.
    std::vector<int32_t> drafts = {plain[0], plain[1], (plain[2] + 1) % V, plain[3]};
    std::vector<VerifyRequest> reqs = {{rows, drafts, -1}};
    const std::vector<int32_t> got = sampler->verify(logits, nullptr, reqs)[0].tokens;
    EXPECT_EQ(got, (std::vector<int32_t>{plain[0], plain[1], plain[2]})) << seed;
  }
}

// ---- losslessness, statistically ----
//
// One harness: continuations of L tokens after a context are produced the way the engine does
// it: k drafts x_j ~ q(. | context, x_<j) drawn by the CPU DraftSampler, verified against the
// target by a RejectionSampler, repeated from the new context until L tokens exist. The counts of
// each L-token continuation are compared with the exact target probabilities.

using LogitsFn = std::function<std::vector<float>(const std::vector<int32_t>&)>;

struct Lossless {
  int vocab = 0;
  LogitsFn target, draft;
  SamplingParams params;
  std::vector<int32_t> prefix;
  int length = 3;  // tokens per continuation
  int k = 3;       // drafts per round
  bool deterministic_drafts = false;  // draft the draft's argmax, q one-hot (as ngram)
};

// The index of a continuation: its tokens in base `vocab`.
int64_t cell_of(const std::vector<int32_t>& tokens, int vocab) {
  int64_t c = 0;
  for (int32_t t : tokens) c = c * vocab + t;
  return c;
}

SamplingRow row_at(const SamplingParams& p, uint64_t seed, const std::vector<int32_t>& context, int prefix_len,
                   int logits_row) {
  SamplingRow r;
  r.logits_row = logits_row;
  r.params = &p;
  r.seed = seed;
  r.position = static_cast<int64_t>(context.size());
  r.prompt_token_ids = std::span<const int32_t>(context.data(), static_cast<size_t>(prefix_len));
  r.output_token_ids = std::span<const int32_t>(context.data() + prefix_len, context.size() - prefix_len);
  return r;
}

// Samples continuations for seeds [0, n); returns the count of each cell.
std::map<int64_t, int64_t> sample_continuations(const Lossless& s, RejectionSampler& verifier, int n,
                                                Backend& backend) {
  auto draft_sampler = make_cpu_draft_sampler(backend);
  const int V = s.vocab, plen = static_cast<int>(s.prefix.size());
  std::map<int64_t, int64_t> counts;
  Tensor q_store = Tensor::empty({s.k, V}, DType::kF32);
  for (int seed = 0; seed < n; ++seed) {
    std::vector<int32_t> context = s.prefix;
    while (static_cast<int>(context.size()) - plen < s.length) {
      // Drafts, one draft-model step at a time.
      std::vector<int32_t> drafts;
      std::vector<int32_t> dctx = context;
      for (int j = 0; j < s.k; ++j) {
        Tensor dl = Tensor::from_f32(s.draft(dctx), {1, V});
        if (s.deterministic_drafts) {
          drafts.push_back(argmax(std::span<const float>(dl.data_as<float>(), V)));
        } else {
          DraftSampleRow r{row_at(s.params, seed, dctx, plen, 0), j};
          drafts.push_back(draft_sampler->sample(dl, std::span<const DraftSampleRow>(&r, 1), &q_store)[0]);
        }
        dctx.push_back(drafts.back());
      }
      // The target's k+1 rows, each seeing the drafts before it.
      std::vector<float> tl;
      std::vector<SamplingRow> rows;
      for (int j = 0; j <= s.k; ++j) {
        const std::vector<int32_t> c(dctx.begin(), dctx.begin() + static_cast<std::ptrdiff_t>(context.size()) + j);
        std::vector<float> l = s.target(c);
        tl.insert(tl.end(), l.begin(), l.end());
        rows.push_back(row_at(s.params, seed, dctx, plen, j));
        rows.back().position = static_cast<int64_t>(context.size()) + j;
        rows.back().output_token_ids =
            std::span<const int32_t>(dctx.data() + plen, context.size() - plen + static_cast<size_t>(j));
      }
      Tensor target_logits = Tensor::from_f32(tl, {s.k + 1, V});
      VerifyRequest req{rows, drafts, s.deterministic_drafts ? -1 : 0};
      std::vector<VerifyResult> res = verifier.verify(target_logits, &q_store, std::span<const VerifyRequest>(&req, 1));
      context.insert(context.end(), res[0].tokens.begin(), res[0].tokens.end());
    }
    counts[cell_of(std::vector<int32_t>(context.begin() + plen, context.begin() + plen + s.length), V)] += 1;
  }
  return counts;
}

// Exact probabilities of every continuation under the target's final distributions.
void exact_probs(const Lossless& s, std::vector<int32_t>& context, double prob, std::map<int64_t, double>& out) {
  const int plen = static_cast<int>(s.prefix.size());
  if (static_cast<int>(context.size()) - plen == s.length) {
    out[cell_of(std::vector<int32_t>(context.begin() + plen, context.end()), s.vocab)] = prob;
    return;
  }
  std::vector<float> l = s.target(context);
  SamplingRow r = row_at(s.params, 0, context, plen, 0);
  logits_to_probs(l, r);
  for (int t = 0; t < s.vocab; ++t) {
    if (l[t] <= 0.0f) continue;
    context.push_back(t);
    exact_probs(s, context, prob * l[t], out);
    context.pop_back();
  }
}

ChiSquareResult lossless_test(const Lossless& s, RejectionSampler& verifier, int n, Backend& backend) {
  std::map<int64_t, double> probs;
  std::vector<int32_t> ctx = s.prefix;
  exact_probs(s, ctx, 1.0, probs);
  std::map<int64_t, int64_t> counts = sample_continuations(s, verifier, n, backend);
  std::vector<int64_t> observed;
  std::vector<double> expected;
  for (const auto& [cell, p] : probs) {
    observed.push_back(counts.count(cell) ? counts.at(cell) : 0);
    expected.push_back(p);
  }
  ChiSquareResult r = chi_square_test(observed, expected);
  // A continuation the target cannot produce (e.g. outside its top-k) refutes the sampler at once.
  for (const auto& [cell, c] : counts)
    if (!probs.count(cell)) r.p_value = 0.0;
  return r;
}

// Target and draft over a small vocabulary: smooth functions of the context (hashed), the draft a
// blend of the target and noise so that it agrees only partly.
Lossless toy_setup() {
  Lossless s;
  s.vocab = 6;
  auto logits = [](const std::vector<int32_t>& ctx, uint64_t salt) {
    uint64_t h = 0x51;
    for (int32_t t : ctx) h = mix64(h * 31 + static_cast<uint64_t>(t) + 1);
    std::vector<float> l(6);
    for (int v = 0; v < 6; ++v) l[v] = static_cast<float>(mix64(h ^ salt ^ (v * 0x9e37ull)) % 1000) / 400.0f;
    return l;
  };
  s.target = [logits](const std::vector<int32_t>& c) { return logits(c, 0); };
  s.draft = [logits](const std::vector<int32_t>& c) {
    std::vector<float> t = logits(c, 0), n = logits(c, 77);
    for (size_t i = 0; i < t.size(); ++i) t[i] = 0.5f * t[i] + 1.2f * n[i];
    return t;
  };
  s.params = sampled_params(1.0f);
  s.prefix = {2, 5, 1};
  s.length = 3;
  s.k = 3;
  return s;
}

constexpr double kAlpha = 1e-3;      // a correct sampler passes at this level (fixed seeds: deterministic)
constexpr double kBrokenP = 1e-6;    // a broken one must fail far beyond it

TEST(Lossless, ToyModelsChainOfThreeDrafts) {
  auto backend = make_cpu_backend(1);
  auto real = make_cpu_rejection_sampler(*backend);
  const Lossless s = toy_setup();
  const int n = 30000;
  const ChiSquareResult ok = lossless_test(s, *real, n, *backend);
  EXPECT_GT(ok.p_value, kAlpha) << "chi2 " << ok.statistic << " dof " << ok.dof;
  EXPECT_GT(ok.cells, 100);

  AlwaysAccept always;
  const ChiSquareResult a = lossless_test(s, always, n, *backend);
  EXPECT_LT(a.p_value, kBrokenP) << "accepting every draft must be detected (chi2 " << a.statistic << ")";
  ResampleFromP from_p;
  const ChiSquareResult b = lossless_test(s, from_p, n, *backend);
  EXPECT_LT(b.p_value, kBrokenP) << "resampling from p instead of the residual must be detected (chi2 "
                                 << b.statistic << ")";

  // Deterministic drafts (q one-hot at the draft's argmax) through the same sampler: lossless too.
  Lossless det = s;
  det.deterministic_drafts = true;
  const ChiSquareResult d = lossless_test(det, *real, n, *backend);
  EXPECT_GT(d.p_value, kAlpha) << "chi2 " << d.statistic << " dof " << d.dof;
}

TEST(Lossless, PenaltiesAndTopKAppliedAlikeToTargetAndDraft) {
  auto backend = make_cpu_backend(1);
  auto real = make_cpu_rejection_sampler(*backend);
  Lossless s = toy_setup();
  s.params.temperature = 0.8f;
  s.params.top_k = 4;
  s.params.repetition_penalty = 1.3f;
  s.params.presence_penalty = 0.4f;
  const ChiSquareResult ok = lossless_test(s, *real, 20000, *backend);
  EXPECT_GT(ok.p_value, kAlpha) << "chi2 " << ok.statistic << " dof " << ok.dof;
  AlwaysAccept always;
  EXPECT_LT(lossless_test(s, always, 20000, *backend).p_value, kBrokenP);
}

TEST(CpuDraftSampler, KeepsTheFinalDistributionAndDrawsFromIt) {
  auto backend = make_cpu_backend(1);
  auto sampler = make_cpu_draft_sampler(*backend);
  const std::vector<float> l = {0.3f, 1.0f, -0.5f, 2.0f, 0.0f};
  Tensor logits = Tensor::from_f32(l, {1, 5});
  SamplingParams p = sampled_params(0.7f, 3);
  Tensor q = Tensor::empty({2, 5}, DType::kF32);
  std::vector<int64_t> counts(5, 0);
  for (int seed = 0; seed < 20000; ++seed) {
    SamplingRow row;
    row.params = &p;
    row.seed = static_cast<uint64_t>(seed);
    row.position = 4;
    DraftSampleRow r{row, 1};
    counts[sampler->sample(logits, std::span<const DraftSampleRow>(&r, 1), &q)[0]] += 1;
  }
  SamplingRow row;
  row.params = &p;
  const std::vector<float> expect = final_probs(l, row);
  for (int v = 0; v < 5; ++v) EXPECT_FLOAT_EQ(q.data_as<float>()[5 + v], expect[v]) << v;
  EXPECT_EQ(counts[2] + counts[4], 0);  // outside the top 3
  std::vector<double> probs(expect.begin(), expect.end());
  EXPECT_GT(chi_square_test(counts, probs).p_value, kAlpha);
  // Greedy rows draft the argmax and keep no distribution.
  SamplingParams g = sampled_params(0.0f);
  row.params = &g;
  DraftSampleRow r{row, 0};
  q.data_as<float>()[0] = -7.0f;
  EXPECT_EQ(sampler->sample(logits, std::span<const DraftSampleRow>(&r, 1), &q)[0], 3);
  EXPECT_EQ(q.data_as<float>()[0], -7.0f);
}

}  // namespace
}  // namespace specula
