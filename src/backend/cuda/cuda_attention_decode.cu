// Paged attention for decode and verification steps (at most kMaxDecodeQueryLen query rows per
// sequence): split-KV flash-decoding. Batches with (sequence, kv head) pairs for half the SMs or
// more go to the tensor-core kernel instead where it applies (cuda_attention_decode_mma.cu).
//
// Why this shape: a decode step reads every cached K/V byte once and does ~2 flops per byte per
// query row, so it is bound by HBM bandwidth, and a batch of a few sequences has far too few
// (sequence, head) pairs to fill 132 SMs. So:
//  - GQA-aware: a block owns one KV head and up to 8 "entries" that read it: (query row, query
//    head) pairs of that kv head's group, so each K/V row is loaded from memory once for all the
//    query heads sharing it and, when verifying k draft tokens, for all k+1 rows too; each entry
//    masks the keys past its own causal position;
//  - split-KV: a sequence's keys are cut into `num_splits` contiguous partitions processed by
//    different blocks (grid z), whose unnormalised partial outputs are merged with the usual
//    max/sum rescaling; the split is computed on the device from the sequence's length, so a
//    launch captured in a CUDA graph stays correct for any seq_lens;
//  - the merge: up to kMaxClusterSplits splits run as one thread-block cluster (grid z) and
//    merge through each other's shared memory after a cluster barrier, in the same launch (a
//    second kernel's launch and dependency wait cost ~0.5 us a layer at batch 1). More splits
//    (long contexts, when the GPU has few (sequence, head) pairs) write partials to global memory
//    for a merge kernel;
//  - each K/V row (D elements) is read by L = D/E lanes (rounded up to a power of two) with one
//    load of E elements each (bf16: 8 in 16 bytes; fp8: 16 in 16 bytes, or 8 in 8 bytes, see
//    slice_elems), so a warp reads 32/L rows per instruction, coalesced; the q.k dot products are
//    finished with shuffles inside each group of L lanes. An fp8 cache halves the bytes; 16
//    elements a lane halve the rows, shuffles and loads a thread handles (the per-row
//    instructions, not the bytes, bound a split) but cap a block at 2 entries, so they serve
//    batches too small to fill the GPU (slice_elems);
//  - keys go through the block in tiles of 64: scores for the tile into shared memory, one warp
//    per query head updates the running max / sum (online softmax, fp32, log2 domain), then the
//    same lanes accumulate p * V in registers. Nothing is sized by the sequence length. A tile's
//    rows are all requested before the first is used: at batch 1 a block has one or two tiles,
//    so its time is its number of memory round trips, and at batch 64 the loads in flight are
//    what keeps HBM busy (docs/PERFORMANCE.md has the figures).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_kernel_attributes.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_element.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;  // keys per tile: two per lane when one warp reduces a head's tile
constexpr int kMaxSplits = 64;
constexpr int kMinKeysPerSplit = 128;  // below this a split's fixed costs outweigh its parallelism
constexpr float kLog2e = 1.4426950408889634f;

