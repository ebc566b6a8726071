// The persistent greedy decode-chain kernel's parameters and launcher (cuda_decoder_chain.cu):
// a small Llama-family decoder's `steps` decode steps of `rows` rows in one cooperative launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda {

constexpr int kMaxChainRows = 8;     // rows (padded sequences) of a chain
constexpr int kMaxChainLayers = 16;  // decoder layers (the parameters travel by value)
constexpr int kMaxChainBlocks = 132; // resident blocks (one per SM on the H100)

struct DecoderChainLayer {
  const __nv_bfloat16* in_norm = nullptr;       // [H]
  const __nv_bfloat16* qkv = nullptr;           // [(Hq + 2 Hk) D, H]
  const __nv_bfloat16* qkv_bias = nullptr;      // [(Hq + 2 Hk) D] or null
  const __nv_bfloat16* q_norm = nullptr;        // [D] or null (Qwen3)
  const __nv_bfloat16* k_norm = nullptr;        // [D] or null
  const __nv_bfloat16* o = nullptr;             // [H, Hq D]
  const __nv_bfloat16* o_bias = nullptr;        // [H] or null
  const __nv_bfloat16* post_norm = nullptr;     // [H]
  const __nv_bfloat16* gate_up = nullptr;       // [2 I, H]
  const __nv_bfloat16* gate_up_bias = nullptr;  // [2 I] or null
  const __nv_bfloat16* down = nullptr;          // [H, I]
  const __nv_bfloat16* down_bias = nullptr;     // [H] or null
  __nv_bfloat16* k_cache = nullptr;             // [num_slots, Hk, D]
  __nv_bfloat16* v_cache = nullptr;             // [num_slots, Hk, D]
};

struct DecoderChainParams {
  DecoderChainLayer layers[kMaxChainLayers];
  int num_layers = 0;
  const __nv_bfloat16* embed = nullptr;       // [V, H]
  const __nv_bfloat16* final_norm = nullptr;  // [H]
  const __nv_bfloat16* lm_head = nullptr;     // [V, H]
  const float* cos_sin = nullptr;             // [max_pos, rotary_dim]: cos | sin (neox pairs)
  int rotary_dim = 0;
  int max_pos = 0;
  int hidden = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  float eps = 0.0f, scale = 1.0f;

  int rows = 0;   // padded sequences, one decode row each, at most kMaxChainRows
  int steps = 0;  // decode steps
  int block_size = 0;
  int table_width = 0;      // block-table row stride
  int64_t num_slots = 0;    // cache slots (num_blocks * block_size)
  int max_context = 0;      // the longest key range a row may attend (table_width * block_size)
  const int32_t* first_tokens = nullptr;  // [rows]: step 0's input tokens
  const int32_t* positions = nullptr;     // [steps * rows]: step s, row r at s * rows + r
  const int64_t* slots = nullptr;         // [steps * rows]: K/V slot, -1 for none
  const int32_t* block_tables = nullptr;  // [rows, table_width]
  int32_t* out_tokens = nullptr;          // [steps * rows]: each step's argmax (the next step's input)

  // Device scratch (bf16 as the layer-by-layer path stores them): the residual [rows, H], the
  // attention output [rows, Hq D], the activation [rows, I]; the per-block argmax candidates
  // [kMaxChainBlocks, kMaxChainRows].
  __nv_bfloat16* res = nullptr;
  __nv_bfloat16* attn = nullptr;
  __nv_bfloat16* act = nullptr;
  float* cand_val = nullptr;
  int32_t* cand_idx = nullptr;

  // Work split and dynamic shared memory layout, from plan_decoder_chain.
  int hidden_per_block = 0;     // stages O and D: block b computes hidden columns [b * n, (b + 1) * n)
  int gate_cols_per_block = 0;  // stage G: block b computes gate_up columns [b * n, (b + 1) * n)
  int vocab_per_block = 0;      // stage F: block b computes lm_head columns [b * n, (b + 1) * n)
  int vocab_blocks = 0;         // blocks with lm_head columns (argmax candidates)
  int64_t smem_xs_bytes = 0;
  int64_t smem_f_bytes = 0;
};

struct DecoderChainPlan {
  int hidden_per_block = 0, gate_cols_per_block = 0, vocab_per_block = 0, vocab_blocks = 0;
  int64_t smem_xs_bytes = 0, smem_f_bytes = 0, smem_bytes = 0;
  int blocks = 0;
};

// Shared memory and grid for these shapes (rows, dims and max_context set) on `sm_count` SMs.
DecoderChainPlan plan_decoder_chain(const DecoderChainParams& p, int sm_count);
// Launches with the plan's smem fields set in p; cudaErrorCooperativeLaunchTooLarge when `blocks`
// cannot all be resident.
cudaError_t launch_decoder_chain(const DecoderChainParams& p, int blocks, cudaStream_t stream);

}  // namespace specula::cuda
