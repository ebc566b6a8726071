#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "sampling/sampler.h"
#include "sampling/sampling_math.h"

namespace specula {
namespace {

std::vector<float> random_logits(int v, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(static_cast<size_t>(v));
  for (float& x : l) x = d(rng);
  return l;
}

std::vector<double> softmax(const std::vector<float>& l, double t = 1.0) {
  double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp((l[i] - m) / t);
  for (double& x : p) x /= s;
  return p;
}

SamplingRow row_for(const SamplingParams& p) {
  SamplingRow r;
  r.params = &p;
  return r;
}

TEST(SamplingMath, GreedyIsArgmaxAndIgnoresTruncation) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 1;  // irrelevant for greedy
  std::vector<float> l = random_logits(100, 1);
  const int32_t expected = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  std::vector<float> probs = l;
  logits_to_probs(probs, row_for(p));
  EXPECT_EQ(argmax(probs), expected);
  EXPECT_FLOAT_EQ(probs[expected], 1.0f);
  EXPECT_FLOAT_EQ(std::accumulate(probs.begin(), probs.end(), 0.0f), 1.0f);
}

TEST(SamplingMath, TemperatureScalesTheSoftmax) {
  SamplingParams p;
  p.temperature = 0.7f;
  std::vector<float> l = random_logits(50, 2);
  std::vector<float> probs = l;
  logits_to_probs(probs, row_for(p));
  std::vector<double> ref = softmax(l, 0.7);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(probs[i], ref[i], 1e-6);
}

TEST(SamplingMath, TopKKeepsTheKMostLikely) {
  SamplingParams p;
  p.top_k = 5;
  std::vector<float> l = random_logits(200, 3);
  std::vector<float> probs = l;
  logits_to_probs(probs, row_for(p));
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  double kept = 0;
  for (int i = 0; i < 5; ++i) kept += softmax(l)[order[i]];
  std::vector<double> full = softmax(l);
  for (int i = 0; i < 200; ++i) {
    const bool in_top = std::find(order.begin(), order.begin() + 5, i) != order.begin() + 5;
    if (in_top) EXPECT_NEAR(probs[i], full[i] / kept, 1e-5) << i;
    else EXPECT_EQ(probs[i], 0.0f) << i;
  }
}

// vLLM's top-p, written the way vLLM writes it: sort ascending, drop tokens whose cumulative sum
// is <= 1 - p (always keeping the most likely), renormalise.
std::vector<double> reference_top_p(const std::vector<double>& probs, double top_p) {
  std::vector<int> asc(probs.size());
  std::iota(asc.begin(), asc.end(), 0);
  std::stable_sort(asc.begin(), asc.end(), [&](int a, int b) { return probs[a] < probs[b]; });
  std::vector<double> out = probs;
  double cum = 0;
  for (size_t i = 0; i < asc.size(); ++i) {
    cum += probs[asc[i]];
    if (cum <= 1 - top_p && i + 1 < asc.size()) out[asc[i]] = 0;
  }
  double s = std::accumulate(out.begin(), out.end(), 0.0);
  for (double& x : out) x /= s;
  return out;
}

TEST(SamplingMath, TopPMatchesVllmsDefinition) {
  for (float top_p : {0.05f, 0.3f, 0.9f, 0.999f}) {
    for (uint32_t seed = 10; seed < 15; ++seed) {
      SamplingParams p;
      p.top_p = top_p;
      std::vector<float> l = random_logits(300, seed, seed % 2 ? 1.0f : 4.0f);
      std::vector<float> probs = l;
      logits_to_probs(probs, row_for(p));
      std::vector<double> ref = reference_top_p(softmax(l), top_p);
      for (size_t i = 0; i < l.size(); ++i) ASSERT_NEAR(probs[i], ref[i], 1e-5) << "top_p " << top_p << " token " << i;
    }
  }
}

TEST(SamplingMath, MinPDropsTokensBelowAFractionOfTheMostLikely) {
  SamplingParams p;
  p.min_p = 0.2f;
  p.temperature = 0.8f;
  std::vector<float> l = random_logits(100, 4);
  std::vector<float> probs = l;
  logits_to_probs(probs, row_for(p));
  std::vector<double> full = softmax(l, 0.8);
  const double max_p = *std::max_element(full.begin(), full.end());
  double kept = 0;
  for (double q : full)
    if (q >= 0.2 * max_p) kept += q;
  for (size_t i = 0; i < l.size(); ++i) {
    if (full[i] < 0.2 * max_p) EXPECT_EQ(probs[i], 0.0f);
    else EXPECT_NEAR(probs[i], full[i] / kept, 1e-5);
  }
}

TEST(SamplingMath, PenaltiesFollowVllm) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  std::vector<float> l = {1.0f, -1.0f, 2.0f, -2.0f, 3.0f, 0.5f};
  std::vector<int32_t> prompt = {0, 1, 1};
  std::vector<int32_t> output = {2, 3, 3, 3};
  SamplingRow r = row_for(p);
  r.prompt_token_ids = prompt;
  r.output_token_ids = output;
  apply_penalties(l, r);
  EXPECT_FLOAT_EQ(l[0], 0.5f);                       // prompt, positive: divided
  EXPECT_FLOAT_EQ(l[1], -2.0f);                      // prompt twice, negative: multiplied once
  EXPECT_FLOAT_EQ(l[2], 2.0f / 2 - 0.5f - 0.25f);    // output once
  EXPECT_FLOAT_EQ(l[3], -2.0f * 2 - 1.5f - 0.25f);   // output three times
  EXPECT_FLOAT_EQ(l[4], 3.0f);                       // unseen
  EXPECT_FLOAT_EQ(l[5], 0.5f);
}

