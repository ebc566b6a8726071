// Whole-model DeepSeek on the GPU: every tests/fixtures/models/deepseek_* checkpoint (V2 greedy and
// group-limited routing, V3 with and without q LoRA, yarn) and the embedded specula-tiny-moe run
// through create_model on the CUDA backend — absorbed MLA over the latent paged cache (copy_columns,
// head_linear, the MLA form of write_kv_cache / paged_attention), moe_route and fused_moe — with
// shared-expert fusion off, 1 and 2 replicas:
//  - prefill logits and the engine's schedule (chunked prefill in shared batches, padding rows)
//    against the transformers references, with the MoE routing of the GPU and of the emulation
//    pinned to the fp32 CPU forward's (deepseek_routing_pin.h says why: a bf16 near tie in the
//    router may go either way, and then the logits jump); every row routed differently is
//    printed, and on the GPU it must be a near tie within twice the emulation's router-logit
//    deviation;
//  - teacher-forced batched decode against the CPU backend's fp32 forward, routing pinned the
//    same way;
//  - fusion 1 and 2 against fusion 0 on the GPU: logits at every step of a greedy decode, and the
//    same greedy tokens.
//
// Tolerance, as in cuda_model_test.cc (which explains it): each comparison is held to the
// deviation e_emu of Bf16EmulatedBackend (exact fp32 ops, bf16 storage, rounded where the GPU
// rounds, fused_moe included) from the same reference: max |gpu - ref| / max |ref| <= 2 e_emu +
// 0.01. Greedy tokens of the fused runs must equal the unfused run's; the only difference allowed
// is at a step whose top-two margin is below that tolerance (a bf16 near-tie), and it is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "backend/backend.h"
#include "bf16_emulated_backend.h"
#include "cuda_test_util.h"
#include "deepseek_routing_pin.h"
#include "model/config.h"
#include "model/model.h"
#include "test_paths.h"
#include "unit/model/deepseek_test_util.h"
#include "unit/relative_error.h"

namespace specula {
namespace {

using testing::DeepseekReference;
using testing::PagedRunner;
using testing::RoutingPin;

struct Case {
  std::string name;
  std::string model;
  std::string reference;
  int fusion;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Case fixture(const std::string& variant, int fusion) {
  const auto dir = specula::testing::fixtures_dir() / "models" / variant;
  return {variant + "_fusion" + std::to_string(fusion), dir.string(), (dir / "reference.safetensors").string(), fusion};
}

Case tiny_moe(int fusion) {
  return {"specula_tiny_moe_fusion" + std::to_string(fusion),
          (specula::testing::models_dir() / "specula-tiny-moe").string(),
          (specula::testing::fixtures_dir() / "embedded" / "specula-tiny-moe" / "reference.safetensors").string(),
          fusion};
}

std::vector<Case> cases_with_fusion(std::initializer_list<int> fusions) {
  std::vector<Case> cases;
  for (int fusion : fusions) {
    for (const char* v : {"deepseek_v2_greedy", "deepseek_v2_group_limited", "deepseek_v3", "deepseek_v3_no_qlora"})
      cases.push_back(fixture(v, fusion));
    cases.push_back(tiny_moe(fusion));
  }
  return cases;
}

using testing::relative_error;

struct Loaded {
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<Model> model;
};

Loaded load(const ModelConfig& config, const std::string& dir, Backend& backend, int fusion) {
  Loaded l;
  l.weights = open_safetensors_checkpoint(dir);
  l.model = create_model(config, *l.weights, backend, ModelOptions{fusion});
  return l;
}

class CudaDeepseek : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    const Case& c = GetParam();
    ASSERT_TRUE(std::filesystem::exists(c.reference)) << c.reference;
    config_ = load_model_config(c.model);
    gpu_ = make_cuda_backend(0);
    cpu_ = make_cpu_backend(2);
    gpu_pin_ = std::make_unique<RoutingPin>(*gpu_);
    emu_pin_ = std::make_unique<RoutingPin>(emu_);
    cpu_record_ = std::make_unique<RoutingPin>(*cpu_);
    gpu_model_ = load(config_, c.model, *gpu_pin_, c.fusion);
    emu_model_ = load(config_, c.model, *emu_pin_, c.fusion);
    cpu_model_ = load(config_, c.model, *cpu_record_, c.fusion);
    refs_ = testing::load_deepseek_reference(c.reference);
    ASSERT_FALSE(refs_.empty());
  }

