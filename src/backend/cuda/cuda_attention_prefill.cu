// Paged attention for any query lengths: varlen causal flash attention (FlashAttention-2 style)
// reading K/V from the paged cache through the block tables. Serves prefill, chunked prefill,
// speculative verification (k+1 rows per sequence) and mixed batches with decode rows.
//
// Why this shape:
//  - prefill is compute-bound, so Q.K^T and P.V run on the tensor cores (mma.sync m16n8k16,
//    bf16 in, fp32 accumulate); a block of 4 warps owns 128 query rows, each warp 32 of them (two
//    16-row mma tiles sharing every K/V fragment it loads), and loops over the keys in tiles of
//    BC, keeping the running max / sum and the output in registers (online softmax in fp32, log2
//    domain) so that the score matrix never exists;
//  - GQA rows are packed: the block's rows are (token, query head) pairs of ONE kv head, so a
//    K/V tile brought into shared memory serves all query heads of its group, and a short query
//    (verification, or a decode row in a mixed batch) still fills the tile's rows with heads;
//  - K/V tiles are gathered from the paged cache row by row with cp.async (16-byte, L1 bypass)
//    into two stages, tile t + 1 in flight during all of tile t's work, so one barrier a tile;
//    rows past the causal horizon are zero-filled so that padding never injects NaN into P.V. An
//    fp8 cache's tiles arrive the same way (half the bytes) in staging buffers and are widened to
//    bf16 (times the scale) in shared memory once they land, so the tensor cores run as for bf16
//    and the loads stay asynchronous (plain loads that convert on the way cost 1.8x at 4096 tokens);
//  - with two warps a scheduler (registers cap a multiprocessor at two blocks), every instruction
//    that is not an MMA delays the tensor cores: a thread finds its tile rows' cache addresses once
//    for K and V with a power-of-two page shift, fixed-count unrolled copies, maxima and sums as
//    trees, the mask only on the tiles that reach the diagonal, and the output rescaled only when
//    a row's maximum moved (1.85x at 4096 tokens together);
//  - shared-memory rows are padded by 16 bytes so that the 8 row addresses of every ldmatrix
//    phase fall in distinct banks (a row stride that is a multiple of 128 bytes would serialise
//    them 8-way);
//  - head dims are compiled for four capacities (32, 64, 128, 256) and any multiple of 8 up to the
//    capacity runs, the tail zero-padded; 64 and 128 run without padding; 256-wide heads use one
//    16-row tile per warp (two would not fit the 255 registers a thread has).
//  - the heaviest row tiles (longest causal horizon) are scheduled first; tiles of keys that every
//    row of the block sees skip the causal mask.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_kernel_attributes.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_element.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr float kLog2e = 1.4426950408889634f;

// ATOMS: 16-row mma tiles per warp. Two (32 rows a warp, 128 a block) let every K/V fragment
// loaded from shared memory feed twice the tensor-core work, which halves the shared-memory
// traffic per flop (with one atom, ldmatrix bandwidth caps the mma rate); the accumulators of
// 256-wide heads do not fit twice in registers, so those use one.
template <int DMAX, int BC, int ATOMS>
constexpr int rows_per_block() {
  return 16 * ATOMS * (kThreads / 32);
}
// Q, two K/V tile pairs (tile t + 1 loads while tile t is computed) and, for an fp8 cache, which
// lands in two pairs of staging buffers widened into one bf16 pair, those buffers.
template <int DMAX, int BC, int ATOMS, class C>
constexpr size_t prefill_smem_bytes() {
  constexpr bool kFp8 = sizeof(C) == 1;
  constexpr size_t kRawBytes = kFp8 ? 2 * 2 * BC * DMAX : 0;
  constexpr int kTilePairs = kFp8 ? 1 : 2;
  return static_cast<size_t>(rows_per_block<DMAX, BC, ATOMS>() + 2 * kTilePairs * BC) * (DMAX + 8) * sizeof(bf16) +
         kRawBytes;
}

