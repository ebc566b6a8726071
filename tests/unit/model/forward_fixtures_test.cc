// The Llama-family forward against transformers: tests/fixtures/models/<variant>/ holds a tiny
// random checkpoint saved by transformers 5 and reference.safetensors with, per prompt i,
// prompt_i (I32 [T]), logits_i (F32 [T, V], fp32 eager forward) and greedy_i (I32 [N], fp32
// greedy continuation). We require logits within 1e-3 of the logit scale at every prompt position
// and identical greedy tokens, both for a plain prefill + decode of each prompt and for the
// engine's schedule (chunked prefill and decode of all prompts in shared batches, non-contiguous
// blocks, padding rows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/backend.h"
#include "forward_runner.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test_paths.h"
#include "unit/relative_error.h"

namespace specula {
namespace {

using testing::argmax;
using testing::PagedRunner;

struct Reference {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> logits;  // [T, V]
};

std::vector<Reference> load_reference(const std::filesystem::path& file) {
  auto st = SafetensorsFile::open(file);
  auto read = [&](const std::string& name, DType dtype, auto* out) {
    const SafetensorsEntry* e = st->find(name);
    if (e == nullptr) return false;
    SPECULA_CHECK(e->dtype == dtype, "{}: {} has dtype {}", file.string(), name, e->dtype_name);
    out->resize(e->nbytes() / 4);
    std::memcpy(out->data(), st->data(*e), e->nbytes());
    return true;
  };
  std::vector<Reference> refs;
  for (int i = 0;; ++i) {
    Reference r;
    if (!read("prompt_" + std::to_string(i), DType::kI32, &r.prompt)) break;
    SPECULA_CHECK(read("logits_" + std::to_string(i), DType::kF32, &r.logits) &&
                      read("greedy_" + std::to_string(i), DType::kI32, &r.greedy),
                  "{}: prompt_{} lacks logits or greedy tokens", file.string(), i);
    refs.push_back(std::move(r));
  }
  return refs;
}

using testing::relative_error;

class ForwardFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = specula::testing::fixtures_dir() / "models" / GetParam();
    ASSERT_TRUE(std::filesystem::exists(dir_ / "reference.safetensors")) << dir_ << " has no reference";
    config_ = load_model_config(dir_);
    weights_ = open_safetensors_checkpoint(dir_);
    backend_ = make_cpu_backend(2);
    model_ = create_model(config_, *weights_, *backend_);
    refs_ = load_reference(dir_ / "reference.safetensors");
    ASSERT_FALSE(refs_.empty());
  }

  std::filesystem::path dir_;
  ModelConfig config_;
  std::unique_ptr<WeightSource> weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<Reference> refs_;
};

// Each prompt alone: one prefill (every position's logits), then greedy decode one token a step.
TEST_P(ForwardFixture, PrefillLogitsAndGreedyDecodeMatchTransformers) {
  const int64_t v = config_.vocab_size;
  for (size_t i = 0; i < refs_.size(); ++i) {
    const Reference& ref = refs_[i];
    PagedRunner runner(*model_, *backend_, /*num_blocks=*/16, /*block_size=*/16, /*seed=*/static_cast<unsigned>(i));
    runner.feed(0, ref.prompt);
    auto logits = runner.step({{0, static_cast<int64_t>(ref.prompt.size()), true}})[0];
    ASSERT_EQ(logits.size(), ref.logits.size());
    EXPECT_LE(relative_error(logits, ref.logits), 1e-3) << GetParam() << " prompt " << i;

    std::vector<int32_t> greedy;
    std::vector<float> last(logits.end() - v, logits.end());
    for (size_t n = 0; n < ref.greedy.size(); ++n) {
      greedy.push_back(argmax(last.data(), v));
      runner.feed(0, {greedy.back()});
      last = runner.step({{0, 1, false}})[0];
    }
    EXPECT_EQ(greedy, ref.greedy) << GetParam() << " prompt " << i;
  }
}

// All prompts together as the engine runs them: prefill in uneven chunks sharing batches, then
// decode of every sequence in one batch per step, with padding rows in some steps.
TEST_P(ForwardFixture, ChunkedBatchedScheduleMatchesTransformers) {
  const int64_t v = config_.vocab_size;
  const int n = static_cast<int>(refs_.size());
  PagedRunner runner(*model_, *backend_, /*num_blocks=*/48, /*block_size=*/16, /*seed=*/99);
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
  std::vector<std::vector<int32_t>> greedy(n);
  std::vector<std::vector<float>> last(n);
  for (int s = 0; s < n; ++s) {
    ASSERT_EQ(prompt_logits[s].size(), refs_[s].logits.size());
    EXPECT_LE(relative_error(prompt_logits[s], refs_[s].logits), 1e-3) << GetParam() << " prompt " << s;
    last[s].assign(prompt_logits[s].end() - v, prompt_logits[s].end());
  }
  for (size_t step = 0; step < refs_[0].greedy.size(); ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < n; ++s) {
      if (greedy[s].size() >= refs_[s].greedy.size()) continue;
      greedy[s].push_back(argmax(last[s].data(), v));
      runner.feed(s, {greedy[s].back()});
      work.push_back({s, 1, false});
    }
    auto out = runner.step(work, static_cast<int>(step % 3));
    for (size_t w = 0; w < work.size(); ++w) last[work[w].seq] = out[w];
  }
  for (int s = 0; s < n; ++s) EXPECT_EQ(greedy[s], refs_[s].greedy) << GetParam() << " prompt " << s;
}

INSTANTIATE_TEST_SUITE_P(LlamaFamily, ForwardFixture,
                         ::testing::Values("llama", "llama3_rope_old_style", "llama3_rope_new_style",
                                           "llama_linear_rope_type_key", "qwen2_bias_tied", "qwen3_qknorm_headdim",
                                           "qwen3_yarn_tied", "mistral_sharded"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace specula