// L: lanes per K/V row (power of two, 2..32); G: entries per block (1, 2, 4 or 8). Entry e of a
// sequence is query row e / group, head e % group of the block's kv head. With several splits and
// no partial_out, the launch is one cluster per (entries, sequence) and the splits merge in it.
// Launch bounds: with up to 4 entries, 4 blocks (16 warps) must fit an SM, i.e. at most 128
// registers a thread: this kernel lives on the loads it keeps in flight, and the general entry
// bookkeeping would otherwise push it just past 128 and cost a quarter of the resident warps.
// C: the cache's element type (bf16, or fp8 holding x / k_scale and x / v_scale); E: elements of
// a row a lane reads with one load (KvSlice).
template <int L, int G, class C, int E>
__global__ void __launch_bounds__(kThreads, G <= 4 ? 4 : 2)
    decode_attention_kernel(PagedAttentionParams p, int group, int entry_chunks, float* partial_out,
                            float* partial_stats) {
  constexpr int kRowsPerPass = kThreads / L;
  constexpr int kPasses = kTile / kRowsPerPass;
  // Rows a thread loads at once: 8 (4 for 256-wide heads, whose 16 row indices a tile take
  // registers too).
  constexpr int kBatch = kPasses < 8 ? kPasses : kPasses > 8 ? 4 : 8;
  // V rows are loaded together with the K rows of the tile (held raw in registers until P.V), so
  // that twice the bytes are in flight and P.V waits for nothing, where the registers allow (a
  // block of 4+ entries holds 64 registers of q and accumulators a thread: with 4, even fp8's
  // half-size V slices spill); otherwise V is loaded after the softmax.
  using Slice = KvSlice<C, E>;
  using Raw = typename Slice::Raw;
  constexpr bool kPrefetchV = kPasses <= 8 && G <= 2;
  __shared__ float scores[G][kTile];
  __shared__ float run_max[G], run_sum[G], tile_scale[G];
  __shared__ float partial[kWarps][G][L * E];
  allow_next_kernel_start();
  const int kv_head = blockIdx.x / entry_chunks, chunk = blockIdx.x % entry_chunks;
  const int seq = blockIdx.y, split = blockIdx.z, num_splits = gridDim.z;
  const bool merge_in_cluster = num_splits > 1 && partial_out == nullptr;
  // The step's attention metadata and the cache rows of the keys before its first query row are
  // no previous kernel's output (metadata_before_wait), so with it they are requested while the
  // previous kernel drains: the lengths, then this block's block-table entries and its K/V rows
  // into L2. A short context's block is otherwise a chain of round trips after the wait
  // (lengths, table, K/V), each as long as its arithmetic.
  int row0 = 0, q_len = 0, seq_len = 0;
  auto read_lengths = [&] {
    row0 = p.query_start_loc[seq];
    q_len = p.query_start_loc[seq + 1] - row0;
    seq_len = p.seq_lens[seq];
  };
  if (p.metadata_before_wait) {
    read_lengths();
    const int per_split = ceil_div(ceil_div(seq_len, num_splits), kTile) * kTile;
    const int first = split * per_split, stop = min(seq_len - q_len, first + per_split);
    const PagedRows paged(p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq, p.block_size);
    const int row_bytes = p.head_dim * static_cast<int>(sizeof(C)), v_row_bytes = p.v_head_dim * static_cast<int>(sizeof(C));
    for (int j = first + static_cast<int>(threadIdx.x); j < stop; j += kThreads) {
      const int64_t row = paged.row(j);
      const char* k_row = static_cast<const char*>(p.k_cache) + (row * p.num_kv_heads + kv_head) * row_bytes;
      const char* v_row = static_cast<const char*>(p.v_cache) + (row * p.num_kv_heads + kv_head) * v_row_bytes;
      for (int b = 0; b < row_bytes; b += 128) prefetch_l2_line(k_row + b);
      for (int b = 0; b < v_row_bytes; b += 128) prefetch_l2_line(v_row + b);
    }
  }
  wait_for_previous_kernels();  // q (and the K/V of this step) come from the previous kernels
  if (!p.metadata_before_wait) read_lengths();
  const int entry0 = chunk * G;
  if (entry0 >= q_len * group) return;  // fewer (row, head) entries here: alike in every split
  const int entries = min(G, q_len * group - entry0);
  const int context = seq_len - q_len;  // keys before the first query row
  const int hq = p.num_q_heads, hk = p.num_kv_heads, d = p.head_dim, dv = p.v_head_dim;
  // Entry g's batch row, query head and causal limit (last visible key); -1: no entry.
  auto entry_row = [&](int g) { return row0 + (entry0 + g) / group; };
  auto entry_head = [&](int g) { return kv_head * group + (entry0 + g) % group; };

  // This split's keys: an even share of the sequence (rounded up to whole tiles), cut at the
  // last key any entry of the block sees.
  const int per_split = ceil_div(ceil_div(seq_len, num_splits), kTile) * kTile;
  const int visible_end = context + (entry0 + entries - 1) / group + 1;
  const int begin = split * per_split, end = min(visible_end, begin + per_split);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (begin >= end && !merge_in_cluster) {  // nothing to attend: empty partials (weight 0 in the merge)
    if (num_splits > 1) {
      for (int g = tid; g < entries; g += kThreads) {
        const int64_t at = (static_cast<int64_t>(entry_row(g)) * hq + entry_head(g)) * num_splits + split;
        partial_stats[at * 2] = -INFINITY;
        partial_stats[at * 2 + 1] = 0.0f;
      }
    }
    return;
  }

  const int sub = tid % L;   // which E-element slice of a row this thread reads
  const int slot = tid / L;  // which row of a pass
  const int dim0 = sub * E;
  const bool k_active = dim0 < d, v_active = dim0 < dv;

  for (int g = tid; g < G; g += kThreads) {
    run_max[g] = -INFINITY;
    run_sum[g] = 0.0f;
  }
  // q, pre-scaled so that scores come out in the log2 domain (and by the cache's K scale).
  const bf16* q = static_cast<const bf16*>(p.q);
  const float q_scale = p.scale * kLog2e * p.k_scale;
  float qv[G][E];
  float acc[G][E];
  int limit[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    limit[g] = g < entries ? context + (entry0 + g) / group : -1;
#pragma unroll
    for (int e = 0; e < E; ++e) qv[g][e] = acc[g][e] = 0.0f;
    if (g < entries && k_active) {
      const bf16* q_row = q + (static_cast<int64_t>(entry_row(g)) * hq + entry_head(g)) * d + dim0;
#pragma unroll
      for (int part = 0; part < E / 8; ++part) {
        float eight[8];
        load_vec(q_row + 8 * part, eight);
#pragma unroll
        for (int e = 0; e < 8; ++e) qv[g][8 * part + e] = eight[e] * q_scale;
      }
    }
  }
  const C* k_cache = static_cast<const C*>(p.k_cache) + static_cast<int64_t>(kv_head) * d + dim0;
  const C* v_cache = static_cast<const C*>(p.v_cache) + static_cast<int64_t>(kv_head) * dv + dim0;
  const int64_t k_row_stride = static_cast<int64_t>(hk) * d, v_row_stride = static_cast<int64_t>(hk) * dv;
  const PagedRows paged(p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq, p.block_size);
  __syncthreads();

  for (int t0 = begin; t0 < end; t0 += kTile) {
    // The tile's cache rows (-1: past the split), then its K rows, kBatch passes of loads issued
    // before the first is used: a tile costs a few memory round trips, not one per pass (ptxas
    // does not move a pass's loads above the previous pass's shared-memory stores by itself).
    int cache_row[kPasses];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int j = t0 + pass * kRowsPerPass + slot;
      cache_row[pass] = j < end ? static_cast<int>(paged.row(j)) : -1;
    }
    Raw v_raw[kPrefetchV ? kPasses : 1];
#pragma unroll
    for (int batch = 0; batch < kPasses; batch += kBatch) {
      Raw k_raw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int row = cache_row[batch + b];
        k_raw[b] = row >= 0 && k_active ? load_kv_slice<C, E>(k_cache + row * k_row_stride) : Raw{};
        if constexpr (kPrefetchV) {
          v_raw[batch + b] = row >= 0 && v_active ? load_kv_slice<C, E>(v_cache + row * v_row_stride) : Raw{};
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = (batch + b) * kRowsPerPass + slot, j = t0 + i;
        float kv[E];
        Slice::widen(k_raw[b], kv);
        float dot[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          dot[g] = 0.0f;
#pragma unroll
          for (int e = 0; e < E; ++e) dot[g] += qv[g][e] * kv[e];
#pragma unroll
          for (int off = L / 2; off > 0; off >>= 1) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], off);
        }
        if (sub == 0) {
#pragma unroll
          for (int g = 0; g < G; ++g) scores[g][i] = j < end && j <= limit[g] ? dot[g] : -INFINITY;
        }
      }
    }
    __syncthreads();
    // Online softmax: one warp per entry rescales the running sum and turns scores into weights.
    for (int g = warp; g < G; g += kWarps) {
      const float s0 = scores[g][lane], s1 = scores[g][lane + 32];
      const float old_max = run_max[g];
      const float new_max = fmaxf(old_max, warp_max(fmaxf(s0, s1)));
      const float base = new_max == -INFINITY ? 0.0f : new_max;  // an entry that sees no key yet
      const float p0 = fast_exp2(s0 - base), p1 = fast_exp2(s1 - base);
      scores[g][lane] = p0;
      scores[g][lane + 32] = p1;
      const float tile_sum = warp_sum(p0 + p1);
      __syncwarp();  // every lane has read run_max[g] before lane 0 rewrites it
      if (lane == 0) {
        const float alpha = fast_exp2(old_max - base);  // 0 while old_max = -inf
        tile_scale[g] = alpha;
        run_max[g] = new_max;
        run_sum[g] = run_sum[g] * alpha + tile_sum;
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float alpha = tile_scale[g];
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] *= alpha;
    }