// Copies a [ROWS, dim] tile into shared memory (row stride DMAX + 8); row r comes from `row_ptr(r)`
// or is zero-filled when it returns null; columns past `dim` are zero-filled. Each thread copies
// one fixed column of every (kThreads / chunks-per-row)-th row, so the loop unrolls and the rows'
// block-table reads are all in flight before the first copy is issued.
template <int DMAX, int ROWS, class RowPtr>
__device__ __forceinline__ void load_tile_async(bf16* tile, int dim, RowPtr row_ptr, const bf16* any_valid) {
  constexpr int kChunksPerRow = DMAX / 8;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && ROWS % kRowsPerPass == 0);
  const int col = (threadIdx.x % kChunksPerRow) * 8, r0 = threadIdx.x / kChunksPerRow;
#pragma unroll
  for (int i = 0; i < ROWS / kRowsPerPass; ++i) {
    const int r = r0 + i * kRowsPerPass;
    const bf16* src = col < dim ? row_ptr(r) : nullptr;
    cp_async16(tile + r * (DMAX + 8) + col, src ? src + col : any_valid, src != nullptr);
  }
}

// K/V tiles from the cache move in 16-byte chunks (8 bf16 or 16 fp8 elements): a thread copies one
// fixed chunk column of every kv_rows_per_pass-th row.
template <int DMAX, class C>
constexpr int kv_chunks_per_row() {
  return DMAX * static_cast<int>(sizeof(C)) / 16;
}
template <int DMAX, class C>
constexpr int kv_rows_per_pass() {
  return kThreads / kv_chunks_per_row<DMAX, C>();
}

// A K or V tile from the cache: this thread's rows are cache rows `cache_rows[i]` (a page row times
// the kv heads plus the head; -1: past the horizon, zero-filled). A bf16 cache lands in its tile
// (row stride DMAX + 8 elements), an fp8 one in its staging buffer (row stride DMAX bytes); `dim`
// is a multiple of a chunk's elements.
template <int DMAX, int ROWS, class C>
__device__ __forceinline__ void load_cache_tile_async(void* dst, int dim, const C* cache,
                                                      const int (&cache_rows)[ROWS / kv_rows_per_pass<DMAX, C>()]) {
  constexpr int kChunksPerRow = kv_chunks_per_row<DMAX, C>();
  constexpr int kRowsPerPass = kv_rows_per_pass<DMAX, C>();
  constexpr int kElems = 16 / static_cast<int>(sizeof(C));
  constexpr int kDstRowBytes = sizeof(C) == 1 ? DMAX : (DMAX + 8) * 2;
  static_assert(kThreads % kChunksPerRow == 0 && ROWS % kRowsPerPass == 0);
  const int chunk = threadIdx.x % kChunksPerRow, r0 = threadIdx.x / kChunksPerRow;
  const int col = chunk * kElems;
#pragma unroll
  for (int i = 0; i < ROWS / kRowsPerPass; ++i) {
    const bool valid = cache_rows[i] >= 0 && col < dim;
    const C* src = cache + static_cast<int64_t>(cache_rows[i]) * dim + col;
    cp_async16(static_cast<char*>(dst) + (r0 + i * kRowsPerPass) * kDstRowBytes + chunk * 16, valid ? src : cache,
               valid);
  }
}

// cp.async of 8 bytes (.ca: .cg copies only 16), zero-filled unless `pred`; the source must be
// 8-byte aligned.
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(pred ? 8 : 0));
}

// An fp8 [ROWS, dim] tile into a [ROWS, DMAX]-byte staging buffer; rows with no source and
// columns past `dim` are zero-filled (e4m3 zero). Rows of a multiple of 16 elements start 16-byte
// aligned and go 16 elements a copy; others (dim = 8 mod 16) 8 a copy.
template <int DMAX, int ROWS, class RowPtr>
__device__ __forceinline__ void load_raw_tile_async(uint8_t* raw, int dim, RowPtr row_ptr, const fp8* any_valid) {
  if (dim % 16 == 0) {
    constexpr int kChunksPerRow = DMAX / 16;
    for (int c = threadIdx.x; c < ROWS * kChunksPerRow; c += kThreads) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 16;
      const fp8* src = col < dim ? row_ptr(r) : nullptr;
      cp_async16(raw + r * DMAX + col, src ? src + col : any_valid, src != nullptr);
    }
  } else {
    constexpr int kChunksPerRow = DMAX / 8;
    for (int c = threadIdx.x; c < ROWS * kChunksPerRow; c += kThreads) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      const fp8* src = col < dim ? row_ptr(r) : nullptr;
      cp_async8(raw + r * DMAX + col, src ? src + col : any_valid, src != nullptr);
    }
  }
}

