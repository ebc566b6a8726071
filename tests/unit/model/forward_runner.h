// A minimal stand-in for the engine's model runner, for forward tests: it keeps a paged KV cache,
// hands out blocks in a shuffled (non-contiguous) order, and turns "run these new tokens of these
// sequences" into one flattened varlen ForwardInput exactly as attention_metadata.h describes.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "model/model.h"

namespace specula::testing {

class PagedRunner {
 public:
  // cache_dtype: the cache's type (unset: the compute type; F8_E4M3 with scale 1).
  PagedRunner(Model& model, Backend& backend, int64_t num_blocks, int block_size = 16, unsigned seed = 1,
              std::optional<DType> cache_dtype = std::nullopt)
      : model_(model), backend_(backend), block_size_(block_size) {
    KVCacheSpec spec = model.kv_cache_spec();
    const DType dt = cache_dtype.value_or(backend.compute_dtype());
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      KVCacheLayer layer{backend.empty({num_blocks, block_size, spec.num_kv_heads, spec.head_dim}, dt),
                         backend.empty({num_blocks, block_size, spec.num_kv_heads, spec.v_head_dim}, dt)};
      backend.zero(layer.k);
      backend.zero(layer.v);
      kv_.push_back(layer);
    }
    for (int64_t b = 0; b < num_blocks; ++b) free_blocks_.push_back(static_cast<int32_t>(b));
    std::mt19937 rng(seed);
    std::shuffle(free_blocks_.begin(), free_blocks_.end(), rng);
  }

  // Tokens of sequence `seq` are appended with feed(); step() computes the given number of the
  // not-yet-computed ones for each listed sequence.
  void feed(int seq, const std::vector<int32_t>& tokens) {
    auto& s = seqs_[seq];
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  }
  int64_t computed(int seq) { return seqs_[seq].computed; }
  // Sequence `seq`'s blocks, grown to hold `len` tokens (for tests that write the cache themselves).
  const std::vector<int32_t>& blocks_for(int seq, int64_t len) {
    Seq& s = seqs_[seq];
    while (static_cast<int64_t>(s.blocks.size()) * block_size_ < len) {
      if (free_blocks_.empty()) throw Error("PagedRunner: out of KV blocks");
      s.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
    return s.blocks;
  }
  std::vector<KVCacheLayer>& kv() { return kv_; }
  int64_t pending(int seq) {
    auto& s = seqs_[seq];
    return static_cast<int64_t>(s.tokens.size()) - s.computed;
  }

  struct Work {
    int seq;
    int64_t num_tokens;
    bool all_logits = false;  // logits for every new row, else only for the last one
  };

  // Runs one forward over the listed work (plus `padding` rows that belong to no sequence);
  // returns, per work item, its rows' logits (F32, [rows, V] flattened).
  std::vector<std::vector<float>> step(const std::vector<Work>& work, int padding = 0) {
    std::vector<int32_t> ids, positions, qsl = {0}, lens, logits_rows;
    std::vector<int64_t> slots;
    std::vector<std::vector<int32_t>> tables;
    size_t max_blocks = 1;
    int32_t max_q = 0, max_len = 0;
    for (const Work& w : work) {
      Seq& s = seqs_[w.seq];
      const int64_t new_len = s.computed + w.num_tokens;
      while (static_cast<int64_t>(s.blocks.size()) * block_size_ < new_len) {
        if (free_blocks_.empty()) throw Error("PagedRunner: out of KV blocks");
        s.blocks.push_back(free_blocks_.back());
        free_blocks_.pop_back();
      }
      for (int64_t j = s.computed; j < new_len; ++j) {
        ids.push_back(s.tokens.at(j));
        positions.push_back(static_cast<int32_t>(j));
        slots.push_back(int64_t{s.blocks[j / block_size_]} * block_size_ + j % block_size_);
        if (w.all_logits || j == new_len - 1) logits_rows.push_back(static_cast<int32_t>(ids.size() - 1));
      }
      qsl.push_back(static_cast<int32_t>(ids.size()));
      lens.push_back(static_cast<int32_t>(new_len));
      tables.push_back(s.blocks);
      max_blocks = std::max(max_blocks, s.blocks.size());
      max_q = std::max<int32_t>(max_q, static_cast<int32_t>(w.num_tokens));
      max_len = std::max<int32_t>(max_len, static_cast<int32_t>(new_len));
      s.computed = new_len;
    }
    for (int i = 0; i < padding; ++i) {
      ids.push_back(0);
      positions.push_back(0);
      slots.push_back(-1);
    }
    std::vector<int32_t> flat_tables(work.size() * max_blocks, -1);
    for (size_t s = 0; s < tables.size(); ++s) std::copy(tables[s].begin(), tables[s].end(), &flat_tables[s * max_blocks]);

    ForwardInput in;
    in.token_ids = upload(Tensor::from_i32(ids));
    in.positions = upload(Tensor::from_i32(positions));
    in.logits_indices = upload(Tensor::from_i32(logits_rows));
    in.attn.num_seqs = static_cast<int32_t>(work.size());
    in.attn.num_tokens = static_cast<int32_t>(ids.size());
    in.attn.max_query_len = max_q;
    in.attn.max_seq_len = max_len;
    in.attn.block_size = block_size_;
    in.attn.query_start_loc = upload(Tensor::from_i32(qsl));
    in.attn.seq_lens = upload(Tensor::from_i32(lens));
    in.attn.block_tables =
        upload(Tensor::from_i32(flat_tables, {static_cast<int64_t>(work.size()), static_cast<int64_t>(max_blocks)}));
    in.attn.slot_mapping = upload(Tensor::from_i64(slots));
    in.attn.query_start_loc_host = qsl;
    in.attn.seq_lens_host = lens;

    ForwardOutput out = model_.forward(in, kv_);
    Tensor host = Tensor::empty(out.logits.shape(), DType::kF32);
    backend_.copy(out.logits, host);
    std::vector<float> all = host.to_f32_vector();
    const int64_t v = out.logits.size(1);
    std::vector<std::vector<float>> result;
    size_t row = 0;
    for (const Work& w : work) {
      const size_t n = w.all_logits ? static_cast<size_t>(w.num_tokens) : 1;
      result.emplace_back(all.begin() + row * v, all.begin() + (row + n) * v);
      row += n;
    }
    return result;
  }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int64_t computed = 0;
    std::vector<int32_t> blocks;
  };

  Tensor upload(const Tensor& host) {
    Tensor t = backend_.empty(host.shape(), host.dtype());
    backend_.copy(host, t);
    return t;
  }

  Model& model_;
  Backend& backend_;
  int block_size_;
  std::vector<KVCacheLayer> kv_;
  std::vector<int32_t> free_blocks_;
  std::map<int, Seq> seqs_;
};

inline int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

}  // namespace specula::testing