#pragma unroll
    for (int batch = 0; batch < kPasses; batch += kBatch) {
      Raw v_batch[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int row = cache_row[batch + b];
        if constexpr (kPrefetchV) {
          v_batch[b] = v_raw[batch + b];
        } else {
          v_batch[b] = row >= 0 && v_active ? load_kv_slice<C, E>(v_cache + row * v_row_stride) : Raw{};
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (cache_row[batch + b] < 0 || !v_active) continue;
        const int i = (batch + b) * kRowsPerPass + slot;
        float vv[E];
        Slice::widen(v_batch[b], vv);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float w = scores[g][i];
#pragma unroll
          for (int e = 0; e < E; ++e) acc[g][e] += w * vv[e];
        }
      }
    }
    __syncthreads();  // the next tile overwrites scores
  }

  // Sum the accumulators of the lanes that read the same dims (lanes differing in the bits above
  // log2(L)), then across warps through shared memory; the cache's V scale applies here, once.
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
#pragma unroll
      for (int off = L; off < 32; off <<= 1) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], off);
      acc[g][e] *= p.v_scale;
    }
  }
  if (lane < L) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < E; ++e) partial[warp][g][lane * E + e] = acc[g][e];
    }
  }
  __syncthreads();
  bf16* out = static_cast<bf16*>(p.out);
  if (merge_in_cluster) {
    // This split's unnormalised output into partial[0] (each element read and written by one
    // thread), then every block of the cluster merges a share of the elements from all splits'
    // shared memory. An empty split has run_sum 0 and weight 0.
    for (int idx = tid; idx < entries * dv; idx += kThreads) {
      const int g = idx / dv, e = idx % dv;
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) o += partial[w][g][e];
      partial[0][g][e] = o;
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    // Every split's statistics, then every needed output, requested together: two round trips
    // to the other blocks' shared memory rather than a few a split.
    for (int idx = split * kThreads + tid; idx < entries * dv; idx += num_splits * kThreads) {
      const int g = idx / dv, e = idx % dv;
      float split_max[kMaxClusterSplits], split_sum[kMaxClusterSplits], split_out[kMaxClusterSplits];
#pragma unroll
      for (int i = 0; i < kMaxClusterSplits; ++i) {
        split_max[i] = i < num_splits ? cluster.map_shared_rank(&run_max[g], i)[0] : -INFINITY;
        split_sum[i] = i < num_splits ? cluster.map_shared_rank(&run_sum[g], i)[0] : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kMaxClusterSplits; ++i)
        split_out[i] = split_sum[i] > 0.0f ? cluster.map_shared_rank(&partial[0][g][e], i)[0] : 0.0f;
      float m = -INFINITY;
#pragma unroll
      for (int i = 0; i < kMaxClusterSplits; ++i) m = fmaxf(m, split_max[i]);
      float total = 0.0f, o = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxClusterSplits; ++i) {
        if (split_sum[i] > 0.0f) {
          const float w = fast_exp2(split_max[i] - m);
          total += w * split_sum[i];
          o += w * split_out[i];
        }
      }
      const int64_t row_head = static_cast<int64_t>(entry_row(g)) * hq + entry_head(g);
      out[row_head * dv + e] = __float2bfloat16_rn(o / total);  // total > 0: some split saw key 0
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
    return;
  }
  for (int idx = tid; idx < entries * dv; idx += kThreads) {
    const int g = idx / dv, e = idx % dv;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += partial[w][g][e];
    const int64_t row_head = static_cast<int64_t>(entry_row(g)) * hq + entry_head(g);
    if (num_splits == 1) {  // one split sees keys 0..limit: run_sum >= 1
      out[row_head * dv + e] = __float2bfloat16_rn(o / run_sum[g]);
    } else {
      const int64_t at = row_head * num_splits + split;
      partial_out[at * dv + e] = o;
      if (e == 0) {
        partial_stats[at * 2] = run_max[g];
        partial_stats[at * 2 + 1] = run_sum[g];
      }
    }
  }
}

