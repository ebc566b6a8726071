// Paged attention over DeepSeek's MLA cache: one latent "head" per token, [c | rope(k_pe)] of
// D = kv_lora_rank + qk_rope_head_dim dims (576 for V2-Lite/V3), whose first Dv dims (512) are
// also the value. Serves every batch shape: decode, verification, prefill, chunked and mixed.
//
// Why this shape:
//  - with one kv head, every query head of a token reads the same cache rows, so a block packs
//    (token, head) rows of one kv head, 64 at a time, and each K tile it brings into shared memory
//    serves all of them: the latent is read once per token for all heads (MLA's bandwidth win).
//    The value is the same tile (its first Dv columns): nothing is loaded twice;
//  - with 16-128 heads sharing each key, a decode step does 2 (D + Dv) flops per head per cached
//    byte pair, hundreds of flops per byte: far past what CUDA cores sustain at HBM speed, so
//    both products run on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate);
//  - a 64 x 512 fp32 output does not fit one warp's registers, so the work is split twice: for
//    S = Q K^T each of the 8 warps computes a 16-row x 16-key piece; the scores go through shared
//    memory to a softmax step (4 threads per row, online max / sum in fp32, log2 domain), which
//    leaves bf16 probabilities P and each row's rescale factor in shared memory; for O += P V
//    each warp owns 64 output columns of all 64 rows (128 fp32 accumulators a thread);
//  - K tiles (32 keys) are gathered from the paged cache with cp.async, the next tile in flight
//    while the current one is used; rows past the split's end are zero-filled so that padding
//    never injects NaN into P V; shared rows are padded by 16 bytes so ldmatrix is conflict-free;
//  - split-KV for short query rows: a sequence's keys are cut into contiguous splits (grid z),
//    merged by a second kernel; the split length is computed on the device from the sequence's
//    length, so a captured launch stays correct for any seq_lens.
#include <algorithm>

#include "backend/cuda/cuda_kernel_attributes.h"
#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 64;      // (token, head) rows per block: 4 mma row atoms
constexpr int kKeys = 32;      // keys per tile
constexpr int kColsPerWarp = kMlaMaxVHeadDim / kWarps;  // 64 output columns per warp
constexpr int kQStride = kMlaMaxHeadDim + 8;  // Q / K row stride, elements (1168 bytes)
constexpr int kSStride = kKeys + 4;           // fp32 score row stride
constexpr int kPStride = kKeys + 8;           // bf16 probability row stride (80 bytes)
constexpr int kMaxSplits = 64;
constexpr int kMergeThreads = 128;
constexpr int kMinKeysPerSplit = 128;  // 4 tiles: below this a split's fixed costs outweigh its parallelism
constexpr float kLog2e = 1.4426950408889634f;

constexpr size_t kQBytes = size_t{kRows} * kQStride * sizeof(bf16);
constexpr size_t kKBytes = size_t{kKeys} * kQStride * sizeof(bf16);  // one of two buffers
constexpr size_t kSBytes = size_t{kRows} * kSStride * sizeof(float);
constexpr size_t kPBytes = size_t{kRows} * kPStride * sizeof(bf16);
constexpr size_t kSmemBytes = kQBytes + 2 * kKBytes + kSBytes + kPBytes + 3 * kRows * sizeof(float);
static_assert(kQBytes % 16 == 0 && kKBytes % 16 == 0 && kSBytes % 16 == 0 && kPBytes % 16 == 0,
              "shared-memory regions must stay 16-byte aligned for cp.async and ldmatrix");
static_assert(kColsPerWarp % 16 == 0, "each warp's output columns are whole 16-column mma steps");

