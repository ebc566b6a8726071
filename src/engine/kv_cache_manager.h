// Per-request block tables over the BlockPool, prefix-cache lookups and slot allocation, as vLLM
// v1's KVCacheManager. Token t of a request lives in block_ids[t / block_size] at offset
// t % block_size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/block_pool.h"
#include "engine/request.h"

namespace specula {

// vLLM's prefix-cache counters, in tokens.
struct PrefixCacheStats {
  int64_t requests = 0;  // lookups (one per admission of a request, resumptions included)
  int64_t queries = 0;   // tokens looked up
  int64_t hits = 0;      // tokens served from the cache
};

// A prefix-cache hit: whole blocks, never covering a request's last token.
struct ComputedBlocks {
  std::vector<int32_t> blocks;
  int num_tokens = 0;
};

class KVCacheManager {
 public:
  KVCacheManager(int num_blocks, int block_size, int max_model_len, bool enable_prefix_caching);

  // The longest cached prefix of `request`'s tokens, in whole blocks, leaving at least its last
  // token to compute (its logits are needed). Requests that want prompt logprobs never hit (every
  // prompt position must be computed).
  ComputedBlocks get_computed_blocks(Request& request);
  // Counts one lookup for an admitted request (vLLM's queries/hits in tokens); lookups of a
  // request that had to stay in the queue are not counted twice.
  void record_prefix_cache_query(const Request& request, int hit_tokens);

  // Makes room for `num_new_tokens` beyond request.num_computed_tokens (after the prefix hit
  // `computed`, for a request being admitted) plus `num_lookahead_tokens` for draft tokens, and
  // registers its newly complete blocks of known tokens in the prefix cache. Returns the block ids
  // appended to the request's table, or nullopt when the free blocks do not suffice (nothing
  // changes then).
  std::optional<std::vector<int32_t>> allocate_slots(Request& request, int num_new_tokens,
                                                     const ComputedBlocks& computed = {},
                                                     int num_lookahead_tokens = 0);

  // Returns every block of the request (its last block first, so that a request's tail is evicted
  // before its shared prefix). contents_valid = false (the step writing them failed) also drops
  // the blocks nobody else holds from the prefix cache.
  void free(const Request& request, bool contents_valid = true);

  const std::vector<int32_t>& block_ids(const std::string& request_id) const;
  bool has_blocks(const std::string& request_id) const { return tables_.count(request_id) > 0; }
  size_t num_tables() const { return tables_.size(); }

  int block_size() const { return pool_.block_size(); }
  int num_blocks() const { return pool_.num_blocks(); }
  int num_free_blocks() const { return pool_.num_free_blocks(); }
  double usage() const { return pool_.usage(); }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }
  bool reset_prefix_cache() { return pool_.reset_prefix_cache(); }
  const BlockPool& pool() const { return pool_; }

  // Every block is free or held; each block's ref count equals the number of tables holding it.
  void check_invariants() const;

 private:
  struct Table {
    std::vector<int32_t> blocks;
    int num_cached_blocks = 0;  // leading blocks already registered in the prefix cache
  };

  BlockPool pool_;
  int max_model_len_;
  std::unordered_map<std::string, Table> tables_;
  PrefixCacheStats stats_;
};

}  // namespace specula