// Merges the splits of one (query row, query head): out = sum_i w_i o_i / sum_i w_i l_i with
// w_i = 2^(m_i - max_j m_j). Empty splits (l_i = 0) carry no weight and their outputs are not read.
__global__ void decode_merge_kernel(PagedAttentionParams p, int num_splits, const float* __restrict__ partial_out,
                                    const float* __restrict__ partial_stats) {
  __shared__ float weight[kMaxSplits];
  __shared__ float inv_total;
  allow_next_kernel_start();
  wait_for_previous_kernels();
  const int head = blockIdx.x, row = blockIdx.y;
  const int hq = p.num_q_heads, dv = p.v_head_dim;
  const int64_t base = (static_cast<int64_t>(row) * hq + head) * num_splits;
  if (threadIdx.x < 32) {
    float m = -INFINITY;
    for (int i = threadIdx.x; i < num_splits; i += 32) m = fmaxf(m, partial_stats[(base + i) * 2]);
    m = warp_max(m);
    float total = 0.0f;
    for (int i = threadIdx.x; i < num_splits; i += 32) {
      const float l = partial_stats[(base + i) * 2 + 1];
      const float w = l > 0.0f ? fast_exp2(partial_stats[(base + i) * 2] - m) : 0.0f;
      weight[i] = w;
      total += w * l;
    }
    total = warp_sum(total);
    if (threadIdx.x == 0) inv_total = 1.0f / total;  // total > 0: some split saw key 0
  }
  __syncthreads();
  bf16* out = static_cast<bf16*>(p.out) + (static_cast<int64_t>(row) * hq + head) * dv;
  for (int e = threadIdx.x; e < dv; e += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < num_splits; ++i) {
      if (weight[i] > 0.0f) o += weight[i] * partial_out[(base + i) * dv + e];
    }
    out[e] = __float2bfloat16_rn(o * inv_total);
  }
}