// OpenAI's logit_bias: added to the raw logit before penalties, temperature and the filters.
TEST(SamplingMath, LogitBiasIsAddedFirst) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{0, 10.0f}, {1, -100.0f}};
  std::vector<float> l = {0.0f, 5.0f, 1.0f};
  logits_to_probs(l, row_for(p));
  EXPECT_EQ(argmax(l), 0);  // 0 + 10 beats 1; 5 - 100 is out
  p.temperature = 1.0f;
  p.logit_bias = {{2, std::log(3.0f)}};
  std::vector<float> s = {0.0f, 0.0f, 0.0f};
  logits_to_probs(s, row_for(p));
  EXPECT_NEAR(s[2], 3.0f / 5.0f, 1e-6);  // exp(b) = 3 against 1 + 1
  EXPECT_NEAR(s[0], 1.0f / 5.0f, 1e-6);
  p.repetition_penalty = 2.0f;  // the bias comes before the penalty: (1 + 3) / 2
  p.logit_bias = {{0, 3.0f}};
  std::vector<float> r = {1.0f, 0.0f};
  std::vector<int32_t> prompt = {0};
  SamplingRow row = row_for(p);
  row.prompt_token_ids = prompt;
  apply_penalties(r, row);
  EXPECT_FLOAT_EQ(r[0], 2.0f);
}

TEST(SamplingMath, MaskedTokensAreNeverChosen) {
  SamplingParams p;
  p.temperature = 0.0f;
  std::vector<float> l = {0.0f, 5.0f, 1.0f};
  std::vector<int32_t> masked = {1};
  SamplingRow r = row_for(p);
  r.masked_token_ids = masked;
  logits_to_probs(l, r);
  EXPECT_EQ(argmax(l), 2);
}

TEST(SamplingMath, AllowedTokenMaskLeavesOnlyAllowedTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<float> l(70, 0.0f);
  l[3] = 9.0f;  // the best token is not allowed
  std::vector<uint32_t> allowed(3, 0u);
  for (int t : {5, 40, 69}) allowed[t >> 5] |= 1u << (t & 31);
  SamplingRow r = row_for(p);
  r.allowed_token_mask = allowed;
  logits_to_probs(l, r);
  float total = 0.0f;
  for (int t = 0; t < 70; ++t) {
    if (t == 5 || t == 40 || t == 69) EXPECT_NEAR(l[t], 1.0f / 3.0f, 1e-6) << t;
    else EXPECT_EQ(l[t], 0.0f) << t;
    total += l[t];
  }
  EXPECT_NEAR(total, 1.0f, 1e-6);
}

TEST(SamplingMath, InverseCdfDrawsFollowTheDistribution) {
  std::vector<float> probs = {0.1f, 0.0f, 0.6f, 0.3f};
  std::vector<int> counts(4, 0);
  const int n = 200000;
  for (int i = 0; i < n; ++i) counts[sample_from_probs(probs, uniform_draw(99, i))] += 1;
  EXPECT_EQ(counts[1], 0);
  for (int t : {0, 2, 3}) EXPECT_NEAR(counts[t] / static_cast<double>(n), probs[t], 0.005) << t;
}