// The landed staging buffer widened into the bf16 tile (row stride DMAX + 8), times `scale`.
template <int DMAX, int ROWS>
__device__ __forceinline__ void widen_tile(const uint8_t* raw, bf16* tile, float scale) {
  constexpr int kChunksPerRow = DMAX / 8;
  for (int c = threadIdx.x; c < ROWS * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    float f[8];
    KvSlice<fp8, 8>::widen(*reinterpret_cast<const uint2*>(raw + r * DMAX + col), f);
    Vec16<bf16> out;
#pragma unroll
    for (int e = 0; e < 8; ++e) out.elems[e] = __float2bfloat16_rn(f[e] * scale);
    *reinterpret_cast<uint4*>(tile + r * (DMAX + 8) + col) = out.raw;
  }
}

// v[0] op v[1] op ... as a tree of depth log2(N) (N a power of two): the chain of dependent
// fixed-latency instructions is what a warp waits on when few warps share a scheduler.
template <int N, class Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
#pragma unroll
  for (int width = N / 2; width >= 1; width /= 2) {
#pragma unroll
    for (int i = 0; i < width; ++i) v[i] = op(v[i], v[i + width]);
  }
  return v[0];
}

// C: the cache's element type (bf16, or fp8 holding x / k_scale and x / v_scale).
template <int DMAX, int BC, int ATOMS, bool FULL, class C>
__global__ void __launch_bounds__(kThreads) prefill_attention_kernel(PagedAttentionParams p, int group) {
  constexpr int kRows = rows_per_block<DMAX, BC, ATOMS>();
  constexpr int kStride = DMAX + 8;  // shared-memory row stride, elements
  constexpr int kScoreChunks = BC / 8;
  constexpr int kOutChunks = DMAX / 8;
  extern __shared__ uint4 smem_raw[];
  constexpr bool kFp8 = std::is_same_v<C, fp8>;
  constexpr int kTilePairs = kFp8 ? 1 : 2;
  // Stage i's K tile at k_tiles + i * 2 * BC * kStride, its V tile BC rows after it.
  bf16* q_tile = reinterpret_cast<bf16*>(smem_raw);
  bf16* k_tiles = q_tile + kRows * kStride;
  uint8_t* raws = reinterpret_cast<uint8_t*>(k_tiles + kTilePairs * 2 * BC * kStride);  // fp8 only: K, V per stage
  auto k_tile_of = [&](int stage) { return k_tiles + (kFp8 ? 0 : stage) * 2 * BC * kStride; };
  auto v_tile_of = [&](int stage) { return k_tile_of(stage) + BC * kStride; };
  auto k_raw_of = [&](int stage) { return raws + stage * 2 * BC * DMAX; };
  auto v_raw_of = [&](int stage) { return k_raw_of(stage) + BC * DMAX; };

  const int seq = blockIdx.y, kv_head = blockIdx.z;
  const int q_start = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - q_start;
  const int rows = q_len * group;  // packed (token, head) rows of this sequence and kv head
  // Heaviest tiles (last rows: the longest causal horizon) first, so that the grid's tail is short.
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  if (row0 >= rows) return;
  const int seq_len = p.seq_lens[seq];
  const int context = seq_len - q_len;  // keys before the first query token
  const int kv_end = context + (min(rows, row0 + kRows) - 1) / group + 1;  // causal horizon
  const int num_tiles = ceil_div(kv_end, BC);
  const int hq = p.num_q_heads, hk = p.num_kv_heads, d = p.head_dim, dv = p.v_head_dim, bs = p.block_size;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warp_row0 = warp * 16 * ATOMS;  // the warp's first row in the block

  const bf16* q = static_cast<const bf16*>(p.q);
  const C* k_cache = static_cast<const C*>(p.k_cache);
  const C* v_cache = static_cast<const C*>(p.v_cache);
  const PagedRows paged(p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq, bs);

  load_tile_async<DMAX, kRows>(q_tile, d, [&](int r) -> const bf16* {
    const int pr = row0 + r;
    if (pr >= rows) return nullptr;
    return q + (static_cast<int64_t>(q_start + pr / group) * hq + kv_head * group + pr % group) * d;
  }, q);
  // A K or V tile in flight: straight into its bf16 tile, or (fp8) into its staging buffer, which
  // the loop widens once the copies have arrived and every thread has passed a barrier. K and V
  // tiles share this thread's cache rows, which `locate` finds once a tile (an fp8 cache whose head
  // dim is not a multiple of 16 elements goes 8 bytes a copy, row by row).
  constexpr bool kChunkedRows = !kFp8 || FULL;
  constexpr int kRowsPerPass = kv_rows_per_pass<DMAX, C>();
  int cache_rows[BC / kRowsPerPass];
  auto locate = [&](int key0) {
    if constexpr (kChunkedRows) {
#pragma unroll
      for (int i = 0; i < BC / kRowsPerPass; ++i) {
        const int j = key0 + static_cast<int>(threadIdx.x) / kv_chunks_per_row<DMAX, C>() + i * kRowsPerPass;
        cache_rows[i] = j < kv_end ? static_cast<int>(paged.row(j)) * hk + kv_head : -1;
      }
    }
  };
  auto load_kv = [&](bf16* tile, uint8_t* raw, const C* cache, int dim, int key0) {
    if constexpr (kChunkedRows) {
      load_cache_tile_async<DMAX, BC>(kFp8 ? static_cast<void*>(raw) : static_cast<void*>(tile), dim, cache,
                                      cache_rows);
    } else {
      load_raw_tile_async<DMAX, BC>(raw, dim, [&](int r) -> const C* {
        const int j = key0 + r;
        if (j >= kv_end) return nullptr;
        return cache + (paged.row(j) * hk + kv_head) * dim;
      }, cache);
    }
  };
  locate(0);
  load_kv(k_tile_of(0), k_raw_of(0), k_cache, d, 0);
  load_kv(v_tile_of(0), v_raw_of(0), v_cache, dv, 0);
  cp_async_commit();  // group: Q, K(0), V(0)

  // This thread's rows: in atom a, rows lane/4 and lane/4 + 8 (mma C layout), and the position
  // each attends up to (-1: a padding row, attends nothing).
  int position[ATOMS][2];
#pragma unroll
  for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pr = row0 + warp_row0 + a * 16 + (lane >> 2) + 8 * h;
      position[a][h] = pr < rows ? context + pr / group : -1;
    }
  }
  float o[ATOMS][kOutChunks][4];
  float row_max[ATOMS][2], row_sum[ATOMS][2];