// Entries (query row, query head) of one kv head: a block takes up to 8.
int entries_per_block(int entries) { return entries <= 1 ? 1 : entries <= 2 ? 2 : entries <= 4 ? 4 : 8; }

// Blocks of 2 entries for several query rows too (below); SPECULA_VERIFY_ATTENTION_PAIRS=0 keeps
// them to single-row steps (for comparing the two).
bool verification_pairs_enabled(const PagedAttentionParams& p) {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_VERIFY_ATTENTION_PAIRS");
    return !(v && v[0] == '0');
  }();
  return p.max_query_len == 1 || enabled;
}

// Elements a lane reads with one load: 16 for an fp8 cache whose rows start 16-byte aligned, in
// batches whose (sequence, kv head, entries) blocks do not fill the GPU (they split keys to fill
// it, and fewer instructions a row shorten each split); where they fill it, 8 and up to 8 entries
// a block, which read each K/V row once for 4-8 query heads (H200, fp8, batch 64 x 4096 keys:
// 0.331 ms with 8 elements and 4 entries, 0.385 ms with 16 and 2; batch 1: 13.7 against 12.7 us).
int slice_elems(const PagedAttentionParams& p) {
  if (!p.cache_fp8 || p.head_dim % 16 != 0 || p.v_head_dim % 16 != 0) return 8;
  const int entries = p.max_query_len * (p.num_q_heads / p.num_kv_heads);
  const int blocks = p.num_seqs * p.num_kv_heads * ceil_div(entries, entries_per_block(entries));
  return blocks < p.sm_count ? 16 : 8;
}

