// A from-scratch reference for the MTP layers: every call runs the target and the MTP layer over
// one whole sequence with fresh caches, exactly as models/README.md describes the computation,
// so that tests can hold the proposer's incremental caches (catch-up, rollback, prefix hits) to it.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "model/deepseek_mtp.h"
#include "model/model.h"

namespace specula::testing {

class MtpReference {
 public:
  MtpReference(Model& target, DeepseekMtp& mtp, Backend& backend) : target_(target), mtp_(mtp), backend_(backend) {}

  // Target hidden states (after model.norm) of tokens[0, n), one prefill: a persistent [n, H].
  Tensor target_hidden(const std::vector<int32_t>& tokens, int n) {
    std::vector<KVCacheLayer> kv = fresh_cache(target_.kv_cache_spec(), n);
    ForwardInput in = input(std::vector<int32_t>(tokens.begin(), tokens.begin() + n), 0, {n - 1});
    ForwardOutput out = target_.forward(in, kv);
    Tensor h = backend_.empty({n, target_.config().hidden_size}, backend_.compute_dtype());
    backend_.copy(out.hidden_states.slice(0, n), h);
    return h;
  }

  // MTP layer 0 over positions [0, n) of `tokens` (row i reads h_i and tokens[i + 1], so n <
  // tokens.size()); returns the logits (host F32 rows) at `wanted` positions and keeps y.
  std::vector<std::vector<float>> mtp_logits(const std::vector<int32_t>& tokens, int n, const std::vector<int>& wanted) {
    return mtp_logits_of(target_hidden(tokens, n), std::vector<int32_t>(tokens.begin() + 1, tokens.begin() + n + 1),
                         wanted);
  }
  // The same over given hidden states h (rows 0 .. next.size() - 1), row i reading next[i].
  std::vector<std::vector<float>> mtp_logits_of(const Tensor& h, const std::vector<int32_t>& next,
                                                const std::vector<int>& wanted) {
    return run_mtp(0, next, 0, h, wanted, static_cast<int>(next.size()));
  }

  // The logits the proposer should draft from: draft 1 from the MTP layer at the last known
  // position L - 2 (h_{L-2}, token L - 1), draft j > 1 from layer min(j - 1, layers - 1) at
  // position L - 3 + j fed with the previous y and draft j - 1. Returns one row per draft for
  // drafts.size() + 1 drafts (the drafts given are the ones taken so far).
  std::vector<std::vector<float>> draft_logits(const std::vector<int32_t>& tokens, const std::vector<int32_t>& drafts) {
    const int len = static_cast<int>(tokens.size());
    kv_ = fresh_cache(mtp_.kv_cache_spec(), len + static_cast<int>(drafts.size()) + 1);
    Tensor h = target_hidden(tokens, len - 1);
    std::vector<std::vector<float>> rows;
    rows.push_back(run_mtp_keep(0, std::vector<int32_t>(tokens.begin() + 1, tokens.end()), 0, h, len - 1));
    for (size_t j = 0; j < drafts.size(); ++j) {
      const int layer = std::min(static_cast<int>(j) + 1, mtp_.num_layers() - 1);
      Tensor prev = backend_.empty({1, mtp_.config().hidden_size}, backend_.compute_dtype());
      backend_.copy(last_y_, prev);
      rows.push_back(run_mtp_keep(layer, {drafts[j]}, len - 1 + static_cast<int>(j), prev, 1));
    }
    return rows;
  }

 private:
  std::vector<KVCacheLayer> fresh_cache(const KVCacheSpec& spec, int tokens) {
    const int blocks = (tokens + kBlock - 1) / kBlock + 1;
    std::vector<KVCacheLayer> kv(static_cast<size_t>(spec.num_layers));
    for (KVCacheLayer& l : kv) {
      l.k = backend_.empty({blocks, kBlock, spec.num_kv_heads, spec.head_dim}, backend_.compute_dtype());
      l.v = backend_.empty({blocks, kBlock, spec.num_kv_heads, spec.v_head_dim}, backend_.compute_dtype());
      backend_.zero(l.k);
    }
    return kv;
  }