  std::vector<float> referenced(const DeepseekReference& ref, const std::vector<float>& all) const {
    return ref.logits_pos.empty() ? all : testing::select_rows(all, config_.vocab_size, ref.logits_pos);
  }

  // run(model, backend) on the fp32 CPU, recording its routing, then on the emulation and on the
  // GPU with that routing pinned; returns {cpu, emulation, gpu}. Every row routed differently is
  // printed; the GPU's must be near ties within twice the emulation's router-logit deviation in
  // that moe_route call (the emulation's are bf16 rounding by construction).
  template <typename Run>
  auto run_pinned(const std::string& what, Run run) {
    cpu_record_->record();
    auto cpu = run(*cpu_model_.model, *cpu_record_);
    emu_pin_->pin(cpu_record_->calls(), {});
    auto emu = run(*emu_model_.model, *emu_pin_);
    std::vector<double> bounds;
    for (double d : emu_pin_->deviations()) bounds.push_back(2 * d);
    gpu_pin_->pin(cpu_record_->calls(), bounds);
    auto gpu = run(*gpu_model_.model, *gpu_pin_);
    const std::string name = GetParam().name + " " + what;
    for (const auto& p : emu_pin_->pinned())
      std::cout << "[ cuda-deepseek ] " << name << ": bf16 emulation pinned at " << p.describe() << "\n";
    for (const auto& p : gpu_pin_->pinned()) {
      std::cout << "[ cuda-deepseek ] " << name << ": gpu pinned at " << p.describe() << "\n";
      EXPECT_TRUE(p.near_tie) << name << ": the GPU routes " << p.describe();
    }
    for (RoutingPin* r : {cpu_record_.get(), emu_pin_.get(), gpu_pin_.get()}) r->pass_through();
    return std::make_tuple(std::move(cpu), std::move(emu), std::move(gpu));
  }

  // The fp32 CPU forward, whose routing the others follow, must be transformers' (as in
  // test_model's deepseek_fixtures_test); the GPU is held to the emulation's deviation.
  void check(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& emu,
             const std::vector<float>& cpu, const std::vector<float>& ref) {
    ASSERT_EQ(gpu.size(), ref.size()) << what;
    ASSERT_EQ(emu.size(), ref.size()) << what;
    ASSERT_EQ(cpu.size(), ref.size()) << what;
    const double e_gpu = relative_error(gpu, ref), e_emu = relative_error(emu, ref), e_cpu = relative_error(cpu, ref);
    std::cout << "[ cuda-deepseek ] " << GetParam().name << " " << what << ": gpu " << e_gpu << ", bf16 emulation "
              << e_emu << ", fp32 cpu " << e_cpu << "\n";
    EXPECT_LE(e_cpu, 1e-3) << GetParam().name << " " << what << ": the fp32 CPU forward is not transformers'";
    EXPECT_LE(e_gpu, 2 * e_emu + 0.01) << GetParam().name << " " << what << " (bf16 emulation: " << e_emu << ")";
  }

  ModelConfig config_;
  std::unique_ptr<Backend> gpu_, cpu_;
  testing::Bf16EmulatedBackend emu_;
  std::unique_ptr<RoutingPin> gpu_pin_, emu_pin_, cpu_record_;
  Loaded gpu_model_, emu_model_, cpu_model_;
  std::vector<DeepseekReference> refs_;
};

TEST_P(CudaDeepseek, PrefillLogitsMatchTransformers) {
  for (size_t i = 0; i < refs_.size(); ++i) {
    const auto& ref = refs_[i];
    const std::string what = "prefill prompt " + std::to_string(i);
    auto [cpu, emu, gpu] = run_pinned(what, [&](Model& model, Backend& backend) {
      return testing::run_prompt(model, backend, ref.prompt, 0, static_cast<unsigned>(i));
    });
    check(what, referenced(ref, gpu.prompt_logits), referenced(ref, emu.prompt_logits),
          referenced(ref, cpu.prompt_logits), ref.logits);
  }
}

TEST_P(CudaDeepseek, ChunkedBatchedScheduleMatchesTransformers) {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : refs_) prompts.push_back(r.prompt);
  auto [cpu, emu, gpu] = run_pinned("chunked schedule", [&](Model& model, Backend& backend) {
    return testing::run_schedule(model, backend, prompts, 0);
  });
  for (size_t s = 0; s < refs_.size(); ++s) {
    check("chunked prompt " + std::to_string(s), referenced(refs_[s], gpu[s].prompt_logits),
          referenced(refs_[s], emu[s].prompt_logits), referenced(refs_[s], cpu[s].prompt_logits), refs_[s].logits);
  }
}