// Entries a block takes: at most 2 with 16 elements a lane (their q and outputs in registers), and
// at most 2 in a decode or verification step whose blocks of 4 or 8 would not fill the GPU: a
// block of 2 requests each tile's K and V rows together (kPrefetchV), one memory round trip a tile
// instead of two, and the more blocks share each K/V row through L2 (H200, Llama-3.1-8B heads,
// bf16: batch 1 x 256 keys 8.0 against 11.3 us, batch 16 x 1024 37.0 against 40.9; at batch 64
// blocks of 4 fill the GPU and stay: 2 took 38 against 30 us; the embedded model's 6-row
// verification: docs/PERFORMANCE.md, "Verification rows on the tensor cores").
int heads_per_block(const PagedAttentionParams& p, int elems) {
  const int entries = p.max_query_len * (p.num_q_heads / p.num_kv_heads);
  const int g = entries_per_block(entries);
  const bool fills = p.num_seqs * p.num_kv_heads * ceil_div(entries, g) >= p.sm_count;
  if (elems == 16 || (g >= 4 && !fills && verification_pairs_enabled(p))) return std::min(g, 2);
  return g;
}

int lanes_per_row(int max_dim, int elems) {
  int lanes = 2;
  while (lanes * elems < max_dim) lanes *= 2;
  return lanes;
}

template <int L, int G, class C, int E>
cudaError_t launch_lgce(const PagedAttentionParams& p, int group, int num_splits, float* partial_out,
                        float* partial_stats, cudaStream_t stream) {
  const auto kernel = decode_attention_kernel<L, G, C, E>;
  const int entry_chunks = ceil_div(p.max_query_len * group, G);
  LaunchShape shape{dim3(p.num_kv_heads * entry_chunks, p.num_seqs, num_splits), dim3(kThreads)};
  if (num_splits > 1 && partial_out == nullptr) {
    shape.cluster = dim3(1, 1, num_splits);
    if (num_splits > 8) {  // 8 is the portable cluster size; Hopper takes 16
      const cudaError_t allowed = raise_kernel_attribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (allowed != cudaSuccess) return allowed;
    }
  }
  return launch_overlapped(kernel, shape, stream, p, group, entry_chunks, partial_out, partial_stats);
}

template <int L, int G>
cudaError_t launch_lg(const PagedAttentionParams& p, int group, int num_splits, float* partial_out,
                      float* partial_stats, cudaStream_t stream) {
  if (!p.cache_fp8) return launch_lgce<L, G, bf16, 8>(p, group, num_splits, partial_out, partial_stats, stream);
  if (slice_elems(p) == 16) {
    // heads_per_block and lanes_per_row pick at most 2 entries and 16 lanes for 16 elements.
    if constexpr (G <= 2 && L <= 16) {
      return launch_lgce<L, G, fp8, 16>(p, group, num_splits, partial_out, partial_stats, stream);
    }
    return cudaErrorInvalidValue;
  }
  return launch_lgce<L, G, fp8, 8>(p, group, num_splits, partial_out, partial_stats, stream);
}

