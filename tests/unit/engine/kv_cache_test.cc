#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/block_hash.h"
#include "engine/block_pool.h"
#include "engine/kv_cache_manager.h"
#include "request_helpers.h"

namespace specula {
namespace {

using testing::iota_tokens;
using testing::make_request;

TEST(BlockHash, ChainsParentAndTokens) {
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_EQ(hash_block(kRootBlockHash, a), hash_block(kRootBlockHash, a));
  EXPECT_NE(hash_block(kRootBlockHash, a), hash_block(kRootBlockHash, b));
  // The same tokens after a different prefix are a different block.
  EXPECT_NE(hash_block(hash_block(kRootBlockHash, a), a), hash_block(hash_block(kRootBlockHash, b), a));
}

TEST(BlockHash, CoversOnlyFullBlocksOfKnownTokens) {
  auto r = make_request("r", iota_tokens(37));
  update_block_hashes(*r, 16);
  ASSERT_EQ(r->block_hashes.size(), 2u);
  EXPECT_EQ(r->block_hashes[0], hash_block(kRootBlockHash, std::span<const int32_t>(r->all_token_ids.data(), 16)));
  EXPECT_EQ(r->block_hashes[1], hash_block(r->block_hashes[0], std::span<const int32_t>(r->all_token_ids.data() + 16, 16)));
  r->spec_token_ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // drafts never count
  update_block_hashes(*r, 16);
  EXPECT_EQ(r->block_hashes.size(), 2u);
  for (int i = 0; i < 11; ++i) r->append_output_token(7);
  update_block_hashes(*r, 16);
  EXPECT_EQ(r->block_hashes.size(), 3u);
}

TEST(BlockPool, AllocatesFromTheLruEndAndCountsRefs) {
  BlockPool pool(4, 2, true);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  std::vector<int32_t> got = pool.allocate(3);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.75);
  pool.touch(1);
  EXPECT_EQ(pool.ref_count(1), 2);
  pool.release(1);
  EXPECT_EQ(pool.ref_count(1), 1);
  pool.release(2);
  pool.release(0);
  // Free queue now: 3 (never used), 2, 0 -> handed out in that order.
  EXPECT_EQ(pool.allocate(3), (std::vector<int32_t>{3, 2, 0}));
  EXPECT_THROW(pool.allocate(1), Error);
  pool.check_invariants();
  pool.release(3);
  EXPECT_THROW(pool.release(3), Error);  // it had one holder: a second release is a bug
}

TEST(BlockPool, CachedBlocksAreEvictedLruAndHitsLeaveTheFreeQueue) {
  BlockPool pool(3, 2, true);
  std::vector<int32_t> t0 = {1, 2}, t1 = {3, 4}, t2 = {5, 6};
  auto b = pool.allocate(3);
  pool.cache_block(b[0], 100, kRootBlockHash, t0);
  pool.cache_block(b[1], 101, kRootBlockHash, t1);
  pool.cache_block(b[2], 102, kRootBlockHash, t2);
  // Freed in the order 1, 0, 2: the LRU order of eviction.
  pool.release(b[1]);
  pool.release(b[0]);
  pool.release(b[2]);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_EQ(pool.num_cached_blocks(), 3u);
  // A hit on block 0 takes it back out of the free queue.
  ASSERT_EQ(pool.lookup(100, kRootBlockHash, t0), std::optional<int32_t>(b[0]));
  pool.touch(b[0]);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  pool.check_invariants();
  // The next allocation evicts block 1 (least recently freed), then block 2.
  EXPECT_EQ(pool.allocate(1), std::vector<int32_t>{b[1]});
  EXPECT_FALSE(pool.lookup(101, kRootBlockHash, t1).has_value());
  EXPECT_TRUE(pool.lookup(102, kRootBlockHash, t2).has_value());
  EXPECT_EQ(pool.allocate(1), std::vector<int32_t>{b[2]});
  EXPECT_FALSE(pool.lookup(102, kRootBlockHash, t2).has_value());
  EXPECT_TRUE(pool.lookup(100, kRootBlockHash, t0).has_value());  // held: never evicted
  pool.check_invariants();
}

TEST(BlockPool, LookupRejectsHashCollisions) {
  BlockPool pool(2, 2, true);
  std::vector<int32_t> t = {1, 2}, other = {9, 9};
  auto b = pool.allocate(1);
  pool.cache_block(b[0], 555, kRootBlockHash, t);
  EXPECT_TRUE(pool.lookup(555, kRootBlockHash, t).has_value());
  EXPECT_FALSE(pool.lookup(555, kRootBlockHash, other).has_value());  // same hash, other tokens
  EXPECT_FALSE(pool.lookup(555, 42, t).has_value());                  // same hash, other prefix
}

TEST(BlockPool, CachingOffNeverHits) {
  BlockPool pool(2, 2, false);
  std::vector<int32_t> t = {1, 2};
  auto b = pool.allocate(1);
  pool.cache_block(b[0], 1, kRootBlockHash, t);
  EXPECT_FALSE(pool.lookup(1, kRootBlockHash, t).has_value());
  EXPECT_EQ(pool.num_cached_blocks(), 0u);
}

TEST(KVCacheManager, AllocatesBlocksForNewTokensAndLookahead) {
  KVCacheManager kv(10, 4, 100, true);
  auto r = make_request("r", iota_tokens(9));
  auto got = kv.allocate_slots(*r, 9);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->size(), 3u);  // 9 tokens in blocks of 4
  r->num_computed_tokens = 9;
  r->append_output_token(50);
  got = kv.allocate_slots(*r, 1);  // token 10 fits in block 3
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->empty());
  got = kv.allocate_slots(*r, 1, {}, 4);  // room for 4 draft tokens too: 10 + 1 + 4 = 15 -> 4 blocks
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->size(), 1u);
  EXPECT_EQ(kv.block_ids("r").size(), 4u);
  EXPECT_EQ(kv.num_free_blocks(), 6);
  kv.free(*r);
  EXPECT_EQ(kv.num_free_blocks(), 10);
  EXPECT_FALSE(kv.has_blocks("r"));
  kv.check_invariants();
}

