#include "engine/block_hash.h"

#include <xxhash.h>

#include <cstring>
#include <vector>

namespace specula {

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens) {
  // One contiguous buffer (parent, then tokens) hashed in one call; reused per thread so that
  // hashing a long prompt allocates nothing.
  thread_local std::vector<unsigned char> buf;
  buf.resize(sizeof(parent) + tokens.size_bytes());
  std::memcpy(buf.data(), &parent, sizeof(parent));
  if (!tokens.empty()) std::memcpy(buf.data() + sizeof(parent), tokens.data(), tokens.size_bytes());
  return XXH64(buf.data(), buf.size(), 0);
}

void update_block_hashes(Request& request, int block_size) {
  const size_t full_blocks = request.all_token_ids.size() / static_cast<size_t>(block_size);
  while (request.block_hashes.size() < full_blocks) {
    size_t i = request.block_hashes.size();
    BlockHash parent = i == 0 ? kRootBlockHash : request.block_hashes[i - 1];
    std::span<const int32_t> tokens(request.all_token_ids.data() + i * block_size, static_cast<size_t>(block_size));
    request.block_hashes.push_back(hash_block(parent, tokens));
  }
}

}  // namespace specula