template <int L>
cudaError_t launch_l(const PagedAttentionParams& p, int group, int num_splits, float* partial_out,
                     float* partial_stats, cudaStream_t stream) {
  switch (heads_per_block(p, slice_elems(p))) {
    case 1: return launch_lg<L, 1>(p, group, num_splits, partial_out, partial_stats, stream);
    case 2: return launch_lg<L, 2>(p, group, num_splits, partial_out, partial_stats, stream);
    case 4: return launch_lg<L, 4>(p, group, num_splits, partial_out, partial_stats, stream);
    default: return launch_lg<L, 8>(p, group, num_splits, partial_out, partial_stats, stream);
  }
}

}  // namespace

int decode_num_splits(const PagedAttentionParams& p, int sm_count) {
  if (decode_attention_mma_applies(p)) return 1;  // its 4 warps split the keys inside the block
  const int entries = p.max_query_len * (p.num_q_heads / p.num_kv_heads);
  const int blocks = p.num_seqs * p.num_kv_heads * ceil_div(entries, heads_per_block(p, slice_elems(p)));
  // Splits until there are ~4 blocks an SM where the batch alone has fewer blocks than SMs, ~2
  // where it has more (each split adds its share of the merge: H200, Llama-3.1-8B heads, bf16,
  // batch 64 x 256 keys one split 30.0 us against two 38.0; batch 16 x 1024 three 40.9 against
  // five 51.3), but give every split at least kMinKeysPerSplit keys of the longest sequence.
  const int per_sm = blocks < sm_count ? 4 : 2;
  const int wanted = ceil_div(per_sm * sm_count, std::max(blocks, 1));
  const int by_length = ceil_div(std::max(p.max_seq_len, 1), kMinKeysPerSplit);
  return std::clamp(std::min(wanted, by_length), 1, kMaxSplits);
}

cudaError_t launch_decode_attention(const PagedAttentionParams& p, int num_splits, float* partial_out,
                                    float* partial_stats, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.max_query_len == 0) return cudaSuccess;
  if (num_splits < 1 || num_splits > kMaxSplits || p.max_query_len > kMaxDecodeQueryLen) return cudaErrorInvalidValue;
  if (num_splits == 1 && decode_attention_mma_applies(p)) return launch_decode_attention_mma(p, stream);
  const int group = p.num_q_heads / p.num_kv_heads;
  cudaError_t err;
  switch (lanes_per_row(std::max(p.head_dim, p.v_head_dim), slice_elems(p))) {
    case 2: err = launch_l<2>(p, group, num_splits, partial_out, partial_stats, stream); break;
    case 4: err = launch_l<4>(p, group, num_splits, partial_out, partial_stats, stream); break;
    case 8: err = launch_l<8>(p, group, num_splits, partial_out, partial_stats, stream); break;
    case 16: err = launch_l<16>(p, group, num_splits, partial_out, partial_stats, stream); break;
    case 32: err = launch_l<32>(p, group, num_splits, partial_out, partial_stats, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || num_splits == 1) return err;
  if (partial_out == nullptr) return cudaSuccess;  // merged in the cluster
  const int threads = std::clamp((p.v_head_dim + 31) / 32 * 32, 32, 256);
  return launch_overlapped(decode_merge_kernel, {dim3(p.num_q_heads, p.num_query_rows), dim3(threads)}, stream, p,
                           num_splits, static_cast<const float*>(partial_out), static_cast<const float*>(partial_stats));
}

}  // namespace specula::cuda