#pragma unroll
  for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
    for (int c = 0; c < kOutChunks; ++c) o[a][c][0] = o[a][c][1] = o[a][c][2] = o[a][c][3] = 0.0f;
    row_max[a][0] = row_max[a][1] = -INFINITY;
    row_sum[a][0] = row_sum[a][1] = 0.0f;
  }
  const float score_scale = p.scale * kLog2e;
  // ldmatrix addressing: lane l points at row (l & 7) of 8x8 matrix (l >> 3).
  const int mat = lane >> 3, mat_row = lane & 7;
  const int first_position = context + row0 / group;  // of the tile's first row: tiles of keys up
                                                      // to it are visible to every row, unmasked

  // S = Q K^T for the warp's rows x BC keys of `k_tile` (each K fragment serves every atom), the
  // causal mask, and the online softmax: s holds P (unnormalised, in the rows' running scale).
  // Element (c, 2h + e) is row h's key key0 + 8c + 2 (lane % 4) + e; the four lanes of a row (same
  // lane / 4) combine their maxima with two shuffles.
  float s[ATOMS][kScoreChunks][4];
  auto scores = [&](const bf16* k_tile, int key0) {
#pragma unroll
    for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
      for (int c = 0; c < kScoreChunks; ++c) s[a][c][0] = s[a][c][1] = s[a][c][2] = s[a][c][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < DMAX / 16; ++kk) {
      if (!FULL && kk * 16 >= d) break;
      uint32_t qa[ATOMS][4];  // A fragments: matrices (rows 0-7 | 8-15) x (dims 0-7 | 8-15)
#pragma unroll
      for (int a = 0; a < ATOMS; ++a) {
        ldmatrix_x4(qa[a], q_tile + (warp_row0 + a * 16 + (mat & 1) * 8 + mat_row) * kStride + kk * 16 + (mat >> 1) * 8);
      }
#pragma unroll
      for (int nn = 0; nn < BC / 16; ++nn) {
        uint32_t b[4];  // keys (0-7: b0 b1 | 8-15: b2 b3) x dims (0-7 | 8-15)
        ldmatrix_x4(b, k_tile + (nn * 16 + (mat >> 1) * 8 + mat_row) * kStride + kk * 16 + (mat & 1) * 8);
#pragma unroll
        for (int a = 0; a < ATOMS; ++a) {
          mma_bf16_16816(s[a][2 * nn], qa[a], b[0], b[1]);
          mma_bf16_16816(s[a][2 * nn + 1], qa[a], b[2], b[3]);
        }
      }
    }
    // Only the tiles that reach past the block's first position need the causal mask. Maxima are
    // then taken on the raw scores (the scale is positive) and the scale folds into the
    // exponent's FMA; row_max is kept scaled (log2 domain).
    if (key0 + BC - 1 > first_position) {
#pragma unroll
      for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int c = 0; c < kScoreChunks; ++c) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (key0 + c * 8 + (lane & 3) * 2 + e > position[a][h]) s[a][c][2 * h + e] = -INFINITY;
            }
          }
        }
      }
    }
    float alpha[ATOMS][2];
    bool rescale = false;
