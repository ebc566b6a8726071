// The persistent decode-chain kernel's parameters, plan and launcher (cuda_decoder_chain.cu): a
// small Llama-family decoder's `steps` decode steps of `rows` rows in
// one launch of one thread-block cluster whose shared memory holds the model's weights; or an
// EAGLE-3 head's (model/eagle_head.h), whose layer reads [input_layernorm(embedding),
// hidden_norm(g)] and chains g.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda {

constexpr int kMaxChainRows = 8;      // rows (padded sequences) of a chain
constexpr int kMaxChainLayers = 16;   // decoder layers (the parameters travel by value)
constexpr int kMaxChainCluster = 16;  // blocks of the cluster (the H100's non-portable maximum)
constexpr int kMaxChainGroup = 8;     // q heads per kv head

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
  const __nv_bfloat16* lm_head = nullptr;     // [lm_vocab, H] (may be embed: tied)
  const float* cos_sin = nullptr;             // [max_pos, rotary_dim]: cos | sin (neox pairs)
  int rotary_dim = 0;
  int max_pos = 0;
  int hidden = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0, intermediate = 0;
  int vocab = 0;     // token ids (embedding rows)
  int lm_vocab = 0;  // lm_head rows: vocab, or an EAGLE-3 head's draft vocabulary
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
  int32_t* out_tokens = nullptr;          // [steps * rows]: each step's token (the next step's input)

  // Sampled rows (backend/decoder_chain.h): row r draws at step s < q_steps[r] where
  // inv_temperature[r] > 0, from uniform_draw(seeds[r], positions[s * rows + r] + draw_offset,
  // draw_stream), writing q into q_store row q_first_rows[r] + s; the rest take the argmax.
  int samples = 0;  // any row draws
  float inv_temperature[kMaxChainRows] = {};
  uint64_t seeds[kMaxChainRows] = {};
  int32_t q_first_rows[kMaxChainRows] = {};
  int32_t q_steps[kMaxChainRows] = {};
  int draw_offset = 1;
  uint32_t draw_stream = 0;
  float* q_store = nullptr;  // [R, vocab]

  // An EAGLE-3 head (hidden_norm set; one layer): step s's layer reads x = [input_layernorm(
  // embed(token)), hidden_norm(g)] (qkv [.., 2 H]) with g as its residual; g starts at
  // first_hidden and each step's output (before the final norm) is the next step's g. The argmax
  // d over lm_head's draft vocabulary is the token draft_to_target[d] (null: d).
  const __nv_bfloat16* hidden_norm = nullptr;  // [H]
  const __nv_bfloat16* first_hidden = nullptr;  // [rows, H]
  const int32_t* draft_to_target = nullptr;     // [lm_vocab]

  // The plan (plan_decoder_chain): the cluster's blocks; a kv group's q heads split over q_split
  // attention units (blocks 0 .. num_kv_heads * q_split - 1 hold one unit's weights each: the
  // fewest splits whose weights fit); block b computes MLP features [b * mlp_cols, (b + 1) *
  // mlp_cols) (mlp_blocks have any) and logits [vocab_begin[b], vocab_begin[b + 1]), their lm_head
  // rows in its shared memory when lm_head_in_smem.
  int cluster = 0;
  int q_split = 1;
  int mlp_cols = 0;
  int mlp_blocks = 0;
  int vocab_begin[kMaxChainCluster + 1] = {};
  int lm_head_in_smem = 0;
};

// Plans p for a cluster of `cluster` blocks of at most `smem_budget` bytes of dynamic shared
// memory each: returns the bytes a block needs, or 0 when the model's per-block weights (the
// attention and MLP slices; lm_head rows go to L2 if they must, or if lm_head_in_l2) or the shapes
// do not fit.
int64_t plan_decoder_chain(DecoderChainParams& p, int cluster, int64_t smem_budget, bool lm_head_in_l2 = false);
// Clusters of p.cluster blocks with `smem` bytes each that the GPU can hold at once (0: none).
int decoder_chain_max_clusters(const DecoderChainParams& p, int64_t smem);
// One cluster of p.cluster blocks on `stream`.
cudaError_t launch_decoder_chain(const DecoderChainParams& p, int64_t smem, cudaStream_t stream);

}  // namespace specula::cuda