  Tensor up(const Tensor& host) {
    Tensor t = backend_.empty(host.shape(), host.dtype());
    backend_.copy(host, t);
    return t;
  }

  // Rows for positions [first, first + ids.size()) of one sequence whose blocks are 0, 1, 2, ...
  ForwardInput input(const std::vector<int32_t>& ids, int first, const std::vector<int>& logits_positions) {
    const int n = static_cast<int>(ids.size()), len = first + n, width = (len + kBlock - 1) / kBlock;
    std::vector<int32_t> positions, table, rows;
    std::vector<int64_t> slots;
    for (int i = 0; i < n; ++i) {
      positions.push_back(first + i);
      slots.push_back(first + i);  // block b holds positions [b kBlock, (b + 1) kBlock)
    }
    for (int b = 0; b < width; ++b) table.push_back(b);
    for (int p : logits_positions) rows.push_back(p - first);
    ForwardInput in;
    in.token_ids = up(Tensor::from_i32(ids));
    in.positions = up(Tensor::from_i32(positions));
    in.logits_indices = up(Tensor::from_i32(rows, {static_cast<int64_t>(rows.size())}));
    in.attn.num_seqs = 1;
    in.attn.num_tokens = n;
    in.attn.max_query_len = n;
    in.attn.max_seq_len = len;
    in.attn.block_size = kBlock;
    in.attn.query_start_loc = up(Tensor::from_i32({0, n}));
    in.attn.seq_lens = up(Tensor::from_i32({len}));
    in.attn.slot_mapping = up(Tensor::from_i64(slots));
    in.attn.block_tables = up(Tensor::from_i32(table, {1, width}));
    in.attn.query_start_loc_host = {0, n};
    in.attn.seq_lens_host = {len};
    return in;
  }

  std::vector<std::vector<float>> run_mtp(int layer, const std::vector<int32_t>& next, int first, const Tensor& h,
                                          const std::vector<int>& wanted, int len) {
    kv_ = fresh_cache(mtp_.kv_cache_spec(), len);
    MtpForwardInput in;
    in.rows = input(next, first, wanted);
    in.hidden = h;
    if (first == 0) in.zero_embedding_rows = {0};
    backend_.reset_scratch();
    MtpForwardOutput out = mtp_.forward(layer, in, kv_[static_cast<size_t>(layer)]);
    return host_rows(out.logits);
  }

  // One forward on the kept caches; returns the logits of its last row and keeps that row's y.
  std::vector<float> run_mtp_keep(int layer, const std::vector<int32_t>& next, int first, const Tensor& h, int n) {
    MtpForwardInput in;
    in.rows = input(next, first, {first + n - 1});
    in.hidden = h;
    if (first == 0) in.zero_embedding_rows = {0};
    backend_.reset_scratch();
    MtpForwardOutput out = mtp_.forward(layer, in, kv_[static_cast<size_t>(layer)]);
    last_y_ = backend_.empty({1, mtp_.config().hidden_size}, backend_.compute_dtype());
    backend_.copy(out.y.slice(n - 1, n), last_y_);
    return host_rows(out.logits)[0];
  }

  std::vector<std::vector<float>> host_rows(const Tensor& logits) {
    Tensor host = Tensor::empty(logits.shape(), DType::kF32, Device::kCPU);
    backend_.copy(logits, host);
    backend_.synchronize();
    const int64_t v = logits.size(1);
    std::vector<std::vector<float>> rows;
    for (int64_t r = 0; r < logits.size(0); ++r) rows.emplace_back(host.data_as<float>() + r * v, host.data_as<float>() + (r + 1) * v);
    return rows;
  }

  static constexpr int kBlock = 16;
  Model& target_;
  DeepseekMtp& mtp_;
  Backend& backend_;
  std::vector<KVCacheLayer> kv_;
  Tensor last_y_;
};

}  // namespace specula::testing
