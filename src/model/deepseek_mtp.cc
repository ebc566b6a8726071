// DeepseekMtp: loading the MTP layers (sharing the target's embedding and head where the
// checkpoint's copies are the same) and one MTP layer's forward; see deepseek_mtp.h.
#include "model/deepseek_mtp.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/logging.h"
#include "model/deepseek_weights.h"

namespace specula {
namespace {

// a == b element for element, compared on the host a slab of rows at a time so that a
// DeepSeek-V3-sized embedding (129280 x 7168) never needs two whole host copies.
bool same_values(Backend& backend, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const int64_t rows = a.size(0);
  const int64_t row_bytes = rows > 0 ? static_cast<int64_t>(a.nbytes()) / rows : 0;
  const int64_t slab = std::max<int64_t>(1, (int64_t{64} << 20) / std::max<int64_t>(1, row_bytes));
  for (int64_t r = 0; r < rows; r += slab) {
    const int64_t end = std::min(rows, r + slab);
    const Tensor sa = a.slice(r, end), sb = b.slice(r, end);
    Tensor ha = Tensor::empty(sa.shape(), sa.dtype(), Device::kCPU), hb = Tensor::empty(sb.shape(), sb.dtype(), Device::kCPU);
    backend.copy(sa, ha);
    backend.copy(sb, hb);
    backend.synchronize();
    if (std::memcmp(ha.data(), hb.data(), ha.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace

DeepseekMtp::DeepseekMtp(const ModelConfig& config, WeightSource& weights, Backend& backend,
                         const ModelOptions& options, const Model* target, bool assume_copies_equal)
    : config_(config),
      backend_(backend),
      decoder_(config_, backend, options),
      hidden_(config.hidden_size),
      vocab_(config.vocab_size),
      eps_(static_cast<float>(config.rms_norm_eps)) {
  const std::string arch = architecture_name(config.arch);
  SPECULA_CHECK(config.num_nextn_predict_layers > 0,
                "{}: the checkpoint has no MTP layer (num_nextn_predict_layers is 0 in config.json)", arch);
  const Tensor target_embed = target ? target->shared_weight("model.embed_tokens.weight") : Tensor();
  const Tensor target_head = target ? target->shared_weight("lm_head.weight") : Tensor();
  DeepseekWeightLoader w(config_, weights, backend);
  for (int64_t i = 0; i < config.num_nextn_predict_layers; ++i) {
    const int64_t index = config.num_hidden_layers + i;
    const std::string p = "model.layers." + std::to_string(index) + ".";
    Layer layer;
    layer.embed_tokens = load_or_share(weights, p + "embed_tokens.weight", target_embed, assume_copies_equal,
                                       &shared_embeddings_);
    layer.enorm = w.load(p + "enorm.weight", {hidden_});
    layer.hnorm = w.load(p + "hnorm.weight", {hidden_});
    layer.eh_proj = w.load(p + "eh_proj.weight", {hidden_, 2 * hidden_});
    layer.block = decoder_.load_layer(w, index);
    layer.shared_head_norm = w.load(p + "shared_head.norm.weight", {hidden_});
    layer.head = load_or_share(weights, p + "shared_head.head.weight", target_head, assume_copies_equal, &shared_heads_);
    layers_.push_back(std::move(layer));
  }
  LOG_INFO("Loaded {} MTP layer(s) of {} (model.layers.{}{}) from {}: embedding {}, head {}", layers_.size(), arch,
           config.num_hidden_layers,
           layers_.size() > 1 ? fmt::format("..{}", config.num_hidden_layers + layers_.size() - 1) : std::string(),
           weights.describe(), shared_embeddings_ == num_layers() ? "shared with the target" : "own copy",
           shared_heads_ == num_layers() ? "shared with the target" : "own copy");
}

Tensor DeepseekMtp::load_or_share(WeightSource& weights, const std::string& name, const Tensor& lent,
                                  bool assume_equal, int* shared_count) {
  const Shape shape{vocab_, hidden_};
  const bool lendable = lent.defined() && lent.shape() == shape && lent.dtype() == backend_.compute_dtype();
  if (lendable && (assume_equal || !weights.has(name))) {
    ++*shared_count;
    return lent;
  }
  SPECULA_CHECK(weights.has(name), "{}: tensor '{}' is missing and the target model has no such tensor to lend",
                weights.describe(), name);
  DeepseekWeightLoader w(config_, weights, backend_);
  Tensor own = w.load(name, shape);
  if (lendable && same_values(backend_, own, lent)) {
    ++*shared_count;
    return lent;  // `own` is freed here
  }
  return own;
}

KVCacheSpec DeepseekMtp::kv_cache_spec() const {
  return KVCacheSpec{static_cast<int64_t>(layers_.size()), 1, decoder_.cache_entry_dim(), 0};
}

void DeepseekMtp::check_input(int layer, const MtpForwardInput& in, const KVCacheLayer& cache) const {
  SPECULA_CHECK(layer >= 0 && layer < num_layers(), "MTP forward: layer {} of {}", layer, num_layers());
  const ForwardInput& r = in.rows;
  SPECULA_CHECK(r.token_ids.defined() && r.token_ids.ndim() == 1 && r.token_ids.dtype() == DType::kI32,
                "MTP forward: token_ids must be I32 [T], got {}", r.token_ids.describe());
  const int64_t t = r.token_ids.size(0);
  SPECULA_CHECK(t > 0, "MTP forward: empty batch");
  SPECULA_CHECK(r.positions.defined() && r.positions.ndim() == 1 && r.positions.size(0) == t,
                "MTP forward: positions {} must be [{}]", r.positions.describe(), t);
  SPECULA_CHECK(in.hidden.defined() && in.hidden.ndim() == 2 && in.hidden.size(0) == t && in.hidden.size(1) == hidden_ &&
                    in.hidden.dtype() == backend_.compute_dtype(),
                "MTP forward: hidden states {} must be {}[{}, {}]", in.hidden.describe(),
                dtype_name(backend_.compute_dtype()), t, hidden_);
  SPECULA_CHECK(r.attn.num_tokens == t, "MTP forward: attention metadata covers {} tokens, the batch has {}",
                r.attn.num_tokens, t);
  SPECULA_CHECK(r.logits_indices.defined() && r.logits_indices.ndim() == 1,
                "MTP forward: logits_indices must be I32 [L], got {}", r.logits_indices.describe());
  SPECULA_CHECK(cache.k.defined() && cache.k.ndim() == 4 && cache.k.size(3) == decoder_.cache_entry_dim(),
                "MTP forward: the cache of MTP layer {} must hold entries of {} values, got {}", layer,
                decoder_.cache_entry_dim(), cache.k.describe());
  for (int32_t row : in.zero_embedding_rows)
    SPECULA_CHECK(row >= 0 && row < t, "MTP forward: zero-embedding row {} outside the {} rows", row, t);
}

MtpForwardOutput DeepseekMtp::forward(int layer_index, const MtpForwardInput& in, KVCacheLayer& cache) {
  check_input(layer_index, in, cache);
  const Layer& w = layers_[static_cast<size_t>(layer_index)];
  const DType dt = backend_.compute_dtype();
  const int64_t t = in.rows.token_ids.size(0), h = hidden_;

  // x = eh_proj([enorm(e) | hnorm(h)]).
  Tensor e = backend_.scratch({t, h}, dt);
  backend_.embedding(in.rows.token_ids, w.embed_tokens, e);
  for (int32_t row : in.zero_embedding_rows) {
    Tensor r = e.slice(row, row + 1);
    backend_.zero(r);
  }
  Tensor e_norm = backend_.scratch({t, h}, dt), h_norm = backend_.scratch({t, h}, dt);
  backend_.rms_norm(e, w.enorm, eps_, e_norm);
  backend_.rms_norm(in.hidden, w.hnorm, eps_, h_norm);
  Tensor cat = backend_.scratch({t, 2 * h}, dt);
  backend_.copy_columns(e_norm, 0, cat, 0, h);
  backend_.copy_columns(h_norm, 0, cat, h, h);
  Tensor x = backend_.scratch({t, h}, dt);
  backend_.linear(cat, w.eh_proj, nullptr, x);

  // The decoder block with its residual (zeroed, so that its first add makes residual = x).
  Tensor residual = backend_.scratch({t, h}, dt);
  backend_.zero(residual);
  Tensor mlp_out = decoder_.forward(w.block, x, residual, in.rows, cache);
  MtpForwardOutput out;
  out.y = backend_.scratch({t, h}, dt);
  backend_.add(mlp_out, residual, out.y);

  // Only the rows whose drafts are wanted go through shared_head.
  const int64_t l = in.rows.logits_indices.size(0);
  if (l == 0) return out;
  Tensor selected = backend_.scratch({l, h}, dt), normed = backend_.scratch({l, h}, dt);
  backend_.gather_rows(out.y, in.rows.logits_indices, selected);
  backend_.rms_norm(selected, w.shared_head_norm, eps_, normed);
  out.logits = backend_.scratch({l, vocab_}, DType::kF32);
  if (dt == DType::kF32) {
    backend_.linear(normed, w.head, nullptr, out.logits);
  } else {
    Tensor logits = backend_.scratch({l, vocab_}, dt);
    backend_.linear(normed, w.head, nullptr, logits);
    backend_.cast(logits, out.logits);
  }
  return out;
}

}  // namespace specula
