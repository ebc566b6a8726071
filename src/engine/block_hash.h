// Prefix-cache keys. A FULL block of block_size tokens is identified by a chained hash:
// xxhash64(parent block's hash, the block's token ids), so equal hashes mean equal prefixes up to
// and including the block (modulo 64-bit collisions, which the pool rules out by comparing the
// stored tokens and parent on every hit).
#pragma once

#include <cstdint>
#include <span>

#include "engine/request.h"

namespace specula {

// The parent of a sequence's first block.
inline constexpr BlockHash kRootBlockHash = 0x5eca1a0000000001ull;

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens);

// Extends request.block_hashes to cover every full block of its known tokens (prompt + output;
// never draft tokens).
void update_block_hashes(Request& request, int block_size);

}  // namespace specula
