// Whole-model check on the GPU: the Llama-family fixtures (tiny random checkpoints saved by
// transformers 5, tests/fixtures/models/<variant>) run through create_model on the CUDA backend
// (bf16 weights and activations, fp32 accumulation) and are compared with the transformers fp32
// logits in reference.safetensors, for a plain prefill of each prompt and for the engine's
// schedule (chunked prefill of all prompts in shared batches, padding rows); decode steps
// (teacher-forced on the reference greedy tokens) are compared with the CPU backend's fp32
// forward, which test_model checks against transformers.
//
// Tolerance: max |gpu - ref| <= 3e-2 * max |ref| per prompt. The fixtures use large random
// weights (init range 0.5), so every bf16 rounding (relative 2^-9) of weights and activations is
// amplified through two layers of attention with peaked softmaxes; fp32 needs 1e-3 (test_model).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>

#include "backend/backend.h"
#include "cuda_test_util.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test_paths.h"
#include "unit/model/forward_runner.h"

namespace specula {
namespace {

using testing::PagedRunner;

constexpr double kTolerance = 3e-2;

struct Reference {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> logits;  // [T, V]
};

std::vector<Reference> load_reference(const std::filesystem::path& file) {
  auto st = SafetensorsFile::open(file);
  auto read = [&](const std::string& name, auto* out) {
    const SafetensorsEntry* e = st->find(name);
    if (e == nullptr) return false;
    out->resize(e->nbytes() / 4);
    std::memcpy(out->data(), st->data(*e), e->nbytes());
    return true;
  };
  std::vector<Reference> refs;
  for (int i = 0;; ++i) {
    Reference r;
    if (!read("prompt_" + std::to_string(i), &r.prompt)) break;
    SPECULA_CHECK(read("logits_" + std::to_string(i), &r.logits) && read("greedy_" + std::to_string(i), &r.greedy),
                  "{}: prompt_{} lacks logits or greedy tokens", file.string(), i);
    refs.push_back(std::move(r));
  }
  return refs;
}

// max |got - want| / max |want|.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return worst / scale;
}

class CudaForward : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    dir_ = specula::testing::fixtures_dir() / "models" / GetParam();
    config_ = load_model_config(dir_);
    weights_ = open_safetensors_checkpoint(dir_);
    gpu_ = make_cuda_backend(0);
    model_ = create_model(config_, *weights_, *gpu_);
    refs_ = load_reference(dir_ / "reference.safetensors");
    ASSERT_FALSE(refs_.empty());
  }
  void report(const std::string& what, double err) {
    std::cout << "[ cuda-model ] " << GetParam() << " " << what << ": max |err| / max |ref| = " << err << "\n";
  }

  std::filesystem::path dir_;
  ModelConfig config_;
  std::unique_ptr<WeightSource> weights_;
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Model> model_;
  std::vector<Reference> refs_;
};

TEST_P(CudaForward, PrefillLogitsMatchTransformers) {
  for (size_t i = 0; i < refs_.size(); ++i) {
    PagedRunner runner(*model_, *gpu_, /*num_blocks=*/16, /*block_size=*/16, /*seed=*/static_cast<unsigned>(i));
    runner.feed(0, refs_[i].prompt);
    auto logits = runner.step({{0, static_cast<int64_t>(refs_[i].prompt.size()), true}})[0];
    ASSERT_EQ(logits.size(), refs_[i].logits.size());
    const double err = relative_error(logits, refs_[i].logits);
    report("prefill prompt " + std::to_string(i), err);
    EXPECT_LE(err, kTolerance) << GetParam() << " prompt " << i;
  }
}

TEST_P(CudaForward, ChunkedBatchedScheduleMatchesTransformers) {
  const int n = static_cast<int>(refs_.size());
  PagedRunner runner(*model_, *gpu_, /*num_blocks=*/48, /*block_size=*/16, /*seed=*/99);
  std::vector<std::vector<float>> prompt_logits(n);
  for (int s = 0; s < n; ++s) runner.feed(s, refs_[s].prompt);
  const int64_t chunk_sizes[] = {5, 11, 8, 16, 3};
  for (int step = 0;; ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < n; ++s) {
      const int64_t left = runner.pending(s);
      if (left > 0) work.push_back({s, std::min(left, chunk_sizes[(step + s) % 5]), true});
    }
    if (work.empty()) break;
    auto out = runner.step(work, step % 2);
    for (size_t w = 0; w < work.size(); ++w) {
      auto& dst = prompt_logits[work[w].seq];
      dst.insert(dst.end(), out[w].begin(), out[w].end());
    }
  }
  for (int s = 0; s < n; ++s) {
    ASSERT_EQ(prompt_logits[s].size(), refs_[s].logits.size());
    const double err = relative_error(prompt_logits[s], refs_[s].logits);
    report("chunked prompt " + std::to_string(s), err);
    EXPECT_LE(err, kTolerance) << GetParam() << " prompt " << s;
  }
}

// Decode steps of all prompts in one batch, fed the reference greedy tokens, against the CPU.
TEST_P(CudaForward, TeacherForcedDecodeMatchesCpu) {
  auto cpu = make_cpu_backend(2);
  auto cpu_weights = open_safetensors_checkpoint(dir_);
  auto cpu_model = create_model(config_, *cpu_weights, *cpu);
  const int n = static_cast<int>(refs_.size());
  PagedRunner gpu_runner(*model_, *gpu_, 48, 16, 7), cpu_runner(*cpu_model, *cpu, 48, 16, 8);
  std::vector<PagedRunner::Work> prefill;
  for (int s = 0; s < n; ++s) {
    gpu_runner.feed(s, refs_[s].prompt);
    cpu_runner.feed(s, refs_[s].prompt);
    prefill.push_back({s, static_cast<int64_t>(refs_[s].prompt.size()), false});
  }
  gpu_runner.step(prefill);
  cpu_runner.step(prefill);
  double worst = 0;
  for (size_t step = 0; step < refs_[0].greedy.size(); ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < n; ++s) {
      if (step >= refs_[s].greedy.size()) continue;
      gpu_runner.feed(s, {refs_[s].greedy[step]});
      cpu_runner.feed(s, {refs_[s].greedy[step]});
      work.push_back({s, 1, false});
    }
    auto got = gpu_runner.step(work, static_cast<int>(step % 3));
    auto want = cpu_runner.step(work);
    for (size_t w = 0; w < work.size(); ++w) {
      const double err = relative_error(got[w], want[w]);
      worst = std::max(worst, err);
      EXPECT_LE(err, kTolerance) << GetParam() << " decode step " << step << " sequence " << work[w].seq;
    }
  }
  report("teacher-forced decode (worst step)", worst);
}

INSTANTIATE_TEST_SUITE_P(LlamaFamily, CudaForward,
                         ::testing::Values("llama", "llama3_rope_old_style", "llama3_rope_new_style",
                                           "llama_linear_rope_type_key", "qwen2_bias_tied", "qwen3_qknorm_headdim",
                                           "qwen3_yarn_tied", "mistral_sharded"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace specula
