// What paged attention needs to know about one step's flattened batch.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace specula {

// The batch is "varlen": the new tokens of every scheduled sequence are concatenated into one
// [num_tokens, ...] tensor. Sequence s owns query rows [query_start_loc[s], query_start_loc[s+1]);
// those rows are the LAST query_len tokens of its seq_lens[s] tokens, and all seq_lens[s] keys and
// values are already in the paged cache when attention runs (write_kv_cache runs first). Query
// row i of sequence s therefore sits at position seq_lens[s] - query_len + i and, causally,
// attends to keys 0..that position. This one description covers prefill, chunked prefill, decode
// and speculative verification (k+1 query rows per sequence).
struct AttentionMetadata {
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;     // rows of q; rows past query_start_loc[num_seqs] are padding
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
  int32_t block_size = 16;
  Tensor query_start_loc;     // I32 [num_seqs + 1], on the backend's device
  Tensor seq_lens;            // I32 [num_seqs]
  Tensor block_tables;        // I32 [num_seqs, max_blocks_per_seq]; block ids into the cache
  Tensor slot_mapping;        // I64 [num_tokens]; block * block_size + offset, -1 = don't write
  // Host copies, so that a backend can size launches (or the CPU loop) without reading the device.
  std::vector<int32_t> query_start_loc_host;
  std::vector<int32_t> seq_lens_host;
};

// One layer's paged cache: K and V each [num_blocks, block_size, num_kv_heads, head_dim], in the
// backend's compute dtype or (--kv-cache-dtype fp8) F8_E4M3, which holds K / k_scale and
// V / v_scale: writers divide by the scale, attention multiplies by it.
struct KVCacheLayer {
  Tensor k;
  Tensor v;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

}  // namespace specula
