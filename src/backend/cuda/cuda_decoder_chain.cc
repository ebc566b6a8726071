// CUDA backend: Backend::decoder_greedy_chain as one persistent kernel (cuda_decoder_chain.cu).
// The kernel takes bf16 Llama-family decoders small enough for its fixed limits (rows, layers,
// weights that fit one thread-block cluster's shared memory); anything else returns false and the
// caller runs the chain layer by layer.
// SPECULA_FUSED_DECODER_CHAIN=0 turns the fused form off (for comparing the two).
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_decoder_chain.h"
#include "core/logging.h"

namespace specula {
namespace {

// SPECULA_FUSED_CHAIN_LM_HEAD=l2 keeps the lm_head rows in L2 (the kernel's other lm_head path:
// for tests and comparisons). Read on every chain so that a test can switch it.
bool lm_head_in_l2() {
  const char* v = std::getenv("SPECULA_FUSED_CHAIN_LM_HEAD");
  return v && std::strcmp(v, "l2") == 0;
}

bool fused_chain_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SPECULA_FUSED_DECODER_CHAIN");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

const __nv_bfloat16* bf16_ptr(const Tensor* t) {
  return t ? static_cast<const __nv_bfloat16*>(t->data()) : nullptr;
}

// Every weight bf16 on the GPU, of the shape the dims say (biases and q/k norms optional).
bool weights_fit(const DecoderChain& c, int64_t h, int64_t nq, int64_t nkv, int64_t inter, int64_t vocab) {
  auto ok = [](const Tensor* t, std::initializer_list<int64_t> shape, bool optional) {
    if (!t || !t->defined()) return optional;
    if (t->device() != Device::kCUDA || t->dtype() != DType::kBF16 || t->ndim() != static_cast<int>(shape.size()))
      return false;
    int i = 0;
    for (int64_t s : shape)
      if (t->size(i++) != s) return false;
    return true;
  };
  const int64_t d = c.head_dim, qkv = nq + 2 * nkv;
  for (const DecoderChainLayerWeights& l : c.layers) {
    if (!ok(l.input_layernorm, {h}, false) || !ok(l.qkv_proj, {qkv, h}, false) || !ok(l.qkv_bias, {qkv}, true) ||
        !ok(l.q_norm, {d}, true) || !ok(l.k_norm, {d}, true) || !ok(l.o_proj, {h, nq}, false) ||
        !ok(l.o_bias, {h}, true) || !ok(l.post_attention_layernorm, {h}, false) ||
        !ok(l.gate_up_proj, {2 * inter, h}, false) || !ok(l.gate_up_bias, {2 * inter}, true) ||
        !ok(l.down_proj, {h, inter}, false) || !ok(l.down_bias, {h}, true))
      return false;
  }
  return ok(c.embed_tokens, {vocab, h}, false) && ok(c.norm, {h}, false) && ok(c.lm_head, {vocab, h}, false);
}

}  // namespace

bool CudaBackend::decoder_greedy_chain(const DecoderChain& c) {
  if (!fused_chain_enabled() || c.steps <= 0 || c.rows <= 0 || c.rows > cuda::kMaxChainRows || c.layers.empty() ||
      c.layers.size() > static_cast<size_t>(cuda::kMaxChainLayers) || !c.embed_tokens || !c.kv ||
      c.kv->size() != c.layers.size() || !c.cos_sin || c.cos_sin->dtype() != DType::kF32)
    return false;
  const int64_t h = c.embed_tokens->size(1), vocab = c.embed_tokens->size(0), d = c.head_dim;
  const int64_t nq = c.num_q_heads * d, nkv = c.num_kv_heads * d;
  const int64_t inter = c.layers.front().down_proj ? c.layers.front().down_proj->size(1) : 0;
  // 16-byte rows everywhere; head dims the attention stage splits into 8-wide chunks of a block.
  if (h % 8 != 0 || inter % 8 != 0 || nq % 8 != 0 || d % 8 != 0 || d > 256 || c.num_kv_heads <= 0 ||
      c.num_q_heads % c.num_kv_heads != 0 || c.rotary_dim > d || !weights_fit(c, h, nq, nkv, inter, vocab))
    return false;
  for (const KVCacheLayer& l : *c.kv)
    if (l.k.dtype() != DType::kBF16 || l.v.dtype() != DType::kBF16 || l.k.ndim() != 4 || l.k.size(2) != c.num_kv_heads ||
        l.k.size(3) != d || l.v.size(3) != d || l.k.size(1) != c.block_size)
      return false;
  SPECULA_CHECK(c.first_tokens.dtype() == DType::kI32 && c.first_tokens.numel() >= c.rows &&
                    c.positions.dtype() == DType::kI32 && c.positions.numel() >= c.steps * c.rows &&
                    c.slots.dtype() == DType::kI64 && c.slots.numel() >= c.steps * c.rows &&
                    c.block_tables.dtype() == DType::kI32 && c.block_tables.ndim() == 2 &&
                    c.block_tables.size(0) >= c.rows && c.out_tokens.dtype() == DType::kI32 &&
                    c.out_tokens.numel() >= c.steps * c.rows,
                "decoder_greedy_chain: inputs of {} rows x {} steps: first_tokens {}, positions {}, slots {}, "
                "block_tables {}, out_tokens {}",
                c.rows, c.steps, c.first_tokens.describe(), c.positions.describe(), c.slots.describe(),
                c.block_tables.describe(), c.out_tokens.describe());

  cuda::DecoderChainParams p;
  p.num_layers = static_cast<int>(c.layers.size());
  for (int i = 0; i < p.num_layers; ++i) {
    const DecoderChainLayerWeights& w = c.layers[static_cast<size_t>(i)];
    cuda::DecoderChainLayer& l = p.layers[i];
    l.in_norm = bf16_ptr(w.input_layernorm);
    l.qkv = bf16_ptr(w.qkv_proj);
    l.qkv_bias = bf16_ptr(w.qkv_bias);
    l.q_norm = bf16_ptr(w.q_norm);
    l.k_norm = bf16_ptr(w.k_norm);
    l.o = bf16_ptr(w.o_proj);
    l.o_bias = bf16_ptr(w.o_bias);
    l.post_norm = bf16_ptr(w.post_attention_layernorm);
    l.gate_up = bf16_ptr(w.gate_up_proj);
    l.gate_up_bias = bf16_ptr(w.gate_up_bias);
    l.down = bf16_ptr(w.down_proj);
    l.down_bias = bf16_ptr(w.down_bias);
    KVCacheLayer& kv = (*c.kv)[static_cast<size_t>(i)];
    l.k_cache = static_cast<__nv_bfloat16*>(kv.k.data());
    l.v_cache = static_cast<__nv_bfloat16*>(kv.v.data());
  }
  p.embed = bf16_ptr(c.embed_tokens);
  p.final_norm = bf16_ptr(c.norm);
  p.lm_head = bf16_ptr(c.lm_head);
  p.cos_sin = c.cos_sin->data_as<float>();
  p.rotary_dim = c.rotary_dim;
  p.max_pos = static_cast<int>(c.cos_sin->size(0));
  p.hidden = static_cast<int>(h);
  p.num_q_heads = static_cast<int>(c.num_q_heads);
  p.num_kv_heads = static_cast<int>(c.num_kv_heads);
  p.head_dim = static_cast<int>(d);
  p.intermediate = static_cast<int>(inter);
  p.vocab = static_cast<int>(vocab);
  p.eps = c.eps;
  p.scale = c.attn_scale;
  p.rows = c.rows;
  p.steps = c.steps;
  p.block_size = c.block_size;
  p.table_width = static_cast<int>(c.block_tables.size(1));
  p.num_slots = c.kv->front().k.size(0) * c.block_size;
  p.max_context = p.table_width * c.block_size;
  p.first_tokens = c.first_tokens.data_as<int32_t>();
  p.positions = c.positions.data_as<int32_t>();
  p.slots = c.slots.data_as<int64_t>();
  p.block_tables = c.block_tables.data_as<int32_t>();
  p.out_tokens = const_cast<int32_t*>(c.out_tokens.data_as<int32_t>());

  // A cluster of 16 blocks (the H100's largest) where the GPU has one free, else 8 (portable); the
  // model's weights must fit its shared memory (plan_decoder_chain).
  int64_t smem = 0;
  bool planned = false;
  for (const int cluster : {cuda::kMaxChainCluster, 8}) {
    smem = cuda::plan_decoder_chain(p, cluster, smem_budget_, lm_head_in_l2());
    if (smem <= 0) continue;
    auto [it, added] = chain_cluster_fits_.try_emplace({cluster, smem}, false);
    if (added) it->second = cuda::decoder_chain_max_clusters(p, smem) >= 1;
    if ((planned = it->second)) break;
  }
  if (!planned) return false;  // a larger model or context than the kernel is for
  check_cuda(cuda::launch_decoder_chain(p, smem, stream_), "decoder_greedy_chain");
  if (!chain_logged_) {
    LOG_INFO("Fused decoder chain: {} layers, {} rows, a cluster of {} blocks, {} KiB shared memory per block, "
             "lm_head in {}",
             p.num_layers, c.rows, p.cluster, smem / 1024, p.lm_head_in_smem ? "shared memory" : "L2");
    chain_logged_ = true;
  }
  return true;
}

}  // namespace specula
