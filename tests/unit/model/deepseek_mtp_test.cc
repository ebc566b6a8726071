// specula-tiny-moe's MTP layer against transformers-side references: the training code committed
// mtp_logits_i (F32 [4, V]) in tests/fixtures/embedded/specula-tiny-moe/reference.safetensors, the
// MTP logits at prompt positions logits_pos_i, where the token after the prompt is greedy_i[0]
// (models/README.md, "Fixtures"). They must agree within 1e-3 of the logit scale, whether the MTP
// layer runs over the prompt in one forward or in chunks over its own paged cache, with shared-expert
// fusion on or off; and the checkpoint's copies of the embedding and head are shared with the target.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "deepseek_mtp_reference.h"
#include "model/config.h"
#include "model/deepseek_mtp.h"
#include "model/safetensors.h"
#include "model/weight_source.h"
#include "test_paths.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

fs::path moe_dir() { return testing::models_dir() / "specula-tiny-moe"; }
fs::path reference_file() { return testing::fixtures_dir() / "embedded" / "specula-tiny-moe" / "reference.safetensors"; }
bool have_model() { return fs::exists(moe_dir() / "model.safetensors") && fs::exists(reference_file()); }

struct MtpFixture {
  std::vector<int32_t> prompt, greedy, logits_pos;
  std::vector<float> mtp_logits;  // [4, V]
};

std::vector<MtpFixture> load_fixtures() {
  auto st = SafetensorsFile::open(reference_file());
  auto read = [&](const std::string& name, auto* out) {
    const SafetensorsEntry* e = st->find(name);
    SPECULA_CHECK(e != nullptr, "{}: no tensor {}", reference_file().string(), name);
    out->resize(e->nbytes() / 4);
    std::memcpy(out->data(), st->data(*e), e->nbytes());
  };
  std::vector<MtpFixture> refs;
  for (int i = 0; st->find("prompt_" + std::to_string(i)) != nullptr; ++i) {
    MtpFixture f;
    const std::string n = std::to_string(i);
    read("prompt_" + n, &f.prompt);
    read("greedy_" + n, &f.greedy);
    read("logits_pos_" + n, &f.logits_pos);
    read("mtp_logits_" + n, &f.mtp_logits);
    refs.push_back(std::move(f));
  }
  return refs;
}

// max |got - want| / max |want| over the rows.
double relative_error(const std::vector<std::vector<float>>& got, const std::vector<float>& want, int64_t v) {
  double worst = 0, scale = 0;
  for (size_t r = 0; r < got.size(); ++r)
    for (int64_t j = 0; j < v; ++j) {
      worst = std::max(worst, std::fabs(double(got[r][j]) - want[r * v + j]));
      scale = std::max(scale, std::fabs(double(want[r * v + j])));
    }
  return worst / scale;
}

// Forwards every call to a real checkpoint, except for the names it hides or rescales.
class EditedWeights : public WeightSource {
 public:
  EditedWeights(std::unique_ptr<WeightSource> base, std::vector<std::string> hidden, std::string doubled = "")
      : base_(std::move(base)), hidden_(std::move(hidden)), doubled_(std::move(doubled)) {}
  bool has(const std::string& name) const override {
    return std::find(hidden_.begin(), hidden_.end(), name) == hidden_.end() && base_->has(name);
  }
  Tensor load(const std::string& name, const Shape& expected, DType dtype, Backend& backend) override {
    SPECULA_CHECK(has(name), "{}: no tensor '{}'", describe(), name);
    Tensor t = base_->load(name, expected, dtype, backend);
    if (name != doubled_) return t;
    Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::kCPU);
    backend.copy(t, host);
    std::vector<float> v = host.to_f32_vector();
    for (float& x : v) x *= 2.0f;
    Tensor out = backend.empty(t.shape(), dtype);
    backend.copy(Tensor::from_f32(v, t.shape()), out);
    return out;
  }
  std::vector<std::string> names() const override { return base_->names(); }
  std::string describe() const override { return "edited " + base_->describe(); }

 private:
  std::unique_ptr<WeightSource> base_;
  std::vector<std::string> hidden_;
  std::string doubled_;
};

class DeepseekMtpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(have_model()) << "committed specula-tiny-moe or its reference missing";
    config_ = load_model_config(moe_dir());
    backend_ = make_cpu_backend(2);
    target_ = create_model(config_, *open_safetensors_checkpoint(moe_dir()), *backend_);
    refs_ = load_fixtures();
    ASSERT_EQ(refs_.size(), 2u);
  }

  std::unique_ptr<DeepseekMtp> load_mtp(WeightSource& weights, int fusion = 0) {
    return std::make_unique<DeepseekMtp>(config_, weights, *backend_, ModelOptions{fusion}, target_.get(), false);
  }

  // The MTP logits at the fixture positions, the layer run over the prompt in the given chunks.
  std::vector<std::vector<float>> logits_for(DeepseekMtp& mtp, const MtpFixture& f) {
    std::vector<int32_t> tokens = f.prompt;
    tokens.push_back(f.greedy[0]);
    testing::MtpReference ref(*target_, mtp, *backend_);
    return ref.mtp_logits(tokens, static_cast<int>(f.prompt.size()), std::vector<int>(f.logits_pos.begin(), f.logits_pos.end()));
  }

  ModelConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> target_;
  std::vector<MtpFixture> refs_;
};

TEST_F(DeepseekMtpTest, LogitsMatchTheTrainingCode) {
  auto weights = open_safetensors_checkpoint(moe_dir());
  auto mtp = load_mtp(*weights);
  EXPECT_EQ(mtp->num_layers(), 1);
  const KVCacheSpec spec = mtp->kv_cache_spec();
  EXPECT_EQ(spec.num_layers, 1);
  EXPECT_EQ(spec.num_kv_heads, 1);
  EXPECT_EQ(spec.head_dim, config_.kv_lora_rank + config_.qk_rope_head_dim);
  EXPECT_EQ(spec.v_head_dim, 0);
  for (size_t i = 0; i < refs_.size(); ++i) {
    const auto got = logits_for(*mtp, refs_[i]);
    ASSERT_EQ(got.size(), 4u);
    EXPECT_LE(relative_error(got, refs_[i].mtp_logits, config_.vocab_size), 1e-3) << "prompt " << i;
  }
}