TEST(SamplingMath, UniformDrawsArePureFunctionsOfSeedAndPosition) {
  EXPECT_EQ(uniform_draw(5, 10), uniform_draw(5, 10));
  EXPECT_NE(uniform_draw(5, 10), uniform_draw(5, 11));
  EXPECT_NE(uniform_draw(5, 10), uniform_draw(6, 10));
  EXPECT_NE(uniform_draw(5, 10, 0), uniform_draw(5, 10, 1));
  double mean = 0;
  for (int i = 0; i < 100000; ++i) {
    double u = uniform_draw(1, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    mean += u;
  }
  EXPECT_NEAR(mean / 100000, 0.5, 0.01);
}

TEST(SamplingMath, LogprobsMatchADirectLogSoftmax) {
  std::vector<float> l = random_logits(1000, 5);
  l[17] = l[18];  // a tie
  const int32_t target = 42;
  PositionLogprobs lp = compute_logprobs(l, target, 5);
  std::vector<double> ref = softmax(l);
  EXPECT_NEAR(lp.chosen.logprob, std::log(ref[target]), 1e-4);
  int rank = 1;
  for (double q : ref) rank += q > ref[target] ? 1 : 0;
  EXPECT_EQ(lp.chosen.rank, rank);
  ASSERT_EQ(lp.top.size(), 5u);
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[i].token_id, order[i]);
    EXPECT_NEAR(lp.top[i].logprob, std::log(ref[order[i]]), 1e-4);
    EXPECT_EQ(lp.top[i].rank, i + 1);
  }
  EXPECT_TRUE(compute_logprobs(l, target, 0).top.empty());
}

class CpuSamplerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::unique_ptr<Sampler> sampler = make_cpu_sampler(*backend);
};

TEST_F(CpuSamplerTest, SeededRowsDoNotDependOnTheRestOfTheBatch) {
  const int vocab = 64;
  SamplingParams seeded;
  seeded.temperature = 1.0f;
  seeded.top_p = 0.95f;
  std::vector<float> mine = random_logits(vocab, 7, 1.0f);

  // Alone.
  SamplingRow r = row_for(seeded);
  r.seed = 1234;
  r.position = 10;
  Tensor alone = Tensor::from_f32(mine, {1, vocab});
  const int32_t t_alone = sampler->sample(alone, std::vector<SamplingRow>{r})[0].token;

  // Third row of a batch with other requests (other seeds, greedy, penalties) around it.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams penal;
  penal.repetition_penalty = 1.3f;
  std::vector<float> batch;
  for (uint32_t s : {1u, 2u}) {
    auto o = random_logits(vocab, s);
    batch.insert(batch.end(), o.begin(), o.end());
  }
  batch.insert(batch.end(), mine.begin(), mine.end());
  auto o = random_logits(vocab, 3);
  batch.insert(batch.end(), o.begin(), o.end());
  std::vector<SamplingRow> rows(4);
  rows[0] = row_for(greedy);
  rows[1] = row_for(penal);
  rows[1].seed = 99;
  rows[2] = r;
  rows[3] = row_for(seeded);
  rows[3].seed = 5;
  for (int i = 0; i < 4; ++i) rows[i].logits_row = i;
  Tensor t = Tensor::from_f32(batch, {4, vocab});
  EXPECT_EQ(sampler->sample(t, rows)[2].token, t_alone);

  // And across positions the draws differ (a seeded request does not repeat one token).
  std::map<int32_t, int> seen;
  for (int pos = 0; pos < 50; ++pos) {
    r.position = pos;
    seen[sampler->sample(alone, std::vector<SamplingRow>{r})[0].token] += 1;
  }
  EXPECT_GT(seen.size(), 5u);
}

TEST_F(CpuSamplerTest, ReturnsRawLogprobsOfTheSampledToken) {
  const int vocab = 32;
  std::vector<float> l = random_logits(vocab, 8);
  SamplingParams p;
  p.temperature = 0.5f;  // logprobs come from the raw logits, not the tempered ones
  p.logprobs = 3;
  SamplingRow r = row_for(p);
  r.seed = 1;
  r.logprobs = p.logprobs;
  auto out = sampler->sample(Tensor::from_f32(l, {1, vocab}), std::vector<SamplingRow>{r});
  ASSERT_TRUE(out[0].logprobs.has_value());
  std::vector<double> ref = softmax(l);
  EXPECT_EQ(out[0].logprobs->chosen.token_id, out[0].token);
  EXPECT_NEAR(out[0].logprobs->chosen.logprob, std::log(ref[out[0].token]), 1e-5);
  EXPECT_EQ(out[0].logprobs->top.size(), 3u);

  std::vector<int> rows = {0};
  std::vector<int32_t> targets = {4};
  auto lp = sampler->logprobs_of(Tensor::from_f32(l, {1, vocab}), rows, targets, 2);
  ASSERT_EQ(lp.size(), 1u);
  EXPECT_NEAR(lp[0].chosen.logprob, std::log(ref[4]), 1e-5);
  EXPECT_EQ(lp[0].top.size(), 2u);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

TEST(SamplingMath, MinusOneLogprobsMeansTheWholeVocabulary) {
  std::vector<float> l = random_logits(50, 9);
  PositionLogprobs lp = compute_logprobs(l, 3, -1);
  ASSERT_EQ(lp.top.size(), 50u);
  double total = 0;
  for (const TokenLogprob& t : lp.top) total += std::exp(t.logprob);
  EXPECT_NEAR(total, 1.0, 1e-5);
}

}  // namespace
}  // namespace specula