// grid: x = row tile (heaviest first), y = sequence, z = kv head * num_splits + split.
__global__ void __launch_bounds__(kThreads, 1)
    mla_attention_kernel(PagedAttentionParams p, int group, int num_splits, float* partial_out,
                         float* partial_stats) {
  extern __shared__ uint4 smem_raw[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem_raw);
  bf16* k_tiles = q_tile + kRows * kQStride;  // two buffers of kKeys rows
  float* s_tile = reinterpret_cast<float*>(k_tiles + 2 * kKeys * kQStride);
  bf16* p_tile = reinterpret_cast<bf16*>(s_tile + kRows * kSStride);
  float* run_max = reinterpret_cast<float*>(p_tile + kRows * kPStride);
  float* run_sum = run_max + kRows;
  float* row_alpha = run_sum + kRows;
  allow_next_kernel_start();
  wait_for_previous_kernels();  // q and the cache entries the prologue wrote

  const int seq = blockIdx.y, kv_head = blockIdx.z / num_splits, split = blockIdx.z % num_splits;
  const int q_start = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - q_start;
  const int rows = q_len * group;  // packed (token, head) rows of this sequence and kv head
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // last rows (longest horizon) first
  if (row0 >= rows) return;
  const int block_rows = min(kRows, rows - row0);
  const int seq_len = p.seq_lens[seq];
  const int context = seq_len - q_len;  // keys before the first query token
  const int hq = p.num_q_heads, hk = p.num_kv_heads, d = p.head_dim, dv = p.v_head_dim;
  // This split's keys, cut at the last key any row of the block sees.
  const int kv_end = context + (row0 + block_rows - 1) / group + 1;
  const int per_split = ceil_div(ceil_div(seq_len, num_splits), kKeys) * kKeys;
  const int begin = split * per_split, end = min(kv_end, begin + per_split);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // Block row r -> its (query row, query head) index into q / out.
  auto row_head = [&](int r) -> int64_t {
    const int pr = row0 + r;
    return static_cast<int64_t>(q_start + pr / group) * hq + kv_head * group + pr % group;
  };

  if (begin >= end) {  // (only with splits) no key of this split is visible: weight 0 in the merge
    for (int r = tid; r < block_rows; r += kThreads) {
      const int64_t at = row_head(r) * num_splits + split;
      partial_stats[at * 2] = -INFINITY;
      partial_stats[at * 2 + 1] = 0.0f;
    }
    return;
  }

  // Columns are copied in 8-element chunks up to the last 16-dim mma step; those past d are zero.
  const int d_chunks = ceil_div(d, 16) * 2;
  const bf16* q = static_cast<const bf16*>(p.q);
  for (int c = tid; c < kRows * d_chunks; c += kThreads) {
    const int r = c / d_chunks, col = (c % d_chunks) * 8;
    const bool ok = r < block_rows && col < d;
    cp_async16(q_tile + r * kQStride + col, ok ? q + row_head(r) * d + col : q, ok);
  }
  const bf16* k_cache = static_cast<const bf16*>(p.k_cache);
  const PagedRows paged(p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq, p.block_size);
  auto load_keys = [&](int buf, int key0) {
    bf16* tile = k_tiles + buf * kKeys * kQStride;
    for (int c = tid; c < kKeys * d_chunks; c += kThreads) {
      const int r = c / d_chunks, col = (c % d_chunks) * 8, j = key0 + r;
      const bool ok = j < end && col < d;
      cp_async16(tile + r * kQStride + col, ok ? k_cache + (paged.row(j) * hk + kv_head) * d + col : k_cache, ok);
    }
  };
  for (int r = tid; r < kRows; r += kThreads) {
    run_max[r] = -INFINITY;
    run_sum[r] = 0.0f;
  }
  load_keys(0, begin);
  cp_async_commit();  // group: Q + K(0)

  const float score_scale = p.scale * kLog2e;
  const int mat = lane >> 3, mat_row = lane & 7;  // ldmatrix: lane l addresses row (l & 7) of matrix (l >> 3)
  const int s_atom = warp >> 1, s_keys = (warp & 1) * 16;  // this warp's piece of S
  const int col0 = warp * kColsPerWarp;                    // this warp's output columns
  const bool has_cols = col0 < dv;
  float o[4][kColsPerWarp / 8][4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
#pragma unroll
    for (int c = 0; c < kColsPerWarp / 8; ++c) o[a][c][0] = o[a][c][1] = o[a][c][2] = o[a][c][3] = 0.0f;
  }

  const int num_tiles = ceil_div(end - begin, kKeys);
  for (int t = 0; t < num_tiles; ++t) {
    const int key0 = begin + t * kKeys;
    cp_async_wait<0>();  // K(t) (and Q) have landed
    __syncthreads();     // ... for every thread; and every warp is done with tile t - 1's buffers
    if (t + 1 < num_tiles) load_keys((t + 1) & 1, key0 + kKeys);
    cp_async_commit();
    const bf16* k_tile = k_tiles + (t & 1) * kKeys * kQStride;

    // S = Q K^T for rows 16 s_atom.. and keys s_keys.. of the tile, scaled into the log2 domain,
    // masked (causal, and the split's end) into s_tile. Element (c, 2h + e) of the accumulator is
    // row lane/4 + 8h, key 8c + 2 (lane % 4) + e.
    {
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      if (s_atom * 16 < block_rows) {  // warp-uniform: atoms of padding rows are all masked anyway
        for (int kk = 0; kk < d_chunks / 2; ++kk) {
          uint32_t a[4], b[4];
          ldmatrix_x4(a, q_tile + (s_atom * 16 + (mat & 1) * 8 + mat_row) * kQStride + kk * 16 + (mat >> 1) * 8);
          ldmatrix_x4(b, k_tile + (s_keys + (mat >> 1) * 8 + mat_row) * kQStride + kk * 16 + (mat & 1) * 8);
          mma_bf16_16816(s[0], a, b[0], b[1]);
          mma_bf16_16816(s[1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = s_atom * 16 + (lane >> 2) + 8 * h;
        const int position = r < block_rows ? context + (row0 + r) / group : -1;  // -1: attends nothing
#pragma unroll
        for (int c = 0; c < 2; ++c) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int kcol = s_keys + 8 * c + 2 * (lane & 3) + e, j = key0 + kcol;
            s_tile[r * kSStride + kcol] = j < end && j <= position ? s[c][2 * h + e] * score_scale : -INFINITY;
          }
        }
      }
    }
    __syncthreads();

    // Online softmax, 4 threads per row (8 keys each, adjacent lanes of one warp).
    {
      const int r = tid >> 2, part = tid & 3;
      const float old_max = run_max[r];
      float v[8], m = -INFINITY;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[i] = s_tile[r * kSStride + part * 8 + i];
        m = fmaxf(m, v[i]);
      }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float new_max = fmaxf(old_max, m);
      const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row that sees no key yet
      float sum = 0.0f;
      Vec16<bf16> packed;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float pr = fast_exp2(v[i] - base);  // masked: exp2(-inf) = 0
        sum += pr;
        packed.elems[i] = __float2bfloat16_rn(pr);
      }
      *reinterpret_cast<uint4*>(p_tile + r * kPStride + part * 8) = packed.raw;
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      __syncwarp();  // all four threads have read run_max[r] before it changes
      if (part == 0) {
        const float alpha = fast_exp2(old_max - base);  // 0 while old_max = -inf
        row_alpha[r] = alpha;
        run_max[r] = new_max;
        run_sum[r] = run_sum[r] * alpha + sum;
      }
    }
    __syncthreads();

    // O = alpha O + P V over this warp's columns; V is the first Dv columns of the K tile.
    if (has_cols) {
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float alpha = row_alpha[a * 16 + (lane >> 2) + 8 * h];
#pragma unroll
          for (int c = 0; c < kColsPerWarp / 8; ++c) {
            o[a][c][2 * h] *= alpha;
            o[a][c][2 * h + 1] *= alpha;
          }
        }
      }
