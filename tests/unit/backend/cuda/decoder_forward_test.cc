// The fused decoder forward (Model::forward -> CudaBackend::decoder_forward, one persistent kernel)
// against the layer-by-layer forward of the same model, from the same caches: short prefills,
// decode steps, verification batches (several rows of one sequence, every row's logits), padding
// rows and lengths beyond one key split; the logits agree within bf16 rounding (the two paths
// round at the same points but sum in different orders) and so do the K/V the steps write.
// Models: the embedded target (real weights) and the Qwen3 fixtures (q/k norms, a head dim other
// than hidden / heads, tied embeddings). The other fixtures' large random weights (init range 0.5,
// attention logits in the tens) turn one bf16 rounding of difference into logits tens of percent
// apart between any two bf16 paths; their fused steps are held to transformers' logits instead,
// within the bf16 emulation's own deviation (cuda_model_test.cc, CudaForward: its decode steps
// run fused).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>

#include "model/model.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/model/forward_runner.h"
#include "unit/relative_error.h"

namespace specula {
namespace {

constexpr int kBlockSize = 16;

// SPECULA_FUSED_DECODER_FORWARD for one scope (the backend reads it on every forward).
struct FusedForward {
  explicit FusedForward(const char* value) { setenv("SPECULA_FUSED_DECODER_FORWARD", value, 1); }
  ~FusedForward() { unsetenv("SPECULA_FUSED_DECODER_FORWARD"); }
};

using testing::relative_error;

class DecoderForwardTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    const std::string name = GetParam();
    dir_ = name == "specula-tiny" ? testing::models_dir() / name : testing::fixtures_dir() / "models" / name;
    gpu_ = make_cuda_backend(0);
    weights_ = open_safetensors_checkpoint(dir_);
    model_ = create_model(load_model_config(dir_), *weights_, *gpu_);
    vocab_ = model_->config().vocab_size;
  }

  // One step of `work` on both runners (the fused one forced on, the other off), the same
  // tokens fed to both; returns the worst relative logits error of the step and counts argmax agreement.
  double step(testing::PagedRunner& fused, testing::PagedRunner& ref, const std::vector<testing::PagedRunner::Work>& work,
              int padding = 0) {
    std::vector<std::vector<float>> got, want;
    {
      FusedForward on("1");
      got = fused.step(work, padding);
    }
    {
      FusedForward off("0");
      want = ref.step(work, padding);
    }
    double worst = 0;
    for (size_t i = 0; i < work.size(); ++i) {
      const double error = relative_error(got[i], want[i]);
      worst = std::max(worst, error);
      worst_ = std::max(worst_, error);
      for (size_t r = 0; r * vocab_ < want[i].size(); ++r) {
        const float* g = got[i].data() + r * vocab_;
        const float* w = want[i].data() + r * vocab_;
        const int32_t a = testing::argmax(g, vocab_), b = testing::argmax(w, vocab_);
        ++rows_;
        if (a == b) ++same_argmax_;
        else EXPECT_LE(w[b] - w[a], 0.05f * std::max(1.0f, std::fabs(w[b]))) << "fused argmax " << a << ", layer path " << b;
      }
    }
    return worst;
  }

  void feed_both(testing::PagedRunner& a, testing::PagedRunner& b, int seq, const std::vector<int32_t>& tokens) {
    a.feed(seq, tokens);
    b.feed(seq, tokens);
  }

  std::filesystem::path dir_;
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<WeightSource> weights_;
  std::unique_ptr<Model> model_;
  int64_t vocab_ = 0;
  int rows_ = 0, same_argmax_ = 0;
  double worst_ = 0;
};