TEST(KVCacheManager, ReturnsNulloptAndChangesNothingWhenBlocksRunOut) {
  KVCacheManager kv(3, 4, 100, true);
  auto a = make_request("a", iota_tokens(8));
  ASSERT_TRUE(kv.allocate_slots(*a, 8));
  auto b = make_request("b", iota_tokens(8, 100));
  EXPECT_FALSE(kv.allocate_slots(*b, 8).has_value());
  EXPECT_FALSE(kv.has_blocks("b"));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  kv.check_invariants();
}

TEST(KVCacheManager, PrefixHitsWholeBlocksButNeverTheLastPromptToken) {
  KVCacheManager kv(20, 4, 100, true);
  auto a = make_request("a", iota_tokens(12));
  ASSERT_TRUE(kv.allocate_slots(*a, 12));
  // Same 12-token prompt: 3 full blocks cached, but the last token must be computed, so only 2
  // blocks (8 tokens) are served.
  auto b = make_request("b", iota_tokens(12));
  ComputedBlocks hit = kv.get_computed_blocks(*b);
  EXPECT_EQ(hit.num_tokens, 8);
  ASSERT_EQ(hit.blocks.size(), 2u);
  EXPECT_EQ(hit.blocks[0], kv.block_ids("a")[0]);
  EXPECT_EQ(hit.blocks[1], kv.block_ids("a")[1]);
  // A longer prompt sharing 12 tokens gets all 3 blocks.
  auto prompt = iota_tokens(12);
  prompt.push_back(77);
  auto c = make_request("c", prompt);
  EXPECT_EQ(kv.get_computed_blocks(*c).num_tokens, 12);
  // A prompt differing in the first block hits nothing (chained hashes).
  auto d_prompt = iota_tokens(12);
  d_prompt[0] = 999;
  auto d = make_request("d", d_prompt);
  EXPECT_EQ(kv.get_computed_blocks(*d).num_tokens, 0);

  ASSERT_TRUE(kv.allocate_slots(*b, 12 - hit.num_tokens, hit));
  EXPECT_EQ(kv.pool().ref_count(kv.block_ids("a")[0]), 2);
  EXPECT_EQ(kv.block_ids("b")[0], kv.block_ids("a")[0]);
  EXPECT_NE(kv.block_ids("b")[2], kv.block_ids("a")[2]);  // recomputed into its own block
  kv.record_prefix_cache_query(*b, hit.num_tokens);
  EXPECT_EQ(kv.prefix_cache_stats().queries, 12);
  EXPECT_EQ(kv.prefix_cache_stats().hits, 8);
  EXPECT_EQ(kv.prefix_cache_stats().requests, 1);
  kv.check_invariants();
}

