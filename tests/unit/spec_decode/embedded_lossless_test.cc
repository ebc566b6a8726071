// Losslessness on the embedded models' real distributions (specula-tiny as the target,
// specula-tiny-draft as the draft, temperature 1, top_k 8 applied to both): 24,000 two-token
// continuations of a fixed prompt, each drafted by the CPU DraftSampler (x1 ~ q1, x2 ~ q2(. | x1))
// and verified by the CPU RejectionSampler, must follow the target's exact distribution
// p1(y1) p2(y2 | y1) (chi-square, fixed seeds); broken verifiers must fail the same test.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <map>

#include "unit/sampling/broken_samplers.h"
#include "unit/sampling/chi_square.h"
#include "sampling/sampling_math.h"
#include "model/model.h"
#include "model_logits.h"
#include "model/weight_source.h"
#include "sampling/draft_sampler.h"
#include "sampling/rejection_sampler.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

struct Distributions {
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<int32_t> support;          // tokens either model may produce first
  std::map<int32_t, int> index;          // support token -> its index
  Tensor target_logits, draft_logits;    // rows: [prompt, prompt + support[i] ...]
  Tensor q_table;                        // rows 2i, 2i + 1: q1 and q2(. | support[i])
  std::vector<float> p1;
  std::vector<std::vector<float>> p2;    // by support index
};

SamplingRow row(const Distributions& s, int logits_row, int64_t position, std::span<const int32_t> output, uint64_t seed) {
  SamplingRow r;
  r.logits_row = logits_row;
  r.params = &s.params;
  r.seed = seed;
  r.position = position;
  r.prompt_token_ids = s.prompt;
  r.output_token_ids = output;
  return r;
}

std::vector<float> final_of(const std::vector<float>& raw, const SamplingRow& r) {
  std::vector<float> p = raw;
  logits_to_probs(p, r);
  return p;
}

Distributions load_distributions(Backend& backend) {
  const fs::path tiny = testing::models_dir() / "specula-tiny", draft_dir = testing::models_dir() / "specula-tiny-draft";
  auto tok = Tokenizer::from_dir(tiny);
  auto target = create_model(load_model_config(tiny), *open_safetensors_checkpoint(tiny), backend);
  auto draft = create_model(load_model_config(draft_dir), *open_safetensors_checkpoint(draft_dir), backend);
  Distributions s;
  // Which module comes next is uncertain, and the draft is not sure of the same ones.
  s.prompt = tok->encode("import os\nimport sys\nimport ");
  s.params.temperature = 1.0f;
  s.params.top_k = 8;
  const std::vector<float> t0 = testing::last_logits(*target, backend, {s.prompt})[0];
  const std::vector<float> d0 = testing::last_logits(*draft, backend, {s.prompt})[0];
  const SamplingRow r0 = row(s, 0, static_cast<int64_t>(s.prompt.size()), {}, 0);
  s.p1 = final_of(t0, r0);
  const std::vector<float> q1 = final_of(d0, r0);
  for (int32_t v = 0; v < static_cast<int32_t>(s.p1.size()); ++v)
    if (s.p1[v] > 0 || q1[v] > 0) {
      s.index[v] = static_cast<int>(s.support.size());
      s.support.push_back(v);
    }
  std::vector<std::vector<int32_t>> seqs;
  for (int32_t v : s.support) {
    seqs.push_back(s.prompt);
    seqs.back().push_back(v);
  }
  const auto t1 = testing::last_logits(*target, backend, seqs), d1 = testing::last_logits(*draft, backend, seqs);
  const int64_t V = static_cast<int64_t>(t0.size()), n = static_cast<int64_t>(s.support.size());
  std::vector<float> tl(t0), dl(d0), qt;
  for (int64_t i = 0; i < n; ++i) {
    tl.insert(tl.end(), t1[i].begin(), t1[i].end());
    dl.insert(dl.end(), d1[i].begin(), d1[i].end());
    const int32_t x = s.support[i];
    const SamplingRow r1 = row(s, 0, static_cast<int64_t>(s.prompt.size()) + 1, std::span<const int32_t>(&x, 1), 0);
    s.p2.push_back(final_of(t1[i], r1));
    const std::vector<float> q2 = final_of(d1[i], r1);
    qt.insert(qt.end(), q1.begin(), q1.end());
    qt.insert(qt.end(), q2.begin(), q2.end());
  }
  s.target_logits = Tensor::from_f32(tl, {n + 1, V});
  s.draft_logits = Tensor::from_f32(dl, {n + 1, V});
  s.q_table = Tensor::from_f32(qt, {2 * n, V});
  return s;
}

struct Outcome {
  testing::ChiSquareResult chi;
  double acceptance = 0.0;  // of the first draft
};

