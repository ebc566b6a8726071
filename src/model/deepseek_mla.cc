// Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1), in its absorbed form.
//
// transformers computes, per head h, with c = RMSNorm(latent) the token's compressed KV:
//   k_h = [W_UK,h c | rope(k_pe)],  v_h = W_UV,h c,  q_h = [q_nope,h | rope(q_pe,h)]
//   out_h = softmax(q_h . k_h * scale) v_h
// Since q_nope,h . (W_UK,h c) = (W_UK,h^T q_nope,h) . c and sum_j p_j W_UV,h c_j = W_UV,h sum_j p_j c_j,
// the same attention runs over the latent itself:
//   q'_h = [W_UK,h^T q_nope,h | rope(q_pe,h)]          [C + dr]
//   o'_h = softmax(q'_h . [c_j | rope(k_pe)_j] * scale) c_j   [C]   (one shared kv "head")
//   out_h = W_UV,h o'_h                                [dv]
// so the cache holds C + dr values per token instead of Hq (dn + dr + dv): MLA's point. The
// paged cache's MLA form (backend.h) stores [c | rope(k_pe)] and reads the value as the first C
// dims of each entry.
#include <string>

#include "model/deepseek_layer.h"

namespace specula {
namespace {

const Tensor* if_defined(const Tensor& t) { return t.defined() ? &t : nullptr; }

}  // namespace

MlaWeights DeepseekDecoder::load_mla(DeepseekWeightLoader& l, const std::string& p) const {
  const bool bias = config_.attention_bias;
  const int64_t q_dim = heads_ * (nope_ + rope_dim_);
  MlaWeights w;
  if (config_.q_lora_rank) {
    const int64_t r = *config_.q_lora_rank;
    w.q_a_proj = l.load(p + "q_a_proj.weight", {r, hidden_});
    if (bias) w.q_a_bias = l.load(p + "q_a_proj.bias", {r});
    w.q_a_layernorm = l.load(p + "q_a_layernorm.weight", {r});
    w.q_b_proj = l.load(p + "q_b_proj.weight", {q_dim, r});
  } else {
    w.q_proj = l.load(p + "q_proj.weight", {q_dim, hidden_});
  }
  w.kv_a_proj = l.load(p + "kv_a_proj_with_mqa.weight", {latent_ + rope_dim_, hidden_});
  if (bias) w.kv_a_bias = l.load(p + "kv_a_proj_with_mqa.bias", {latent_ + rope_dim_});
  w.kv_a_layernorm = l.load(p + "kv_a_layernorm.weight", {latent_});
  std::tie(w.w_uk_t, w.w_uv) = l.load_absorbed_kv_b(p + "kv_b_proj.weight");
  w.o_proj = l.load(p + "o_proj.weight", {hidden_, heads_ * v_dim_});
  if (config_.o_proj_bias) w.o_bias = l.load(p + "o_proj.bias", {hidden_});
  return w;
}

// x: [T, H] (normalised) -> [T, H].
Tensor DeepseekDecoder::attention(const MlaWeights& w, const Tensor& x, const ForwardInput& in, KVCacheLayer& cache) {
  const DType dt = backend_.compute_dtype();
  const int64_t t = x.size(0), hq = heads_, qk = nope_ + rope_dim_, entry = latent_ + rope_dim_;

  // Queries [T, Hq (dn + dr)]: each head's no-rope part, then its rope part.
  Tensor q = backend_.scratch({t, hq * qk}, dt);
  if (w.q_proj.defined()) {
    backend_.linear(x, w.q_proj, nullptr, q);
  } else {
    const int64_t r = w.q_a_proj.size(0);
    Tensor qa = backend_.scratch({t, r}, dt), qa_norm = backend_.scratch({t, r}, dt);
    backend_.linear(x, w.q_a_proj, if_defined(w.q_a_bias), qa);
    backend_.rms_norm(qa, w.q_a_layernorm, eps_, qa_norm);
    backend_.linear(qa_norm, w.q_b_proj, nullptr, q);
  }

  // Keys: the compressed latent c (normalised) and one rope key shared by all heads, written to
  // the cache as [c | rope(k_pe)], through which attention then reads every key. The absorbed
  // query [T, Hq, C + dr] = [W_UK^T q_nope | rope(q_pe)]: the prologue writes its rope part, the
  // per-head map its first C columns, from each head's first dn columns of q in place.
  Tensor kv_a = backend_.scratch({t, entry}, dt);
  backend_.linear(x, w.kv_a_proj, if_defined(w.kv_a_bias), kv_a);
  Tensor q_mla = backend_.scratch({t, hq, entry}, dt);
  Backend::MlaPrologue prologue;
  prologue.num_heads = hq;
  prologue.nope_dim = nope_;
  prologue.rope_dim = rope_dim_;
  prologue.kv_norm = &w.kv_a_layernorm;
  prologue.eps = eps_;
  prologue.positions = &in.positions;
  prologue.cos_sin = &cos_sin_;
  prologue.neox = neox_rope_;
  backend_.mla_prologue(q, kv_a, prologue, cache, in.attn.slot_mapping, q_mla);
  backend_.head_linear(q.reshape({t, hq, qk}), w.w_uk_t, q_mla);

  // Multi-query attention over the latent cache; the values are each entry's first C dims.
  Tensor o_latent = backend_.scratch({t, hq, latent_}, dt);
  const auto& qsl = in.attn.query_start_loc_host;
  const int64_t real_rows = qsl.empty() ? 0 : qsl.back();
  if (real_rows < t) {  // padding rows: attention leaves them alone, keep them finite
    Tensor pad = o_latent.slice(real_rows, t);
    backend_.zero(pad);
  }
  backend_.paged_attention(q_mla, cache, in.attn, attn_scale_, o_latent);

  // Per-head values W_UV o', then o_proj.
  Tensor o_heads = backend_.scratch({t, hq, v_dim_}, dt);
  backend_.head_linear(o_latent, w.w_uv, o_heads);
  Tensor out = backend_.scratch({t, hidden_}, dt);
  backend_.linear(o_heads.reshape({t, hq * v_dim_}), w.o_proj, if_defined(w.o_bias), out);
  return out;
}

}  // namespace specula
