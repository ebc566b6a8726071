// Whole-model check on the GPU: the Llama-family fixtures (tiny random checkpoints saved by
// transformers 5, tests/fixtures/models/<variant>) run through create_model on the CUDA backend
// (bf16 weights and activations, fp32 accumulation) and are compared with the transformers fp32
// logits in reference.safetensors, for a plain prefill of each prompt and for the engine's
// schedule (chunked prefill of all prompts in shared batches, padding rows); decode steps
// (teacher-forced on the reference greedy tokens, all prompts in one batch) are compared with the
// CPU backend's fp32 forward, which test_model checks against transformers.
//
// Tolerance. The fixtures use large random weights (init range 0.5) so that every parameter
// matters; with them, bf16 rounding alone moves logits by 1-20% of their scale (attention logits
// in the tens, peaked softmaxes), measured by running the same forward on Bf16EmulatedBackend
// (exact fp32 ops, bf16 storage, rounded where the GPU rounds). A fixed "bf16 tolerance" would
// either fail exact arithmetic or wave through bugs on the well-conditioned fixtures, so each
// comparison is held to the emulator's own deviation e_emu from the same reference:
//     max |gpu - ref| / max |ref|  <=  2 e_emu + 0.01.
// On the Qwen3 fixtures (q/k norms keep attention logits small) e_emu is ~1-3%, so the GPU must
// be within a few percent; a kernel error (wrong head, key, mask or scale) moves logits by far
// more than that on every fixture. Each op is held to tight bounds in its own test.
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
#include "bf16_emulated_backend.h"
#include "unit/relative_error.h"

namespace specula {
namespace {

using testing::PagedRunner;

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

using testing::relative_error;

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
    emu_weights_ = open_safetensors_checkpoint(dir_);
    emu_model_ = create_model(config_, *emu_weights_, emu_);
  }
  // The GPU's deviation from a reference, against exact bf16 arithmetic's (see the header).
  void check(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& emu,
             const std::vector<float>& ref) {
    const double e_gpu = relative_error(gpu, ref), e_emu = relative_error(emu, ref);
    std::cout << "[ cuda-model ] " << GetParam() << " " << what << ": gpu " << e_gpu << ", bf16 emulation " << e_emu
              << "\n";
    EXPECT_LE(e_gpu, 2 * e_emu + 0.01) << GetParam() << " " << what << " (bf16 emulation: " << e_emu << ")";
  }

  std::filesystem::path dir_;
  ModelConfig config_;
  std::unique_ptr<WeightSource> weights_;
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Model> model_;
  std::vector<Reference> refs_;
  testing::Bf16EmulatedBackend emu_;
  std::unique_ptr<WeightSource> emu_weights_;
  std::unique_ptr<Model> emu_model_;
};

TEST_P(CudaForward, PrefillLogitsMatchTransformers) {
  for (size_t i = 0; i < refs_.size(); ++i) {
    std::vector<std::vector<float>> logits;
    for (auto [model, backend] : {std::pair<Model*, Backend*>{model_.get(), gpu_.get()}, {emu_model_.get(), &emu_}}) {
      PagedRunner runner(*model, *backend, /*num_blocks=*/16, /*block_size=*/16, /*seed=*/static_cast<unsigned>(i));
      runner.feed(0, refs_[i].prompt);
      logits.push_back(runner.step({{0, static_cast<int64_t>(refs_[i].prompt.size()), true}})[0]);
      ASSERT_EQ(logits.back().size(), refs_[i].logits.size());
    }
    check("prefill prompt " + std::to_string(i), logits[0], logits[1], refs_[i].logits);
  }
}

// All prompts prefilled in uneven chunks that share batches, with padding rows in some steps.
std::vector<std::vector<float>> chunked_prompt_logits(Model& model, Backend& backend, const std::vector<Reference>& refs) {
  const int n = static_cast<int>(refs.size());
  PagedRunner runner(model, backend, /*num_blocks=*/48, /*block_size=*/16, /*seed=*/99);
  std::vector<std::vector<float>> prompt_logits(n);
  for (int s = 0; s < n; ++s) runner.feed(s, refs[s].prompt);
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
  return prompt_logits;
}

TEST_P(CudaForward, ChunkedBatchedScheduleMatchesTransformers) {
  auto gpu = chunked_prompt_logits(*model_, *gpu_, refs_);
  auto emu = chunked_prompt_logits(*emu_model_, emu_, refs_);
  for (size_t s = 0; s < refs_.size(); ++s) {
    ASSERT_EQ(gpu[s].size(), refs_[s].logits.size());
    check("chunked prompt " + std::to_string(s), gpu[s], emu[s], refs_[s].logits);
  }
}

// Decode steps of all prompts in one batch, fed the reference greedy tokens: the GPU and the bf16
// emulation against the CPU backend's fp32 forward, worst step of each sequence.
TEST_P(CudaForward, TeacherForcedDecodeMatchesCpu) {
  auto cpu = make_cpu_backend(2);
  auto cpu_weights = open_safetensors_checkpoint(dir_);
  auto cpu_model = create_model(config_, *cpu_weights, *cpu);
  const int n = static_cast<int>(refs_.size());
  PagedRunner gpu_runner(*model_, *gpu_, 48, 16, 7), emu_runner(*emu_model_, emu_, 48, 16, 8),
      cpu_runner(*cpu_model, *cpu, 48, 16, 9);
  std::vector<PagedRunner::Work> prefill;
  for (int s = 0; s < n; ++s) {
    for (PagedRunner* r : {&gpu_runner, &emu_runner, &cpu_runner}) r->feed(s, refs_[s].prompt);
    prefill.push_back({s, static_cast<int64_t>(refs_[s].prompt.size()), false});
  }
  for (PagedRunner* r : {&gpu_runner, &emu_runner, &cpu_runner}) r->step(prefill);
  std::vector<double> worst_gpu(n, 0.0), worst_emu(n, 0.0);
  for (size_t step = 0; step < refs_[0].greedy.size(); ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < n; ++s) {
      if (step >= refs_[s].greedy.size()) continue;
      for (PagedRunner* r : {&gpu_runner, &emu_runner, &cpu_runner}) r->feed(s, {refs_[s].greedy[step]});
      work.push_back({s, 1, false});
    }
    auto got = gpu_runner.step(work, static_cast<int>(step % 3));
    auto emu = emu_runner.step(work);
    auto want = cpu_runner.step(work);
    for (size_t w = 0; w < work.size(); ++w) {
      const int s = work[w].seq;
      worst_gpu[s] = std::max(worst_gpu[s], relative_error(got[w], want[w]));
      worst_emu[s] = std::max(worst_emu[s], relative_error(emu[w], want[w]));
    }
  }
  for (int s = 0; s < n; ++s) {
    std::cout << "[ cuda-model ] " << GetParam() << " decode sequence " << s << " (worst step): gpu " << worst_gpu[s]
              << ", bf16 emulation " << worst_emu[s] << "\n";
    EXPECT_LE(worst_gpu[s], 2 * worst_emu[s] + 0.01) << GetParam() << " decode sequence " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaFamily, CudaForward,
                         ::testing::Values("llama", "llama3_rope_old_style", "llama3_rope_new_style",
                                           "llama_linear_rope_type_key", "qwen2_bias_tied", "qwen3_qknorm_headdim",
                                           "qwen3_yarn_tied", "mistral_sharded"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace specula
