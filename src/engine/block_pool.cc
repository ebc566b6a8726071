#include "engine/block_pool.h"

#include <algorithm>

#include "core/error.h"

namespace specula {

BlockPool::BlockPool(int num_blocks, int block_size, bool enable_caching)
    : block_size_(block_size), enable_caching_(enable_caching), blocks_(static_cast<size_t>(num_blocks)) {
  SPECULA_CHECK(num_blocks > 0, "the KV cache needs at least one block, got {}", num_blocks);
  SPECULA_CHECK(block_size > 0, "block_size must be positive, got {}", block_size);
  for (int32_t b = 0; b < num_blocks; ++b) queue_push_back(b);
}

double BlockPool::usage() const {
  return 1.0 - static_cast<double>(num_free_) / static_cast<double>(blocks_.size());
}

void BlockPool::queue_push_back(int32_t b) {
  Block& blk = blocks_[b];
  SPECULA_ASSERT(!blk.in_free_queue);
  blk.prev = tail_;
  blk.next = -1;
  if (tail_ >= 0) blocks_[tail_].next = b; else head_ = b;
  tail_ = b;
  blk.in_free_queue = true;
  ++num_free_;
}

void BlockPool::queue_remove(int32_t b) {
  Block& blk = blocks_[b];
  SPECULA_ASSERT(blk.in_free_queue);
  if (blk.prev >= 0) blocks_[blk.prev].next = blk.next; else head_ = blk.next;
  if (blk.next >= 0) blocks_[blk.next].prev = blk.prev; else tail_ = blk.prev;
  blk.prev = blk.next = -1;
  blk.in_free_queue = false;
  --num_free_;
}

int32_t BlockPool::queue_pop_front() {
  SPECULA_ASSERT(head_ >= 0);
  int32_t b = head_;
  queue_remove(b);
  return b;
}

std::vector<int32_t> BlockPool::allocate(int n) {
  SPECULA_CHECK(n <= num_free_, "internal error: asked for {} KV blocks with {} free", n, num_free_);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    int32_t b = queue_pop_front();
    Block& blk = blocks_[b];
    SPECULA_ASSERT(blk.ref_cnt == 0);
    if (blk.hash) uncache(b);  // evict: the least recently used cached block goes first
    blk.ref_cnt = 1;
    out.push_back(b);
  }
  return out;
}

std::optional<int32_t> BlockPool::lookup(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const {
  if (!enable_caching_) return std::nullopt;
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  const Block& blk = blocks_[it->second];
  if (blk.parent != parent || !std::equal(tokens.begin(), tokens.end(), blk.tokens.begin(), blk.tokens.end()))
    return std::nullopt;  // a 64-bit collision: never serve another prefix's KV
  return it->second;
}

void BlockPool::touch(int32_t block) {
  Block& blk = blocks_.at(block);
  if (blk.ref_cnt == 0) queue_remove(block);
  ++blk.ref_cnt;
}

void BlockPool::cache_block(int32_t block, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) {
  if (!enable_caching_) return;
  Block& blk = blocks_.at(block);
  SPECULA_ASSERT(blk.ref_cnt > 0 && static_cast<int>(tokens.size()) == block_size_);
  if (blk.hash) return;  // already cached (a prefix hit)
  if (!cached_.emplace(hash, block).second) return;
  blk.hash = hash;
  blk.parent = parent;
  blk.tokens.assign(tokens.begin(), tokens.end());
}

void BlockPool::release(int32_t block) {
  Block& blk = blocks_.at(block);
  SPECULA_CHECK(blk.ref_cnt > 0, "internal error: KV block {} released more often than it was taken", block);
  if (--blk.ref_cnt == 0) queue_push_back(block);
}

void BlockPool::uncache(int32_t block) {
  Block& blk = blocks_.at(block);
  if (!blk.hash) return;
  auto it = cached_.find(*blk.hash);
  if (it != cached_.end() && it->second == block) cached_.erase(it);
  blk.hash.reset();
  blk.tokens.clear();
  blk.tokens.shrink_to_fit();
}

bool BlockPool::reset_prefix_cache() {
  if (num_free_ != num_blocks()) return false;
  for (int32_t b = 0; b < num_blocks(); ++b) uncache(b);
  return true;
}

void BlockPool::check_invariants() const {
  int in_queue = 0;
  int32_t prev = -1;
  for (int32_t b = head_; b >= 0; b = blocks_[b].next) {
    SPECULA_CHECK(blocks_[b].in_free_queue, "block pool: block {} linked in the free queue but not marked", b);
    SPECULA_CHECK(blocks_[b].prev == prev, "block pool: free queue back-link of block {} is broken", b);
    SPECULA_CHECK(++in_queue <= num_blocks(), "block pool: the free queue has a cycle");
    prev = b;
  }
  SPECULA_CHECK(prev == tail_, "block pool: free queue tail is {} but the last linked block is {}", tail_, prev);
  SPECULA_CHECK(in_queue == num_free_, "block pool: {} blocks in the free queue, counter says {}", in_queue, num_free_);
  int held = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const Block& blk = blocks_[b];
    SPECULA_CHECK(blk.ref_cnt >= 0, "block pool: block {} has ref count {}", b, blk.ref_cnt);
    SPECULA_CHECK((blk.ref_cnt == 0) == blk.in_free_queue,
                  "block pool: block {} has ref count {} but in_free_queue={}", b, blk.ref_cnt, blk.in_free_queue);
    if (blk.ref_cnt > 0) ++held;
    if (blk.hash) {
      auto it = cached_.find(*blk.hash);
      SPECULA_CHECK(it != cached_.end() && it->second == b, "block pool: block {} has a hash the cache does not map to it",
                    b);
    }
  }
  SPECULA_CHECK(held + num_free_ == num_blocks(), "block pool: {} held + {} free != {} blocks", held, num_free_,
                num_blocks());
  for (const auto& [hash, b] : cached_)
    SPECULA_CHECK(blocks_[b].hash == hash, "block pool: cache maps a hash to block {} which holds another", b);
}

}  // namespace specula