TEST_P(DecoderForwardTest, EqualsTheLayerByLayerForward) {
  // Two runners with one seed hand out the same blocks.
  testing::PagedRunner fused(*model_, *gpu_, 96, kBlockSize, 7), ref(*model_, *gpu_, 96, kBlockSize, 7);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(std::min<int64_t>(vocab_, 4096)) - 1);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = token(rng);
    return t;
  };
  // Rounding-order differences only: both paths round to bf16 at the same points. (A wrong head,
  // key, position or mask moves logits by tens of percent.)
  const double tolerance = 0.03;
  // Short prompts: the prefill itself runs fused (9 rows, 3 sequences).
  feed_both(fused, ref, 0, tokens(2));
  feed_both(fused, ref, 1, tokens(3));
  feed_both(fused, ref, 2, tokens(4));
  EXPECT_LE(step(fused, ref, {{0, 2, true}, {1, 3, true}, {2, 4, true}}), tolerance) << "short prefill";
  // A long prompt (layer by layer in both: more rows than the kernel takes), then decode steps.
  feed_both(fused, ref, 3, tokens(150));
  step(fused, ref, {{3, 150, false}});
  for (int s = 0; s < 6; ++s) {
    std::vector<testing::PagedRunner::Work> work;
    for (int q = 0; q < 4; ++q) {
      feed_both(fused, ref, q, tokens(1));
      work.push_back({q, 1, false});
    }
    EXPECT_LE(step(fused, ref, work, s % 2 == 0 ? 0 : 3), tolerance) << "decode step " << s;
  }
  // Verification batches: k + 1 rows of one sequence, every row's logits, beside a decode row.
  for (int k : {3, 7, 15}) {
    feed_both(fused, ref, 3, tokens(k + 1));
    std::vector<testing::PagedRunner::Work> work = {{3, k + 1, true}};
    if (k < 15) {
      feed_both(fused, ref, 0, tokens(1));
      work.push_back({0, 1, false});
    }
    EXPECT_LE(step(fused, ref, work), tolerance) << "verification of " << k + 1 << " rows";
  }
  std::cout << "[ fused-forward ] " << GetParam() << ": worst relative logits error " << worst_ << ", " << same_argmax_
            << " of " << rows_ << " argmaxes equal\n";
  EXPECT_GE(same_argmax_, rows_ - std::max(1, rows_ / 20)) << same_argmax_ << " of " << rows_ << " argmaxes equal";

  // The K/V written: the same entries in both caches, within the logits' bound.
  for (size_t l = 0; l < fused.kv().size(); ++l) {
    const double k = relative_error(testing::to_host(*gpu_, fused.kv()[l].k),
                                    testing::to_host(*gpu_, ref.kv()[l].k));
    const double v = relative_error(testing::to_host(*gpu_, fused.kv()[l].v),
                                    testing::to_host(*gpu_, ref.kv()[l].v));
    std::cout << "[ fused-forward ] " << GetParam() << " layer " << l << ": K " << k << ", V " << v << "\n";
    EXPECT_LE(k, tolerance) << "layer " << l << " K";
    EXPECT_LE(v, tolerance) << "layer " << l << " V";
  }
}

// One prompt's whole prefill in one forward, every row's logits, as the model's first step.
TEST_P(DecoderForwardTest, ShortPromptPrefillEqualsTheLayerByLayerForward) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(std::min<int64_t>(vocab_, 4096)) - 1);
  for (int n : {1, 5, 7, 12, 16}) {
    testing::PagedRunner fused(*model_, *gpu_, 16, kBlockSize, n), ref(*model_, *gpu_, 16, kBlockSize, n);
    std::vector<int32_t> prompt(static_cast<size_t>(n));
    for (int32_t& t : prompt) t = token(rng);
    feed_both(fused, ref, 0, prompt);
    EXPECT_LE(step(fused, ref, {{0, n, true}}), 0.03) << "a prompt of " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaFamily, DecoderForwardTest,
                         ::testing::Values("specula-tiny", "qwen3_qknorm_headdim", "qwen3_yarn_tied"));

// A forward without weights is declined (nothing runs).
TEST(DecoderForward, DeclinesWhatItIsNotFor) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  DecoderForward f;
  EXPECT_FALSE(gpu->decoder_forward(f));
}

}  // namespace
}  // namespace specula
