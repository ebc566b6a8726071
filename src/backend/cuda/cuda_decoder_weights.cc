// The fused decoder kernels' checks of a DecoderWeights and its cache (cuda_decoder_weights.h).
#include "backend/cuda/cuda_decoder_weights.h"

namespace specula {
namespace {

const __nv_bfloat16* bf16_ptr(const Tensor* t) {
  return t ? static_cast<const __nv_bfloat16*>(t->data()) : nullptr;
}

// bf16 on the GPU of `shape` (absent: `optional`).
bool weight_fits(const Tensor* t, std::initializer_list<int64_t> shape, bool optional) {
  if (!t || !t->defined()) return optional;
  if (t->device() != Device::kCUDA || t->dtype() != DType::kBF16 || t->ndim() != static_cast<int>(shape.size()))
    return false;
  int i = 0;
  for (int64_t s : shape)
    if (t->size(i++) != s) return false;
  return true;
}

}  // namespace

bool fused_decoder_dims(const DecoderWeights& w, FusedDecoderDims& dims) {
  if (w.layers.empty() || !w.embed_tokens || !w.embed_tokens->defined() || w.embed_tokens->ndim() != 2 ||
      !w.cos_sin || w.cos_sin->dtype() != DType::kF32 || w.num_kv_heads <= 0 || w.num_q_heads % w.num_kv_heads != 0 ||
      !w.layers.front().down_proj || !w.layers.front().down_proj->defined())
    return false;
  const int64_t h = w.embed_tokens->size(1), vocab = w.embed_tokens->size(0), d = w.head_dim;
  const int64_t nq = w.num_q_heads * d, nkv = w.num_kv_heads * d, inter = w.layers.front().down_proj->size(1);
  if (h % 8 != 0 || inter % 8 != 0 || nq % 8 != 0 || d % 8 != 0 || d > 256 || w.rotary_dim > d) return false;
  const bool eagle3 = w.hidden_norm != nullptr;
  const int64_t qkv = nq + 2 * nkv, in = eagle3 ? 2 * h : h;
  const int64_t lm_vocab = eagle3 && w.lm_head && w.lm_head->defined() && w.lm_head->ndim() == 2 ? w.lm_head->size(0)
                                                                                                 : vocab;
  if (eagle3 && (w.layers.size() != 1 || !weight_fits(w.hidden_norm, {h}, false) || lm_vocab < 1 ||
                 (w.draft_to_target && (w.draft_to_target->device() != Device::kCUDA ||
                                        w.draft_to_target->dtype() != DType::kI32 ||
                                        w.draft_to_target->numel() != lm_vocab))))
    return false;
  for (const DecoderLayerWeights& l : w.layers) {
    if (!weight_fits(l.input_layernorm, {h}, false) || !weight_fits(l.qkv_proj, {qkv, in}, false) ||
        !weight_fits(l.qkv_bias, {qkv}, true) || !weight_fits(l.q_norm, {d}, true) || !weight_fits(l.k_norm, {d}, true) ||
        !weight_fits(l.o_proj, {h, nq}, false) || !weight_fits(l.o_bias, {h}, true) ||
        !weight_fits(l.post_attention_layernorm, {h}, false) || !weight_fits(l.gate_up_proj, {2 * inter, h}, false) ||
        !weight_fits(l.gate_up_bias, {2 * inter}, true) || !weight_fits(l.down_proj, {h, inter}, false) ||
        !weight_fits(l.down_bias, {h}, true))
      return false;
  }
  if (!weight_fits(w.embed_tokens, {vocab, h}, false) || !weight_fits(w.norm, {h}, false) ||
      !weight_fits(w.lm_head, {lm_vocab, h}, false))
    return false;
  dims = {h, vocab, d, inter, lm_vocab, nq, nkv};
  return true;
}

bool fused_kv_fits(const DecoderWeights& w, const std::vector<KVCacheLayer>& kv, int block_size) {
  if (kv.size() != w.layers.size()) return false;
  for (const KVCacheLayer& l : kv)
    if (l.k.dtype() != DType::kBF16 || l.v.dtype() != DType::kBF16 || l.k.ndim() != 4 || l.v.ndim() != 4 ||
        l.k.size(2) != w.num_kv_heads || l.k.size(3) != w.head_dim || l.v.size(3) != w.head_dim ||
        l.k.size(1) != block_size)
      return false;
  return true;
}

void fill_fused_layers(const DecoderWeights& w, std::vector<KVCacheLayer>& kv, cuda::DecoderChainLayer* out) {
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayerWeights& src = w.layers[i];
    cuda::DecoderChainLayer& l = out[i];
    l.in_norm = bf16_ptr(src.input_layernorm);
    l.qkv = bf16_ptr(src.qkv_proj);
    l.qkv_bias = bf16_ptr(src.qkv_bias);
    l.q_norm = bf16_ptr(src.q_norm);
    l.k_norm = bf16_ptr(src.k_norm);
    l.o = bf16_ptr(src.o_proj);
    l.o_bias = bf16_ptr(src.o_bias);
    l.post_norm = bf16_ptr(src.post_attention_layernorm);
    l.gate_up = bf16_ptr(src.gate_up_proj);
    l.gate_up_bias = bf16_ptr(src.gate_up_bias);
    l.down = bf16_ptr(src.down_proj);
    l.down_bias = bf16_ptr(src.down_bias);
    l.k_cache = static_cast<__nv_bfloat16*>(kv[i].k.data());
    l.v_cache = static_cast<__nv_bfloat16*>(kv[i].v.data());
  }
}

}  // namespace specula