#pragma unroll
      for (int kc = 0; kc < kKeys / 16; ++kc) {
        uint32_t pa[4][4];  // P fragments: (rows 0-7 | 8-15) x (keys 0-7 | 8-15) of each atom
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          if (a * 16 < block_rows) {
            ldmatrix_x4(pa[a], p_tile + (a * 16 + (mat & 1) * 8 + mat_row) * kPStride + kc * 16 + (mat >> 1) * 8);
          }
        }
#pragma unroll
        for (int dn = 0; dn < kColsPerWarp / 16; ++dn) {
          const int col = col0 + dn * 16;
          if (col >= dv) break;
          uint32_t b[4];  // transposed: keys (0-7 | 8-15) x columns (0-7: b0 b1 | 8-15: b2 b3)
          ldmatrix_x4_trans(b, k_tile + (kc * 16 + (mat & 1) * 8 + mat_row) * kQStride + col + (mat >> 1) * 8);
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            if (a * 16 < block_rows) {
              mma_bf16_16816(o[a][2 * dn], pa[a], b[0], b[1]);
              mma_bf16_16816(o[a][2 * dn + 1], pa[a], b[2], b[3]);
            }
          }
        }
      }
    }
  }

  // Normalise and store (one split), or hand the unnormalised partials to the merge. Element
  // (c, 2h + e) of atom a: row 16a + lane/4 + 8h, column col0 + 8c + 2 (lane % 4) + e.
  if (has_cols) {
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = a * 16 + (lane >> 2) + 8 * h;
        if (r >= block_rows) continue;
        const int64_t rh = row_head(r);
        const float inv = num_splits == 1 ? 1.0f / run_sum[r] : 1.0f;  // one split sees key 0: sum >= 1
#pragma unroll
        for (int c = 0; c < kColsPerWarp / 8; ++c) {
          const int col = col0 + c * 8 + (lane & 3) * 2;
          if (col >= dv) continue;
          if (num_splits == 1) {
            *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.out) + rh * dv + col) =
                __floats2bfloat162_rn(o[a][c][2 * h] * inv, o[a][c][2 * h + 1] * inv);
          } else {
            *reinterpret_cast<float2*>(partial_out + (rh * num_splits + split) * dv + col) =
                make_float2(o[a][c][2 * h], o[a][c][2 * h + 1]);
          }
        }
      }
    }
  }
  if (num_splits > 1) {
    for (int r = tid; r < block_rows; r += kThreads) {
      const int64_t at = row_head(r) * num_splits + split;
      partial_stats[at * 2] = run_max[r];
      partial_stats[at * 2 + 1] = run_sum[r];
    }
  }
}