TEST(KVCacheManager, FreedPrefixStaysCachedUntilEvicted) {
  KVCacheManager kv(4, 4, 100, true);
  auto a = make_request("a", iota_tokens(9));
  ASSERT_TRUE(kv.allocate_slots(*a, 9));
  kv.free(*a);
  EXPECT_EQ(kv.num_free_blocks(), 4);
  auto b = make_request("b", iota_tokens(9));
  ComputedBlocks hit = kv.get_computed_blocks(*b);
  EXPECT_EQ(hit.num_tokens, 8);
  // The hit blocks are free (nobody holds them) so they count against the free blocks: 2 hits +
  // 1 new block.
  ASSERT_TRUE(kv.allocate_slots(*b, 1, hit));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  kv.check_invariants();
  kv.free(*b);
  // Filling the cache with other prompts evicts the cached prefix.
  auto c = make_request("c", iota_tokens(16, 500));
  ASSERT_TRUE(kv.allocate_slots(*c, 16));
  auto again = make_request("again", iota_tokens(9));
  EXPECT_EQ(kv.get_computed_blocks(*again).num_tokens, 0);
  kv.check_invariants();
}

TEST(KVCacheManager, OutputTokensAreCachedOnceTheirBlockIsComputed) {
  KVCacheManager kv(10, 4, 100, true);
  auto a = make_request("a", iota_tokens(6));
  ASSERT_TRUE(kv.allocate_slots(*a, 6));
  a->num_computed_tokens = 6;
  a->append_output_token(40);
  a->append_output_token(41);  // tokens: 6 prompt + 2 outputs = 8 = 2 full blocks
  // Computing token 6 (the first output) fills block 1 only up to position 6: not full yet.
  ASSERT_TRUE(kv.allocate_slots(*a, 1));
  a->num_computed_tokens = 7;
  auto probe = make_request("p", {1, 2, 3, 4, 5, 6, 40, 41, 9});
  EXPECT_EQ(kv.get_computed_blocks(*probe).num_tokens, 4);
  ASSERT_TRUE(kv.allocate_slots(*a, 1));  // position 7 completes block 1
  EXPECT_EQ(kv.get_computed_blocks(*probe).num_tokens, 8);
}

TEST(KVCacheManager, PromptLogprobRequestsNeverHit) {
  KVCacheManager kv(10, 4, 100, true);
  auto a = make_request("a", iota_tokens(9));
  ASSERT_TRUE(kv.allocate_slots(*a, 9));
  SamplingParams p;
  p.prompt_logprobs = 1;
  auto b = make_request("b", iota_tokens(9), 4, p);
  EXPECT_EQ(kv.get_computed_blocks(*b).num_tokens, 0);
}

TEST(KVCacheManager, FailedStepContentsLeaveTheCache) {
  KVCacheManager kv(10, 4, 100, true);
  auto a = make_request("a", iota_tokens(9));
  ASSERT_TRUE(kv.allocate_slots(*a, 9));
  kv.free(*a, /*contents_valid=*/false);
  auto b = make_request("b", iota_tokens(9));
  EXPECT_EQ(kv.get_computed_blocks(*b).num_tokens, 0);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 0u);
}

}  // namespace
}  // namespace specula
