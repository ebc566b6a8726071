// The persistent decoder-forward kernel's parameters and launcher (cuda_decoder_forward.cu): one
// forward of a Llama-family decoder over at most kMaxDecoderForwardRows rows in one launch of
// blocks that meet at grid barriers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/cuda_decoder_chain.h"  // DecoderChainLayer: a layer's weights and cache

namespace specula::cuda {

constexpr int kMaxForwardRows = 16;
constexpr int kMaxForwardLayers = 64;  // the parameters travel by value
constexpr int kMaxForwardSplits = 32;  // key splits of one (row, kv head)'s attention
// Trace events a block records (DecoderForwardParams::trace): the start, then per layer and phase
// (A, C, D, E, F) the phase's end and the barrier's release, then the end.
constexpr int kForwardTraceEvents = 2 + kMaxForwardLayers * 10;

struct DecoderForwardParams {
  DecoderChainLayer layers[kMaxForwardLayers];
  int num_layers = 0;
  const __nv_bfloat16* embed = nullptr;       // [V, H]
  const __nv_bfloat16* final_norm = nullptr;  // [H]
  const __nv_bfloat16* lm_head = nullptr;     // [V, H]
  const float* cos_sin = nullptr;             // [max_pos, rotary_dim]: cos | sin (neox pairs)
  int rotary_dim = 0;
  int max_pos = 0;
  int hidden = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  float eps = 0.0f, scale = 1.0f;

  // The batch (backend/attention_metadata.h): rows [query_start_loc[s], query_start_loc[s + 1])
  // are sequence s's last query tokens of seq_lens[s]; rows past query_start_loc[num_seqs] are padding.
  int rows = 0;
  int num_seqs = 0;
  const int32_t* token_ids = nullptr;        // [rows]
  const int32_t* positions = nullptr;        // [rows]: RoPE positions
  const int64_t* slots = nullptr;            // [rows]: K/V slot, -1 for none
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]
  const int32_t* seq_lens = nullptr;         // [num_seqs]
  const int32_t* block_tables = nullptr;     // [num_seqs, table_width]
  int table_width = 0;
  int block_size = 0;
  int64_t num_slots = 0;
  const int32_t* logits_indices = nullptr;  // [num_logits]
  int num_logits = 0;
  float* logits = nullptr;             // [num_logits, V]
  __nv_bfloat16* hidden_out = nullptr;  // [rows, H] or null

  // Global scratch the blocks exchange through (L2): the residual stream, q/k/v, the MLP's
  // activation, attention partials, and the grid barrier's two counters (zero between launches).
  float* x = nullptr;             // [rows, H]
  float* qkv = nullptr;           // [rows, (Hq + 2 Hk) D]
  __nv_bfloat16* act = nullptr;   // [rows, I]
  float* partials = nullptr;      // [rows, Hq, kMaxForwardSplits, D + 2]
  unsigned* grid_sync = nullptr;  // [2]
  unsigned long long* trace = nullptr;  // [blocks, kForwardTraceEvents] %globaltimer ns, or null
};

// Dynamic shared memory a block of a launch of `blocks` blocks needs.
int64_t decoder_forward_smem(const DecoderForwardParams& p, int blocks);
// Blocks of `smem` bytes that can be resident at once (one an SM at most), or 0.
int decoder_forward_max_blocks(const DecoderForwardParams& p, int64_t smem);
// One cooperative launch of `blocks` blocks on `stream`.
cudaError_t launch_decoder_forward(const DecoderForwardParams& p, int blocks, int64_t smem, cudaStream_t stream);

}  // namespace specula::cuda