// The same positions, the MTP layer fed in three uneven chunks over its paged cache: the cache
// holds what later rows attend to.
TEST_F(DeepseekMtpTest, ChunkedOverItsOwnCacheGivesTheSameLogits) {
  auto weights = open_safetensors_checkpoint(moe_dir());
  auto mtp = load_mtp(*weights);
  const MtpFixture& f = refs_[0];
  const int n = static_cast<int>(f.prompt.size()), block = 16, blocks = (n + block - 1) / block;
  std::vector<int32_t> tokens = f.prompt;
  tokens.push_back(f.greedy[0]);
  testing::MtpReference ref(*target_, *mtp, *backend_);
  const Tensor h = ref.target_hidden(tokens, n);
  KVCacheLayer cache{backend_->empty({blocks + 2, block, 1, mtp->kv_cache_spec().head_dim}, DType::kF32),
                     backend_->empty({blocks + 2, block, 1, 0}, DType::kF32)};
  backend_->zero(cache.k);
  // Blocks out of order, as the engine hands them out.
  std::vector<int32_t> table;
  for (int b = 0; b < blocks; ++b) table.push_back(blocks + 1 - b);
  std::vector<std::vector<float>> got;
  const int cuts[] = {0, 21, n - 3, n};
  for (int c = 0; c < 3; ++c) {
    const int from = cuts[c], to = cuts[c + 1];
    std::vector<int32_t> next(tokens.begin() + from + 1, tokens.begin() + to + 1), positions, rows;
    std::vector<int64_t> slots;
    for (int p = from; p < to; ++p) {
      positions.push_back(p);
      slots.push_back(int64_t{table[p / block]} * block + p % block);
      if (std::find(f.logits_pos.begin(), f.logits_pos.end(), p) != f.logits_pos.end()) rows.push_back(p - from);
    }
    MtpForwardInput in;
    in.rows.token_ids = Tensor::from_i32(next);
    in.rows.positions = Tensor::from_i32(positions);
    in.rows.logits_indices = Tensor::from_i32(rows, {static_cast<int64_t>(rows.size())});
    AttentionMetadata& md = in.rows.attn;
    md.num_seqs = 1;
    md.num_tokens = to - from;
    md.max_query_len = to - from;
    md.max_seq_len = to;
    md.block_size = block;
    md.query_start_loc = Tensor::from_i32({0, to - from});
    md.seq_lens = Tensor::from_i32({to});
    md.slot_mapping = Tensor::from_i64(slots);
    const int width = (to + block - 1) / block;
    md.block_tables = Tensor::from_i32(std::vector<int32_t>(table.begin(), table.begin() + width), {1, width});
    md.query_start_loc_host = {0, to - from};
    md.seq_lens_host = {to};
    in.hidden = h.slice(from, to);
    if (from == 0) in.zero_embedding_rows = {0};
    backend_->reset_scratch();
    MtpForwardOutput out = mtp->forward(0, in, cache);
    EXPECT_EQ(out.y.size(0), to - from);
    for (int64_t r = 0; r < static_cast<int64_t>(rows.size()); ++r) {
      const float* row = out.logits.data_as<float>() + r * config_.vocab_size;
      got.emplace_back(row, row + config_.vocab_size);
    }
  }
  EXPECT_LE(relative_error(got, f.mtp_logits, config_.vocab_size), 1e-3);
}

// Without the zeroed embedding at position 0 the logits there change: the rule is really applied.
TEST_F(DeepseekMtpTest, PositionZeroSeesNoEmbedding) {
  auto weights = open_safetensors_checkpoint(moe_dir());
  auto mtp = load_mtp(*weights);
  const MtpFixture& f = refs_[0];
  testing::MtpReference ref(*target_, *mtp, *backend_);
  std::vector<int32_t> a = f.prompt, b = f.prompt;
  b[1] = b[1] == 5 ? 6 : 5;  // a different next token at position 0
  // Position 0 does not read its next token at all: over the same hidden states, the same logits
  // bit for bit. (Not over the target's h_0 of each prompt: with OpenBLAS's AVX-512 kernels, not
  // its AVX2 ones, h_0 moved in the last bits with the token after it, whose experts the MoE
  // batches h_0's row with or not.)
  const Tensor h = ref.target_hidden(a, 2);
  const std::vector<int32_t> next_a = {a[1], a[2]}, next_b = {b[1], b[2]};
  EXPECT_EQ(ref.mtp_logits_of(h, next_a, {0})[0], ref.mtp_logits_of(h, next_b, {0})[0]);
  const auto la1 = ref.mtp_logits(a, 3, {1}), lb1 = ref.mtp_logits(b, 3, {1});
  EXPECT_NE(la1[0], lb1[0]);  // position 1 reads it (as h_1's input and through attention)
}

TEST_F(DeepseekMtpTest, SharedExpertFusionKeepsTheLogits) {
  for (int fusion : {1, 2}) {
    auto weights = open_safetensors_checkpoint(moe_dir());
    auto mtp = load_mtp(*weights, fusion);
    for (size_t i = 0; i < refs_.size(); ++i)
      EXPECT_LE(relative_error(logits_for(*mtp, refs_[i]), refs_[i].mtp_logits, config_.vocab_size), 1e-3)
          << "fusion " << fusion << " prompt " << i;
  }
}

