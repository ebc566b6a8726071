// `--load-format dummy`: random weights from config.json alone, so real model sizes run without
// their checkpoints. Values are a pure function of (seed, tensor name, element index): a
// counter-based hash (splitmix64) rather than a sequential RNG, so any chunk of any tensor can be
// generated independently, in parallel, in the target dtype, with no full-size fp32 copy.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
#include <string_view>

#include "core/error.h"
#include "model/dummy_weights.h"
#include "model/weight_source.h"
#include "model/weight_upload.h"

namespace specula {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// FNV-1a: a stable 64-bit hash of the tensor name (std::hash is not stable across builds).
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

class DummyWeightSource : public WeightSource {
 public:
  DummyWeightSource(const ModelConfig& config, uint64_t seed) : config_(config), seed_(seed) {}

  // What a checkpoint of this config would hold among the optional tensors; anything else asked
  // for is taken to exist.
  bool has(const std::string& name) const override {
    if (name == "lm_head.weight") return !config_.tie_word_embeddings;
    if (contains(name, "self_attn.q_norm.") || contains(name, "self_attn.k_norm.")) return config_.qk_norm;
    if (ends_with(name, "e_score_correction_bias")) return config_.is_deepseek() && config_.topk_method == "noaux_tc";
    if (config_.is_deepseek()) {
      if (contains(name, "self_attn.q_a_proj.") || contains(name, "self_attn.q_b_proj.") ||
          contains(name, "self_attn.q_a_layernorm."))
        return config_.q_lora_rank.has_value() && (!ends_with(name, ".bias") || config_.attention_bias);
      if (contains(name, "self_attn.q_proj.")) return !config_.q_lora_rank && !ends_with(name, ".bias");
    }
    if (ends_with(name, ".bias")) {
      if (contains(name, "self_attn.o_proj.")) return config_.o_proj_bias;
      if (contains(name, "self_attn.")) return config_.attention_bias;
      if (contains(name, "mlp.")) return config_.mlp_bias;
      return false;
    }
    return true;
  }

  std::vector<std::string> names() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return {loaded_names_.begin(), loaded_names_.end()};
  }

  std::string describe() const override { return fmt::format("dummy weights (seed {})", seed_); }

  Tensor load(const std::string& name, const Shape& expected, DType dtype, Backend& backend) override {
    return load_part(name, expected, std::nullopt, dtype, backend);
  }

  // A slice holds the values the whole tensor has there: they depend on the element's index in
  // the full shape, and the scale on the full shape's input width.
  Tensor load_slice(const std::string& name, const Shape& full, const TensorSlice& slice, DType dtype,
                    Backend& backend) override {
    return load_part(name, full, slice, dtype, backend);
  }

 private:
  Tensor load_part(const std::string& name, const Shape& expected, const std::optional<TensorSlice>& slice,
                   DType dtype, Backend& backend) {
    SPECULA_CHECK(is_weight_float_dtype(dtype), "dummy weights: tensor '{}' asked for as {}; only F32, F16 and BF16 "
                  "can be generated", name, dtype_name(dtype));
    for (int64_t d : expected) SPECULA_CHECK(d >= 0, "dummy weights: tensor '{}' has negative shape {}", name, shape_str(expected));
    Tensor dst = backend.empty(slice ? slice_shape(expected, *slice) : expected, dtype);
    const DummyInit init = dummy_init_for(name, expected);
    const uint64_t base = splitmix64(seed_ ^ fnv1a(name));
    ElementFiller whole = [&](void* out, size_t begin, size_t count) {
      fill_dummy_values(init, base, dtype, out, begin, count);
    };
    fill_backend_tensor(backend, dst, slice ? slice_filler(expected, *slice, dtype_size(dtype), whole) : whole);
    std::lock_guard<std::mutex> lock(mu_);  // tensor-parallel ranks load at once
    loaded_names_.insert(name);
    bytes_ += dst.nbytes();
    if (on_progress) on_progress(loaded_names_.size(), bytes_);
    return dst;
  }

  ModelConfig config_;
  uint64_t seed_;
  mutable std::mutex mu_;
  std::set<std::string> loaded_names_;
  size_t bytes_ = 0;
};

}  // namespace

DummyInit dummy_init_for(const std::string& name, const Shape& shape) {
  // DeepSeek-V3's routing bias shifts expert scores; small keeps the routing driven by the gate.
  if (ends_with(name, "e_score_correction_bias")) return {DummyInit::Kind::kUniform, 0.0f, 0.01f};
  if (ends_with(name, ".bias")) return {DummyInit::Kind::kUniform, 0.0f, 0.02f};
  // RMSNorm gains (input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm,
  // kv_a_layernorm, MTP's enorm/hnorm, ...) and any other 1-D weight: 1 leaves activations as the
  // normalisation made them.
  if (shape.size() <= 1) return {DummyInit::Kind::kConstant, 1.0f, 0.0f};
  // Matrices (and stacked expert weights): U(-1/sqrt(in), 1/sqrt(in)) with in = the last dim,
  // which keeps each output's variance near its input's at real sizes.
  const int64_t in = std::max<int64_t>(1, shape.back());
  return {DummyInit::Kind::kUniform, 0.0f, static_cast<float>(1.0 / std::sqrt(static_cast<double>(in)))};
}

void fill_dummy_values(const DummyInit& init, uint64_t base, DType dtype, void* out, size_t begin, size_t count) {
  constexpr size_t kChunk = 16384;  // fp32 scratch per thread, converted to the target dtype
  const size_t elem = dtype_size(dtype);
  const int64_t chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
  auto* dst = static_cast<uint8_t*>(out);
#pragma omp parallel if (chunks > 4)
  {
    std::vector<float> buf(dtype == DType::kF32 ? 0 : kChunk);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t b = static_cast<size_t>(c) * kChunk, m = std::min(kChunk, count - b);
      float* f = dtype == DType::kF32 ? reinterpret_cast<float*>(dst + b * elem) : buf.data();
      if (init.kind == DummyInit::Kind::kConstant) {
        std::fill(f, f + m, init.value);
      } else {
        // One 64-bit hash per pair of elements (2k, 2k + 1): bits 40..63 for the even one, 8..31
        // for the odd one. 24 bits map exactly onto floats in [-1, 1); converting them through
        // int32 keeps the hot loop free of the slow unsigned-64-to-float sequence.
        const uint64_t first = begin + b;  // absolute index of f[0]
        auto pair_hash = [&](uint64_t idx) { return splitmix64(base + ((idx >> 1) + 1) * kGolden); };
        auto value = [&](uint64_t r, bool odd) {
          int32_t bits = odd ? static_cast<int32_t>((r >> 8) & 0xffffff) : static_cast<int32_t>(r >> 40);
          return init.value + init.scale * (static_cast<float>(bits) * (1.0f / 8388608.0f) - 1.0f);
        };
        size_t i = 0;
        if (first & 1) {
          f[0] = value(pair_hash(first), true);
          i = 1;
        }
        for (; i + 1 < m; i += 2) {
          uint64_t r = pair_hash(first + i);
          f[i] = value(r, false);
          f[i + 1] = value(r, true);
        }
        if (i < m) f[i] = value(pair_hash(first + i), false);
      }
      if (dtype != DType::kF32) convert_from_f32(f, dtype, dst + b * elem, m);
    }
  }
}

std::unique_ptr<WeightSource> make_dummy_weight_source(const ModelConfig& config, uint64_t seed) {
  return std::make_unique<DummyWeightSource>(config, seed);
}

}  // namespace specula