// Decode steps of all prompts in one batch, fed the reference greedy tokens: the GPU and the bf16
// emulation against the CPU backend's fp32 forward, worst step of each sequence. Each step runs
// the CPU first and pins the others' routing to it; the GPU's steps carry padding rows.
TEST_P(CudaDeepseek, TeacherForcedDecodeMatchesCpu) {
  const int n = static_cast<int>(refs_.size());
  PagedRunner gpu_runner(*gpu_model_.model, *gpu_pin_, 48, 16, 7), emu_runner(*emu_model_.model, *emu_pin_, 48, 16, 8),
      cpu_runner(*cpu_model_.model, *cpu_record_, 48, 16, 9);
  auto pinned_step = [&](const std::vector<PagedRunner::Work>& work, int gpu_padding, const std::string& what) {
    return run_pinned(what, [&](Model&, Backend& backend) {
      if (&backend == gpu_pin_.get()) return gpu_runner.step(work, gpu_padding);
      return (&backend == emu_pin_.get() ? emu_runner : cpu_runner).step(work);
    });
  };
  std::vector<PagedRunner::Work> prefill;
  for (int s = 0; s < n; ++s) {
    for (PagedRunner* r : {&gpu_runner, &emu_runner, &cpu_runner}) r->feed(s, refs_[s].prompt);
    prefill.push_back({s, static_cast<int64_t>(refs_[s].prompt.size()), false});
  }
  pinned_step(prefill, 0, "decode prefill");
  std::vector<double> worst_gpu(n, 0.0), worst_emu(n, 0.0);
  size_t steps = 0;
  for (const auto& r : refs_) steps = std::max(steps, r.greedy.size());
  for (size_t step = 0; step < steps; ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < n; ++s) {
      if (step >= refs_[s].greedy.size()) continue;
      for (PagedRunner* r : {&gpu_runner, &emu_runner, &cpu_runner}) r->feed(s, {refs_[s].greedy[step]});
      work.push_back({s, 1, false});
    }
    auto [want, emu, got] = pinned_step(work, static_cast<int>(step % 3), "decode step " + std::to_string(step));
    for (size_t w = 0; w < work.size(); ++w) {
      const int s = work[w].seq;
      worst_gpu[s] = std::max(worst_gpu[s], relative_error(got[w], want[w]));
      worst_emu[s] = std::max(worst_emu[s], relative_error(emu[w], want[w]));
    }
  }
  for (int s = 0; s < n; ++s) {
    std::cout << "[ cuda-deepseek ] " << GetParam().name << " decode sequence " << s << " (worst step): gpu "
              << worst_gpu[s] << ", bf16 emulation " << worst_emu[s] << "\n";
    EXPECT_LE(worst_gpu[s], 2 * worst_emu[s] + 0.01) << GetParam().name << " decode sequence " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Deepseek, CudaDeepseek, ::testing::ValuesIn(cases_with_fusion({0, 1, 2})),
                         [](const auto& info) { return info.param.name; });

// ---- shared-expert fusion on the GPU: fusion 1 / 2 against fusion 0 ----

