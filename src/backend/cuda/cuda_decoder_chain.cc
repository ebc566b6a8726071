// CUDA backend: Backend::decoder_chain as one persistent kernel (cuda_decoder_chain.cu), argmax
// or sampled rows.
// The kernel takes bf16 Llama-family decoders and EAGLE-3 heads small enough for its fixed limits
// (rows, layers, weights that fit one thread-block cluster's shared memory); anything else
// returns false and the caller runs the chain layer by layer.
// SPECULA_FUSED_DECODER_CHAIN=0 turns the fused form off (for comparing the two).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_decoder_chain.h"
#include "backend/cuda/cuda_decoder_weights.h"
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

}  // namespace

bool CudaBackend::decoder_chain(const DecoderChain& c) {
  FusedDecoderDims dims;
  if (!fused_chain_enabled() || c.steps <= 0 || c.rows <= 0 || c.rows > cuda::kMaxChainRows ||
      c.layers.size() > static_cast<size_t>(cuda::kMaxChainLayers) || !c.kv || !fused_decoder_dims(c, dims) ||
      !fused_kv_fits(c, *c.kv, c.block_size))
    return false;
  const int64_t h = dims.hidden, vocab = dims.vocab, d = dims.head_dim, inter = dims.intermediate;
  SPECULA_CHECK(c.first_tokens.dtype() == DType::kI32 && c.first_tokens.numel() >= c.rows &&
                    c.positions.dtype() == DType::kI32 && c.positions.numel() >= c.steps * c.rows &&
                    c.slots.dtype() == DType::kI64 && c.slots.numel() >= c.steps * c.rows &&
                    c.block_tables.dtype() == DType::kI32 && c.block_tables.ndim() == 2 &&
                    c.block_tables.size(0) >= c.rows && c.out_tokens.dtype() == DType::kI32 &&
                    c.out_tokens.numel() >= c.steps * c.rows,
                "decoder_chain: inputs of {} rows x {} steps: first_tokens {}, positions {}, slots {}, "
                "block_tables {}, out_tokens {}",
                c.rows, c.steps, c.first_tokens.describe(), c.positions.describe(), c.slots.describe(),
                c.block_tables.describe(), c.out_tokens.describe());
  const bool eagle3 = c.hidden_norm != nullptr;
  SPECULA_CHECK(!eagle3 || (c.first_hidden.dtype() == DType::kBF16 && c.first_hidden.device() == Device::kCUDA &&
                            c.first_hidden.ndim() == 2 && c.first_hidden.size(0) >= c.rows &&
                            c.first_hidden.size(1) == h),
                "decoder_chain: an EAGLE-3 head's first hidden states must be bf16 [{}, {}] on the GPU, got {}",
                c.rows, h, c.first_hidden.describe());

  cuda::DecoderChainParams p;
  p.num_layers = static_cast<int>(c.layers.size());
  fill_fused_layers(c, *c.kv, p.layers);
  p.embed = static_cast<const __nv_bfloat16*>(c.embed_tokens->data());
  p.final_norm = static_cast<const __nv_bfloat16*>(c.norm->data());
  p.lm_head = static_cast<const __nv_bfloat16*>(c.lm_head->data());
  p.cos_sin = c.cos_sin->data_as<float>();
  p.rotary_dim = c.rotary_dim;
  p.max_pos = static_cast<int>(c.cos_sin->size(0));
  p.hidden = static_cast<int>(h);
  p.num_q_heads = static_cast<int>(c.num_q_heads);
  p.num_kv_heads = static_cast<int>(c.num_kv_heads);
  p.head_dim = static_cast<int>(d);
  p.intermediate = static_cast<int>(inter);
  p.vocab = static_cast<int>(vocab);
  p.lm_vocab = static_cast<int>(dims.lm_vocab);
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
  if (c.samples()) {
    const size_t rows = static_cast<size_t>(c.rows);
    SPECULA_CHECK(c.temperatures.size() == rows && c.seeds.size() == rows && c.q_first_rows.size() == rows &&
                      c.q_steps.size() == rows && c.q_store.dtype() == DType::kF32 &&
                      c.q_store.device() == Device::kCUDA && c.q_store.ndim() == 2 && c.q_store.size(1) == vocab,
                  "decoder_chain: a sampled chain of {} rows needs per-row temperatures, seeds and q rows ({}, {}, "
                  "{}, {}) and an F32 [R, {}] q store on the GPU, got {}",
                  rows, c.temperatures.size(), c.seeds.size(), c.q_first_rows.size(), c.q_steps.size(), vocab,
                  c.q_store.describe());
    p.samples = 1;
    for (size_t r = 0; r < rows; ++r) {
      if (!(c.temperatures[r] > 0.0f)) continue;
      SPECULA_CHECK(c.q_first_rows[r] >= 0 && c.q_first_rows[r] + std::min(c.q_steps[r], c.steps) <= c.q_store.size(0),
                    "decoder_chain: row {}'s q rows {}..+{} outside the store of {}", r, c.q_first_rows[r],
                    c.q_steps[r], c.q_store.size(0));
      p.inv_temperature[r] = 1.0f / c.temperatures[r];  // the token sampler's __fdiv_rn(1, T)
      p.seeds[r] = c.seeds[r];
      p.q_first_rows[r] = c.q_first_rows[r];
      p.q_steps[r] = c.q_steps[r];
    }
    p.draw_offset = c.draw_offset;
    p.draw_stream = c.draw_stream;
    p.q_store = const_cast<float*>(c.q_store.data_as<float>());
  }
  if (eagle3) {
    p.hidden_norm = static_cast<const __nv_bfloat16*>(c.hidden_norm->data());
    p.first_hidden = static_cast<const __nv_bfloat16*>(c.first_hidden.data());
    p.draft_to_target = c.draft_to_target ? c.draft_to_target->data_as<int32_t>() : nullptr;
  }

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
  check_cuda(cuda::launch_decoder_chain(p, smem, stream_), "decoder_chain");
  if (!chain_logged_) {
    LOG_INFO("Fused decoder chain{}{}: {} layers, {} rows, a cluster of {} blocks ({} per kv group's attention), {} KiB "
             "shared memory per block, lm_head in {}",
             eagle3 ? " (EAGLE-3 head)" : "", p.samples ? ", sampled drafts" : "", p.num_layers, c.rows, p.cluster, p.q_split, smem / 1024,
             p.lm_head_in_smem ? "shared memory" : "L2");
    chain_logged_ = true;
  }
  return true;
}

}  // namespace specula
