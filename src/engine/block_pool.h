// The pool of KV cache blocks: reference counts, the free-block queue (LRU eviction order) and
// the prefix cache (hash -> block). A block nobody holds stays in the prefix cache, at the MRU end
// of the free queue, until it is handed out again (evicted from the cache) or hit again (taken
// back out of the free queue).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/request.h"

namespace specula {

class BlockPool {
 public:
  BlockPool(int num_blocks, int block_size, bool enable_caching);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  bool caching_enabled() const { return enable_caching_; }
  // Blocks nobody holds, including cached ones that can be evicted.
  int num_free_blocks() const { return num_free_; }
  // Fraction of blocks held by some request (vllm:kv_cache_usage_perc).
  double usage() const;
  int ref_count(int32_t block) const { return blocks_.at(block).ref_cnt; }
  std::optional<BlockHash> hash_of(int32_t block) const { return blocks_.at(block).hash; }
  size_t num_cached_blocks() const { return cached_.size(); }

  // Takes n blocks from the LRU end of the free queue (evicting whatever they cached); each comes
  // back with one holder. The caller checks num_free_blocks() first.
  std::vector<int32_t> allocate(int n);
  // A cached block holding exactly `tokens` after the prefix `parent`, if any.
  std::optional<int32_t> lookup(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const;
  // One more holder of a (cached) block; a block nobody held leaves the free queue.
  void touch(int32_t block);
  // Registers a held full block in the prefix cache. A hash some other block already caches is left
  // alone (the duplicate block simply stays uncached).
  void cache_block(int32_t block, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens);
  // One holder fewer; a block reaching zero goes to the MRU end of the free queue.
  void release(int32_t block);
  // Drops a block from the prefix cache (its contents cannot be trusted: the step writing it failed).
  void uncache(int32_t block);
  // Empties the prefix cache. Only possible while no block is held; returns false otherwise.
  bool reset_prefix_cache();

  // Throws specula::Error on any inconsistency between ref counts, the free queue and the cache.
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref_cnt = 0;
    bool in_free_queue = false;
    int32_t prev = -1, next = -1;        // free-queue links (-1: the sentinel)
    std::optional<BlockHash> hash;       // set while the block is in the prefix cache
    BlockHash parent = 0;                // what the hash covers, to rule out collisions
    std::vector<int32_t> tokens;
  };
  void queue_push_back(int32_t b);
  void queue_remove(int32_t b);
  int32_t queue_pop_front();

  int block_size_;
  bool enable_caching_;
  std::vector<Block> blocks_;
  int32_t head_ = -1, tail_ = -1;        // LRU end, MRU end
  int num_free_ = 0;
  std::unordered_map<BlockHash, int32_t> cached_;
};

}  // namespace specula