#pragma unroll
    for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float part_max[kScoreChunks];
#pragma unroll
        for (int c = 0; c < kScoreChunks; ++c) part_max[c] = fmaxf(s[a][c][2 * h], s[a][c][2 * h + 1]);
        float tile_max = tree_reduce<kScoreChunks>(part_max, [](float x, float y) { return fmaxf(x, y); });
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[a][h], tile_max * score_scale);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row with nothing visible yet
        alpha[a][h] = fast_exp2(row_max[a][h] - base);
        rescale |= new_max != row_max[a][h];
        row_max[a][h] = new_max;
        row_sum[a][h] *= alpha[a][h];  // this lane's share of the row sum; the shares are added at the end
        float part_sum[kScoreChunks];
#pragma unroll
        for (int c = 0; c < kScoreChunks; ++c) {
#pragma unroll
          for (int e = 0; e < 2; ++e) s[a][c][2 * h + e] = fast_exp2(fmaf(s[a][c][2 * h + e], score_scale, -base));
          part_sum[c] = s[a][c][2 * h] + s[a][c][2 * h + 1];
        }
        row_sum[a][h] += tree_reduce<kScoreChunks>(part_sum, [](float x, float y) { return x + y; });
      }
    }
    // Once the rows' maxima settle, most tiles raise none of a warp's 32: the output keeps its scale.
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
        for (int c = 0; c < kOutChunks; ++c) {
          o[a][c][0] *= alpha[a][0];
          o[a][c][1] *= alpha[a][0];
          o[a][c][2] *= alpha[a][1];
          o[a][c][3] *= alpha[a][1];
        }
      }
    }
  };
  // O += P V. The S accumulator layout of two adjacent 8-key chunks is exactly the A fragment
  // layout of one 16-key step, so P goes from registers to the tensor cores without shuffles;
  // each V fragment serves every atom.
  auto accumulate = [&](const bf16* v_tile) {
#pragma unroll
    for (int kc = 0; kc < BC / 16; ++kc) {
      uint32_t pa[ATOMS][4];
#pragma unroll
      for (int a = 0; a < ATOMS; ++a) {
        pa[a][0] = pack_bf16x2(s[a][2 * kc][0], s[a][2 * kc][1]);
        pa[a][1] = pack_bf16x2(s[a][2 * kc][2], s[a][2 * kc][3]);
        pa[a][2] = pack_bf16x2(s[a][2 * kc + 1][0], s[a][2 * kc + 1][1]);
        pa[a][3] = pack_bf16x2(s[a][2 * kc + 1][2], s[a][2 * kc + 1][3]);
      }
#pragma unroll
      for (int dn = 0; dn < DMAX / 16; ++dn) {
        if (!FULL && dn * 16 >= dv) break;
        uint32_t b[4];  // transposed: keys (0-7 | 8-15) x dims (0-7: b0 b1 | 8-15: b2 b3)
        ldmatrix_x4_trans(b, v_tile + (kc * 16 + (mat & 1) * 8 + mat_row) * kStride + dn * 16 + (mat >> 1) * 8);
#pragma unroll
        for (int a = 0; a < ATOMS; ++a) {
          mma_bf16_16816(o[a][2 * dn], pa[a], b[0], b[1]);
          mma_bf16_16816(o[a][2 * dn + 1], pa[a], b[2], b[3]);
        }
      }
    }
  };

  // Tile t + 1 is in flight during all of tile t's work: one barrier a tile (two for fp8, whose
  // staging buffers are widened between them).
  for (int t = 0; t < num_tiles; ++t) {
    const int key0 = t * BC, stage = t & 1;
    cp_async_wait<0>();  // tile t (and Q) landed
    __syncthreads();     // ... for every thread, and every warp is done with tile t - 1
    if (t + 1 < num_tiles) {
      locate(key0 + BC);
      load_kv(k_tile_of(stage ^ 1), k_raw_of(stage ^ 1), k_cache, d, key0 + BC);
      load_kv(v_tile_of(stage ^ 1), v_raw_of(stage ^ 1), v_cache, dv, key0 + BC);
    }
    cp_async_commit();
    if constexpr (kFp8) {
      widen_tile<DMAX, BC>(k_raw_of(stage), k_tile_of(0), p.k_scale);
      widen_tile<DMAX, BC>(v_raw_of(stage), v_tile_of(0), p.v_scale);
      __syncthreads();
    }
    scores(k_tile_of(stage), key0);
    accumulate(v_tile_of(stage));
  }

  // Normalise and store: row h of atom a of this lane, dims 8c + 2 (lane % 4) .. +1.
  bf16* out = static_cast<bf16*>(p.out);
