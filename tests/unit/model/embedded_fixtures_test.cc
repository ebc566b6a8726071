// The embedded models (models/specula-tiny, -draft, -moe) against transformers: the training code
// committed tests/fixtures/embedded/<model>/reference.safetensors with, per prompt i of real Python
// text, prompt_i, logits_i (F32 [4, V] at the prompt positions logits_pos_i, fp32 eager) and
// greedy_i (32 tokens, fp32 greedy). Logits must agree within 1e-3 of their scale and the greedy
// continuation must be identical, for a plain prefill + decode and for batched chunked prefill.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "forward_runner.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test_paths.h"

namespace specula {
namespace {

using testing::argmax;
using testing::PagedRunner;

struct Reference {
  std::vector<int32_t> prompt, greedy, logits_pos;
  std::vector<float> logits;  // [logits_pos.size(), V]
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
    const std::string n = std::to_string(i);
    if (!read("prompt_" + n, &r.prompt)) break;
    SPECULA_CHECK(read("logits_" + n, &r.logits) && read("greedy_" + n, &r.greedy) &&
                      read("logits_pos_" + n, &r.logits_pos),
                  "{}: prompt_{} lacks logits, positions or greedy tokens", file.string(), i);
    refs.push_back(std::move(r));
  }
  return refs;
}

class EmbeddedModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto dir = specula::testing::models_dir() / GetParam();
    config_ = load_model_config(dir);
    weights_ = open_safetensors_checkpoint(dir);
    backend_ = make_cpu_backend(2);
    model_ = create_model(config_, *weights_, *backend_);
    refs_ = load_reference(specula::testing::fixtures_dir() / "embedded" / GetParam() / "reference.safetensors");
    ASSERT_EQ(refs_.size(), 2u);
  }

  // max |got - want| over the reference rows, relative to max |want|.
  double logits_error(const std::vector<float>& all_rows, const Reference& ref) const {
    const int64_t v = config_.vocab_size;
    double worst = 0, scale = 0;
    for (size_t r = 0; r < ref.logits_pos.size(); ++r) {
      const float* got = all_rows.data() + ref.logits_pos[r] * v;
      const float* want = ref.logits.data() + r * v;
      for (int64_t j = 0; j < v; ++j) {
        worst = std::max(worst, std::fabs(double(got[j]) - want[j]));
        scale = std::max(scale, std::fabs(double(want[j])));
      }
    }
    return worst / scale;
  }

  ModelConfig config_;
  std::unique_ptr<WeightSource> weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<Reference> refs_;
};

TEST_P(EmbeddedModel, PrefillLogitsAndGreedyMatchTransformers) {
  const int64_t v = config_.vocab_size;
  for (size_t i = 0; i < refs_.size(); ++i) {
    const Reference& ref = refs_[i];
    PagedRunner runner(*model_, *backend_, /*num_blocks=*/16, /*block_size=*/16, static_cast<unsigned>(i));
    runner.feed(0, ref.prompt);
    auto logits = runner.step({{0, static_cast<int64_t>(ref.prompt.size()), true}})[0];
    EXPECT_LE(logits_error(logits, ref), 1e-3) << GetParam() << " prompt " << i;
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

// Both prompts in shared batches, prefilled in uneven chunks, then decoded together.
TEST_P(EmbeddedModel, ChunkedBatchedGreedyMatchesTransformers) {
  const int64_t v = config_.vocab_size;
  PagedRunner runner(*model_, *backend_, /*num_blocks=*/32, /*block_size=*/16, /*seed=*/7);
  std::vector<std::vector<float>> last(2);
  for (int s = 0; s < 2; ++s) runner.feed(s, refs_[s].prompt);
  const int64_t chunks[] = {13, 7, 21};
  for (int step = 0;; ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < 2; ++s)
      if (runner.pending(s) > 0) work.push_back({s, std::min(runner.pending(s), chunks[(step + s) % 3]), false});
    if (work.empty()) break;
    auto out = runner.step(work, step % 2);
    for (size_t w = 0; w < work.size(); ++w) last[work[w].seq] = out[w];
  }
  std::vector<std::vector<int32_t>> greedy(2);
  for (size_t n = 0; n < refs_[0].greedy.size(); ++n) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < 2; ++s) {
      greedy[s].push_back(argmax(last[s].data(), v));
      runner.feed(s, {greedy[s].back()});
      work.push_back({s, 1, false});
    }
    auto out = runner.step(work);
    for (int s = 0; s < 2; ++s) last[s] = out[s];
  }
  for (int s = 0; s < 2; ++s) EXPECT_EQ(greedy[s], refs_[s].greedy) << GetParam() << " prompt " << s;
}

INSTANTIATE_TEST_SUITE_P(Embedded, EmbeddedModel,
                         ::testing::Values("specula-tiny", "specula-tiny-draft", "specula-tiny-moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace specula