// Merges the splits of one (query row, head): out = sum_i w_i o_i / sum_i w_i l_i with
// w_i = 2^(m_i - max_j m_j); splits that saw no key (l_i = 0) carry no weight and are not read.
// Each split's statistics are read once, all at once (a thread a split), and its weight kept in
// shared memory, so that they cost one round trip to L2 rather than one a split.
__global__ void mla_merge_kernel(PagedAttentionParams p, int num_splits, const float* __restrict__ partial_out,
                                 const float* __restrict__ partial_stats) {
  __shared__ float weight[kMaxSplits], sum[kMaxSplits];
  __shared__ float reduce_buf[32];
  __shared__ float inv_total;
  allow_next_kernel_start();
  wait_for_previous_kernels();  // the attention kernel's partials
  const int head = blockIdx.x, row = blockIdx.y;
  const int hq = p.num_q_heads, dv = p.v_head_dim;
  const int64_t base = (static_cast<int64_t>(row) * hq + head) * num_splits;
  const int i = threadIdx.x;
  const float m_i = i < num_splits ? partial_stats[(base + i) * 2] : -INFINITY;
  const float l_i = i < num_splits ? partial_stats[(base + i) * 2 + 1] : 0.0f;
  const float m = block_max(m_i, reduce_buf);
  if (i < num_splits) {
    weight[i] = l_i > 0.0f ? exp2f(m_i - m) : 0.0f;
    sum[i] = l_i;
  }
  __syncthreads();
  if (i == 0) {  // in split order: one fixed order whatever the block size
    float total = 0.0f;
    for (int j = 0; j < num_splits; ++j) {
      if (sum[j] > 0.0f) total += weight[j] * sum[j];
    }
    inv_total = 1.0f / total;  // > 0: the split holding key 0 saw it
  }
  __syncthreads();
  bf16* out = static_cast<bf16*>(p.out) + (static_cast<int64_t>(row) * hq + head) * dv;
  for (int e = threadIdx.x; e < dv; e += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < num_splits; ++j) {
      if (sum[j] > 0.0f) acc += weight[j] * partial_out[(base + j) * dv + e];
    }
    out[e] = __float2bfloat16_rn(acc * inv_total);
  }
}

int row_tiles(const PagedAttentionParams& p) {
  return ceil_div(p.max_query_len * (p.num_q_heads / p.num_kv_heads), kRows);
}

}  // namespace

int mla_num_splits(const PagedAttentionParams& p, int sm_count) {
  if (p.max_query_len > kMaxDecodeQueryLen) return 1;  // prefill-sized rows fill the GPU by themselves
  const int blocks = p.num_seqs * p.num_kv_heads * row_tiles(p);
  // One block per SM fits (shared memory); aim for about two waves of blocks, but give every
  // split at least kMinKeysPerSplit keys of the longest sequence.
  const int wanted = ceil_div(2 * sm_count, std::max(blocks, 1));
  const int by_length = ceil_div(std::max(p.max_seq_len, 1), kMinKeysPerSplit);
  return std::clamp(std::min(wanted, by_length), 1, kMaxSplits);
}

cudaError_t launch_mla_attention(const PagedAttentionParams& p, int num_splits, float* partial_out,
                                 float* partial_stats, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.max_query_len == 0) return cudaSuccess;
  if (p.head_dim < 8 || p.head_dim > kMlaMaxHeadDim || p.head_dim % 8 != 0 || p.v_head_dim < 8 ||
      p.v_head_dim > kMlaMaxVHeadDim || p.v_head_dim % 8 != 0 || p.v_head_dim > p.head_dim || p.num_kv_heads < 1 ||
      p.num_q_heads % p.num_kv_heads != 0 || num_splits < 1 || num_splits > kMaxSplits ||
      (num_splits > 1 && (partial_out == nullptr || partial_stats == nullptr))) {
    return cudaErrorInvalidValue;
  }
  // More than 48 KiB of dynamic shared memory needs an explicit opt-in, once per GPU.
  const cudaError_t opt_in = raise_kernel_attribute(mla_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(kSmemBytes));
  if (opt_in != cudaSuccess) return opt_in;
  const int group = p.num_q_heads / p.num_kv_heads;
  const dim3 grid(row_tiles(p), p.num_seqs, p.num_kv_heads * num_splits);
  const cudaError_t err = launch_overlapped(mla_attention_kernel, {grid, dim3(kThreads), kSmemBytes}, stream, p, group,
                                            num_splits, partial_out, partial_stats);
  if (err != cudaSuccess || num_splits == 1) return err;
  static_assert(kMaxSplits <= kMergeThreads, "the merge reads a split's statistics a thread");
  return launch_overlapped(mla_merge_kernel, {dim3(p.num_q_heads, p.num_query_rows), dim3(kMergeThreads)}, stream, p,
                           num_splits, static_cast<const float*>(partial_out), static_cast<const float*>(partial_stats));
}

}  // namespace specula::cuda