// Logits of the prompt's last position, then of each of `tokens` fed one decode step at a time;
// with `tokens` empty, the greedy continuation of `steps` tokens is generated (and returned).
struct StepLogits {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

StepLogits decode_steps(Model& model, Backend& backend, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& forced, size_t steps) {
  const int64_t v = model.config().vocab_size;
  PagedRunner runner(model, backend, /*num_blocks=*/16, /*block_size=*/16, /*seed=*/3);
  runner.feed(0, prompt);
  StepLogits run;
  run.logits.push_back(runner.step({{0, static_cast<int64_t>(prompt.size()), false}})[0]);
  for (size_t n = 0; n < steps; ++n) {
    run.tokens.push_back(forced.empty() ? testing::argmax(run.logits.back().data(), v) : forced[n]);
    runner.feed(0, {run.tokens.back()});
    run.logits.push_back(runner.step({{0, 1, false}})[0]);
  }
  return run;
}

// (top1 - top2) / max |logit|.
double relative_margin(const std::vector<float>& logits) {
  double first = -INFINITY, second = -INFINITY, scale = 0;
  for (float x : logits) {
    scale = std::max(scale, std::fabs(double(x)));
    if (x > first) {
      second = first;
      first = x;
    } else if (x > second) {
      second = x;
    }
  }
  return (first - second) / scale;
}

class CudaDeepseekFusion : public ::testing::TestWithParam<Case> {};

// The unfused GPU run generates greedy tokens; the fused GPU run and both emulated runs are fed
// the same tokens, so every step compares the two GPU runs on identical inputs: their logits must
// agree within the tolerance that the emulation's own fused-vs-unfused difference at that step
// sets, and the fused run must pick the same greedy token unless the unfused run's top-two margin
// is below that tolerance (a bf16 near-tie; printed).
TEST_P(CudaDeepseekFusion, FusedSharedExpertGivesTheUnfusedGreedyTokens) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  ASSERT_GT(c.fusion, 0);
  const ModelConfig config = load_model_config(c.model);
  auto gpu = make_cuda_backend(0);
  testing::Bf16EmulatedBackend emu;
  Loaded gpu_fused = load(config, c.model, *gpu, c.fusion), gpu_plain = load(config, c.model, *gpu, 0);
  Loaded emu_fused = load(config, c.model, emu, c.fusion), emu_plain = load(config, c.model, emu, 0);
  const auto refs = testing::load_deepseek_reference(c.reference);
  ASSERT_FALSE(refs.empty());
  constexpr size_t kSteps = 8;
  const int64_t v = config.vocab_size;
  for (size_t i = 0; i < refs.size(); ++i) {
    const std::string what = c.name + " prompt " + std::to_string(i);
    const auto& prompt = refs[i].prompt;
    const StepLogits plain = decode_steps(*gpu_plain.model, *gpu, prompt, {}, kSteps);
    const StepLogits fused = decode_steps(*gpu_fused.model, *gpu, prompt, plain.tokens, kSteps);
    const StepLogits emu_p = decode_steps(*emu_plain.model, emu, prompt, plain.tokens, kSteps);
    const StepLogits emu_f = decode_steps(*emu_fused.model, emu, prompt, plain.tokens, kSteps);
    for (size_t step = 0; step <= kSteps; ++step) {
      const double e_gpu = relative_error(fused.logits[step], plain.logits[step]);
      const double e_emu = relative_error(emu_f.logits[step], emu_p.logits[step]);
      const double tolerance = 2 * e_emu + 0.01;
      std::cout << "[ cuda-deepseek ] " << what << " step " << step << ": fused vs unfused logits gpu " << e_gpu
                << ", bf16 emulation " << e_emu << "\n";
      EXPECT_LE(e_gpu, tolerance) << what << " step " << step;
      if (step == kSteps) break;  // the last logits choose no token here
      const int32_t got = testing::argmax(fused.logits[step].data(), v);
      if (got == plain.tokens[step]) continue;
      const double margin = relative_margin(plain.logits[step]);
      std::cout << "[ cuda-deepseek ] " << what << ": greedy token " << step << " differs (" << got << " vs "
                << plain.tokens[step] << "), unfused top-two margin " << margin << " of the logit scale\n";
      EXPECT_LT(margin, tolerance) << what << ": greedy token " << step << " differs though it is no near-tie";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Deepseek, CudaDeepseekFusion, ::testing::ValuesIn(cases_with_fusion({1, 2})),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace specula
