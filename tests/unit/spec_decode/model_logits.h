// Next-token logits of whole sequences straight from a Model (one prefill forward over a fresh
// paged cache), for tests that need exact model distributions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace specula::testing {

// The next-token logits after each sequence: one prefill forward over all of them.
inline std::vector<std::vector<float>> last_logits(Model& model, Backend& backend, const std::vector<std::vector<int32_t>>& seqs) {
  const int bs = 16;
  std::vector<int32_t> tokens, positions, qsl = {0}, seq_lens, logits_idx;
  std::vector<int64_t> slots;
  std::vector<std::vector<int32_t>> tables;
  int next_block = 0, width = 1;
  for (const std::vector<int32_t>& s : seqs) {
    const int n = static_cast<int>(s.size()), blocks = (n + bs - 1) / bs;
    std::vector<int32_t> table;
    for (int b = 0; b < blocks; ++b) table.push_back(next_block++);
    for (int p = 0; p < n; ++p) {
      tokens.push_back(s[p]);
      positions.push_back(p);
      slots.push_back(static_cast<int64_t>(table[p / bs]) * bs + p % bs);
    }
    logits_idx.push_back(static_cast<int32_t>(tokens.size()) - 1);
    qsl.push_back(static_cast<int32_t>(tokens.size()));
    seq_lens.push_back(n);
    width = std::max(width, blocks);
    tables.push_back(table);
  }
  std::vector<int32_t> flat;
  for (auto& t : tables) {
    t.resize(static_cast<size_t>(width), 0);
    flat.insert(flat.end(), t.begin(), t.end());
  }
  const KVCacheSpec spec = model.kv_cache_spec();
  std::vector<KVCacheLayer> kv(static_cast<size_t>(spec.num_layers));
  for (KVCacheLayer& l : kv) {
    l.k = backend.empty({next_block, bs, spec.num_kv_heads, spec.head_dim}, backend.compute_dtype());
    l.v = backend.empty({next_block, bs, spec.num_kv_heads, spec.v_head_dim}, backend.compute_dtype());
  }
  ForwardInput in;
  in.token_ids = Tensor::from_i32(tokens);
  in.positions = Tensor::from_i32(positions);
  in.logits_indices = Tensor::from_i32(logits_idx);
  const int n = static_cast<int>(seqs.size());
  in.attn.num_seqs = n;
  in.attn.num_tokens = static_cast<int32_t>(tokens.size());
  in.attn.max_query_len = *std::max_element(seq_lens.begin(), seq_lens.end());
  in.attn.max_seq_len = in.attn.max_query_len;
  in.attn.block_size = bs;
  in.attn.query_start_loc = Tensor::from_i32(qsl);
  in.attn.seq_lens = Tensor::from_i32(seq_lens);
  in.attn.slot_mapping = Tensor::from_i64(slots);
  in.attn.block_tables = Tensor::from_i32(flat, {n, width});
  in.attn.query_start_loc_host = qsl;
  in.attn.seq_lens_host = seq_lens;
  const Tensor logits = model.forward(in, kv).logits;
  std::vector<std::vector<float>> out;
  for (int i = 0; i < n; ++i) {
    const float* row = logits.data_as<float>() + static_cast<size_t>(i) * logits.size(1);
    out.emplace_back(row, row + logits.size(1));
  }
  return out;
}

}  // namespace specula::testing