#pragma unroll
  for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[a][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int pr = row0 + warp_row0 + a * 16 + (lane >> 2) + 8 * h;
      if (pr >= rows) continue;
      const float inv = 1.0f / sum;
      bf16* dst = out + (static_cast<int64_t>(q_start + pr / group) * hq + kv_head * group + pr % group) * dv;
#pragma unroll
      for (int c = 0; c < kOutChunks; ++c) {
        const int col = c * 8 + (lane & 3) * 2;
        if (col < dv) {
          *reinterpret_cast<__nv_bfloat162*>(dst + col) =
              __floats2bfloat162_rn(o[a][c][2 * h] * inv, o[a][c][2 * h + 1] * inv);
        }
      }
    }
  }
}

template <int DMAX, int BC, int ATOMS, bool FULL, class C>
cudaError_t launch_kernel(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr size_t kSmem = prefill_smem_bytes<DMAX, BC, ATOMS, C>();
  const auto kernel = prefill_attention_kernel<DMAX, BC, ATOMS, FULL, C>;
  // More than 48 KiB of dynamic shared memory needs an explicit opt-in, once per kernel and GPU.
  const cudaError_t opt_in =
      raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  if (opt_in != cudaSuccess) return opt_in;
  const int group = p.num_q_heads / p.num_kv_heads;
  const dim3 grid(ceil_div(p.max_query_len * group, rows_per_block<DMAX, BC, ATOMS>()), p.num_seqs, p.num_kv_heads);
  kernel<<<grid, kThreads, kSmem, stream>>>(p, group);
  return cudaGetLastError();
}

// FULL: both head dims equal DMAX, so the dimension loops have no exit test and the compiler may
// load the next fragments during the current MMAs (1.2x at 4096 tokens).
template <int DMAX, int BC, int ATOMS>
cudaError_t launch_typed(const PagedAttentionParams& p, cudaStream_t stream) {
  const bool full = p.head_dim == DMAX && p.v_head_dim == DMAX;
  if (p.cache_fp8) {
    return full ? launch_kernel<DMAX, BC, ATOMS, true, fp8>(p, stream)
                : launch_kernel<DMAX, BC, ATOMS, false, fp8>(p, stream);
  }
  return full ? launch_kernel<DMAX, BC, ATOMS, true, bf16>(p, stream)
              : launch_kernel<DMAX, BC, ATOMS, false, bf16>(p, stream);
}

}  // namespace

cudaError_t launch_prefill_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.max_query_len == 0) return cudaSuccess;
  const int dim = std::max(p.head_dim, p.v_head_dim);
  if (dim <= 32) return launch_typed<32, 64, 2>(p, stream);
  if (dim <= 64) return launch_typed<64, 64, 2>(p, stream);
  if (dim <= 128) return launch_typed<128, 64, 2>(p, stream);
  if (dim <= 256) return launch_typed<256, 32, 1>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace specula::cuda
