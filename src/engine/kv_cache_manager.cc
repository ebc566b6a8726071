#include "engine/kv_cache_manager.h"

#include <algorithm>
#include <span>

#include "core/error.h"
#include "engine/block_hash.h"

namespace specula {

namespace {
int ceil_div(int a, int b) { return (a + b - 1) / b; }
}  // namespace

KVCacheManager::KVCacheManager(int num_blocks, int block_size, int max_model_len, bool enable_prefix_caching)
    : pool_(num_blocks, block_size, enable_prefix_caching), max_model_len_(max_model_len) {}

ComputedBlocks KVCacheManager::get_computed_blocks(Request& request) {
  ComputedBlocks out;
  if (!pool_.caching_enabled() || request.wants_prompt_logprobs()) return out;
  const int bs = pool_.block_size();
  update_block_hashes(request, bs);
  // The last token is always recomputed: the sampler needs its logits.
  const int max_blocks = (request.num_tokens() - 1) / bs;
  for (int i = 0; i < max_blocks; ++i) {
    BlockHash parent = i == 0 ? kRootBlockHash : request.block_hashes[i - 1];
    std::span<const int32_t> tokens(request.all_token_ids.data() + static_cast<size_t>(i) * bs, static_cast<size_t>(bs));
    std::optional<int32_t> hit = pool_.lookup(request.block_hashes[i], parent, tokens);
    if (!hit) break;
    out.blocks.push_back(*hit);
  }
  out.num_tokens = static_cast<int>(out.blocks.size()) * bs;
  return out;
}

void KVCacheManager::record_prefix_cache_query(const Request& request, int hit_tokens) {
  if (!pool_.caching_enabled() || request.wants_prompt_logprobs()) return;
  stats_.requests += 1;
  stats_.queries += request.num_tokens();
  stats_.hits += hit_tokens;
}

std::optional<std::vector<int32_t>> KVCacheManager::allocate_slots(Request& request, int num_new_tokens,
                                                                   const ComputedBlocks& computed,
                                                                   int num_lookahead_tokens) {
  SPECULA_ASSERT(num_new_tokens >= 0 && num_lookahead_tokens >= 0);
  const int bs = pool_.block_size();
  Table* existing = nullptr;
  if (auto it = tables_.find(request.request_id); it != tables_.end()) existing = &it->second;
  const int held = existing ? static_cast<int>(existing->blocks.size()) : 0;
  SPECULA_ASSERT(computed.blocks.empty() || held == 0);

  const int num_computed = request.num_computed_tokens + computed.num_tokens;
  const int tokens_needing_slots = std::min(num_computed + num_new_tokens + num_lookahead_tokens, max_model_len_);
  const int blocks_needed = ceil_div(tokens_needing_slots, bs);
  const int to_allocate = std::max(0, blocks_needed - held - static_cast<int>(computed.blocks.size()));
  // Hit blocks nobody holds sit in the free queue: taking them uses up free blocks too.
  int evictable_hits = 0;
  for (int32_t b : computed.blocks) evictable_hits += pool_.ref_count(b) == 0 ? 1 : 0;
  if (to_allocate + evictable_hits > pool_.num_free_blocks()) return std::nullopt;

  Table& table = existing ? *existing : tables_[request.request_id];
  std::vector<int32_t> appended;
  appended.reserve(computed.blocks.size() + static_cast<size_t>(to_allocate));
  for (int32_t b : computed.blocks) {
    pool_.touch(b);
    table.blocks.push_back(b);
    appended.push_back(b);
  }
  table.num_cached_blocks = std::max(table.num_cached_blocks, static_cast<int>(computed.blocks.size()));
  for (int32_t b : pool_.allocate(to_allocate)) {
    table.blocks.push_back(b);
    appended.push_back(b);
  }

  // Register the blocks this step fills with known tokens (never draft tokens). They are cached
  // before the step computes them: a request that hits them in the same step reads them after
  // they are written, because every layer writes the whole batch's K/V before attending.
  if (pool_.caching_enabled()) {
    const int known = std::min(num_computed + num_new_tokens, request.num_tokens());
    const int full_blocks = known / bs;
    if (full_blocks > table.num_cached_blocks) {
      update_block_hashes(request, bs);
      for (int i = table.num_cached_blocks; i < full_blocks; ++i) {
        BlockHash parent = i == 0 ? kRootBlockHash : request.block_hashes[i - 1];
        std::span<const int32_t> tokens(request.all_token_ids.data() + static_cast<size_t>(i) * bs,
                                        static_cast<size_t>(bs));
        pool_.cache_block(table.blocks[i], request.block_hashes[i], parent, tokens);
      }
      table.num_cached_blocks = full_blocks;
    }
  }
  return appended;
}

void KVCacheManager::free(const Request& request, bool contents_valid) {
  auto it = tables_.find(request.request_id);
  if (it == tables_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    pool_.release(*b);
    if (!contents_valid && pool_.ref_count(*b) == 0) pool_.uncache(*b);
  }
  tables_.erase(it);
}

const std::vector<int32_t>& KVCacheManager::block_ids(const std::string& request_id) const {
  auto it = tables_.find(request_id);
  SPECULA_CHECK(it != tables_.end(), "internal error: request {} holds no KV blocks", request_id);
  return it->second.blocks;
}

void KVCacheManager::check_invariants() const {
  pool_.check_invariants();
  std::vector<int32_t> holders(static_cast<size_t>(pool_.num_blocks()), 0);
  for (const auto& [id, table] : tables_) {
    for (int32_t b : table.blocks) {
      SPECULA_CHECK(b >= 0 && b < pool_.num_blocks(), "kv cache: request {} holds block {} out of range", id, b);
      holders[b] += 1;
    }
  }
  for (int32_t b = 0; b < pool_.num_blocks(); ++b)
    SPECULA_CHECK(holders[b] == pool_.ref_count(b), "kv cache: block {} is in {} block tables but has ref count {}",
                  b, holders[b], pool_.ref_count(b));
}

}  // namespace specula