TEST_F(DeepseekMtpTest, SharesTheTargetsEmbeddingAndHeadWhereTheCopiesAreEqual) {
  {
    auto weights = open_safetensors_checkpoint(moe_dir());
    ASSERT_TRUE(weights->has("model.layers.3.embed_tokens.weight"));
    auto mtp = load_mtp(*weights);
    EXPECT_EQ(mtp->num_shared_embeddings(), 1);
    EXPECT_EQ(mtp->num_shared_heads(), 1);
  }
  {  // a checkpoint without the copies: the target's are used
    EditedWeights weights(open_safetensors_checkpoint(moe_dir()),
                          {"model.layers.3.embed_tokens.weight", "model.layers.3.shared_head.head.weight"});
    auto mtp = load_mtp(weights);
    EXPECT_EQ(mtp->num_shared_embeddings(), 1);
    EXPECT_EQ(mtp->num_shared_heads(), 1);
    EXPECT_LE(relative_error(logits_for(*mtp, refs_[0]), refs_[0].mtp_logits, config_.vocab_size), 1e-3);
  }
  {  // a head copy that differs is the MTP layer's own: doubled weights, doubled logits
    EditedWeights weights(open_safetensors_checkpoint(moe_dir()), {}, "model.layers.3.shared_head.head.weight");
    auto mtp = load_mtp(weights);
    EXPECT_EQ(mtp->num_shared_embeddings(), 1);
    EXPECT_EQ(mtp->num_shared_heads(), 0);
    std::vector<float> doubled = refs_[0].mtp_logits;
    for (float& x : doubled) x *= 2.0f;
    EXPECT_LE(relative_error(logits_for(*mtp, refs_[0]), doubled, config_.vocab_size), 1e-3);
  }
}

TEST_F(DeepseekMtpTest, ErrorsNameTheProblem) {
  auto message = [&](const ModelConfig& c, WeightSource& w) {
    try {
      DeepseekMtp mtp(c, w, *backend_, ModelOptions{}, target_.get(), false);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelConfig none = config_;
  none.num_nextn_predict_layers = 0;
  auto weights = open_safetensors_checkpoint(moe_dir());
  EXPECT_NE(message(none, *weights).find("num_nextn_predict_layers"), std::string::npos);
  EditedWeights missing(open_safetensors_checkpoint(moe_dir()), {"model.layers.3.eh_proj.weight"});
  EXPECT_NE(message(config_, missing).find("model.layers.3.eh_proj.weight"), std::string::npos);
  // Without a target to lend them, missing copies are an error naming the tensor.
  EditedWeights no_copy(open_safetensors_checkpoint(moe_dir()), {"model.layers.3.embed_tokens.weight"});
  try {
    DeepseekMtp mtp(config_, no_copy, *backend_, ModelOptions{}, nullptr, false);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.3.embed_tokens.weight"), std::string::npos) << e.what();
  }
}

// Dummy weights for a DeepSeek-V3 config with two MTP layers: both load, both run, and with
// assume_copies_equal the target's embedding and head serve every layer.
TEST_F(DeepseekMtpTest, DummyWeightsWithTwoLayers) {
  ModelConfig two = config_;
  two.num_nextn_predict_layers = 2;
  auto dummy = make_dummy_weight_source(two, 3);
  auto target = create_model(two, *dummy, *backend_);
  DeepseekMtp mtp(two, *dummy, *backend_, ModelOptions{}, target.get(), true);
  EXPECT_EQ(mtp.num_layers(), 2);
  EXPECT_EQ(mtp.num_shared_embeddings(), 2);
  EXPECT_EQ(mtp.num_shared_heads(), 2);
  EXPECT_EQ(mtp.kv_cache_spec().num_layers, 2);
  testing::MtpReference ref(*target, mtp, *backend_);
  const auto rows = ref.draft_logits({3, 4, 5, 6, 7}, {8, 9});
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& r : rows)
    for (float x : r) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace specula