Outcome run(const Distributions& s, RejectionSampler& verifier, int num_samples, Backend& backend) {
  auto drafter = make_cpu_draft_sampler(backend);
  const int64_t P = static_cast<int64_t>(s.prompt.size());
  // x1 ~ q1 and x2 ~ q2(. | x1) for every seed, with the DraftSampler's own draws.
  std::vector<DraftSampleRow> rows1;
  for (int seed = 0; seed < num_samples; ++seed) rows1.push_back({row(s, 0, P, {}, seed), -1});
  const std::vector<int32_t> x1 = drafter->sample(s.draft_logits, rows1, nullptr);
  std::vector<DraftSampleRow> rows2;
  for (int seed = 0; seed < num_samples; ++seed)
    rows2.push_back({row(s, 1 + s.index.at(x1[seed]), P + 1, std::span<const int32_t>(&x1[seed], 1), seed), -1});
  const std::vector<int32_t> x2 = drafter->sample(s.draft_logits, rows2, nullptr);

  std::vector<std::array<SamplingRow, 3>> vrows(static_cast<size_t>(num_samples));
  std::vector<std::array<int32_t, 2>> drafts(static_cast<size_t>(num_samples));
  std::vector<VerifyRequest> reqs;
  for (int seed = 0; seed < num_samples; ++seed) {
    drafts[seed] = {x1[seed], x2[seed]};
    const int i = s.index.at(x1[seed]);
    const std::span<const int32_t> out(drafts[seed].data(), 1), out2(drafts[seed].data(), 2);
    // The bonus row is a stand-in (only two tokens are counted).
    vrows[seed] = {row(s, 0, P, {}, seed), row(s, 1 + i, P + 1, out, seed), row(s, 1 + i, P + 2, out2, seed)};
    reqs.push_back(VerifyRequest{vrows[seed], drafts[seed], 2 * i});
  }
  const std::vector<VerifyResult> res = verifier.verify(s.target_logits, &s.q_table, reqs);

  std::map<std::pair<int, int32_t>, int64_t> counts;  // (support index of y1, y2)
  int64_t accepted_first = 0;
  bool impossible = false;
  for (int seed = 0; seed < num_samples; ++seed) {
    const int32_t y1 = res[seed].tokens[0];
    accepted_first += y1 == x1[seed] ? 1 : 0;
    if (!s.index.count(y1) || s.p1[y1] <= 0) {
      impossible = true;
      continue;
    }
    const int i = s.index.at(y1);
    // Without a second token from verification, the next step samples position P + 1 from the
    // target, as without speculation.
    const int32_t y2 = res[seed].tokens.size() >= 2 ? res[seed].tokens[1]
                                                    : sample_from_probs(s.p2[i], uniform_draw(seed, P + 1));
    if (s.p2[i][y2] <= 0) {
      impossible = true;
      continue;
    }
    counts[{i, y2}] += 1;
  }
  std::vector<int64_t> observed;
  std::vector<double> expected;
  for (size_t i = 0; i < s.support.size(); ++i) {
    if (s.p1[s.support[i]] <= 0) continue;
    for (int32_t y2 = 0; y2 < static_cast<int32_t>(s.p2[i].size()); ++y2) {
      if (s.p2[i][y2] <= 0) continue;
      auto it = counts.find({static_cast<int>(i), y2});
      observed.push_back(it == counts.end() ? 0 : it->second);
      expected.push_back(static_cast<double>(s.p1[s.support[i]]) * s.p2[i][y2]);
    }
  }
  Outcome o;
  o.chi = testing::chi_square_test(observed, expected);
  if (impossible) o.chi.p_value = 0.0;
  o.acceptance = static_cast<double>(accepted_first) / num_samples;
  return o;
}

TEST(EmbeddedLossless, DraftModelSamplingFollowsTheTargetExactly) {
  const fs::path tiny = testing::models_dir() / "specula-tiny", draft = testing::models_dir() / "specula-tiny-draft";
  ASSERT_TRUE(fs::exists(tiny / "model.safetensors") && fs::exists(draft / "model.safetensors")) << "committed embedded models missing";
  auto backend = make_cpu_backend(0);
  const Distributions s = load_distributions(*backend);
  const int n = 24000;
  auto real = make_cpu_rejection_sampler(*backend);
  const Outcome ok = run(s, *real, n, *backend);
  EXPECT_GT(ok.chi.p_value, 1e-3) << "chi2 " << ok.chi.statistic << " dof " << ok.chi.dof;
  EXPECT_GE(ok.chi.cells, 10);
  // The draft is a real draft: often right, often wrong.
  EXPECT_GT(ok.acceptance, 0.2);
  EXPECT_LT(ok.acceptance, 0.95);

  testing::AlwaysAccept always;
  const Outcome a = run(s, always, n, *backend);
  EXPECT_LT(a.chi.p_value, 1e-6) << "chi2 " << a.chi.statistic;
  testing::ResampleFromP from_p;
  const Outcome b = run(s, from_p, n, *backend);
  EXPECT_LT(b.chi.p_value, 1e-6) << "chi2 " << b.chi.statistic;
}

}  // namespace
}  // namespace specula
