// Fused MoE for large batches: permute the (token, column) pairs by expert, one tensor-core GEMM
// per expert over its rows (grouped: one launch for all experts), then the weighted un-permute.
//
//  1. sort (one block): histogram of the expert ids in shared memory, an exclusive scan into each
//     expert's first sorted row and first GEMM row tile, then a scatter that gives every pair its
//     sorted row. Everything stays on the device, so the host never learns the counts; the
//     scatter's order inside an expert depends on atomics, which is harmless: a GEMM row's result
//     does not depend on which other rows share its tile.
//  2. grouped GEMM, twice (gate|up = x . w13[e]^T, then expert_out = act . w2[e]^T, with the CUDA
//     silu_mul in between): the grid has one block per (row tile, 128 output columns) for an upper
//     bound of the row tiles that the host knows without the counts (ceil(pairs / 64) + experts);
//     a block finds its expert by binary search over the tile starts, and blocks past the last
//     tile exit at once. So the launch shape depends only on host-known sizes and the launch can
//     be captured into a CUDA graph. The first GEMM reads x through the sorted token index (no
//     gathered copy of x).
//  3. un-permute: out[t] = sum over the token's columns, in column order, of weight * its sorted
//     expert row, in fp32 (deterministic), rounded once.
//
// GEMM tile: 64 rows x 128 columns x 32 k per stage, 4 warps in 2 x 2, each 32 x 64 (two 16-row
// mma atoms sharing every B fragment); operands go global -> shared with cp.async (16 bytes,
// zero-filled past the edges), double-buffered so that the next stage loads while the tensor
// cores run; fragments come from shared memory with ldmatrix (rows padded by 16 bytes so the 8 row
// addresses of each ldmatrix phase hit distinct banks).
#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kSortThreads = 1024;
constexpr int kBM = 64, kBN = 128, kBK = 32;
constexpr int kGemmThreads = 128;
constexpr int kTileStride = kBK + 8;  // shared-memory row stride (elements): 80 bytes

__global__ void __launch_bounds__(kSortThreads) moe_sort_kernel(const int32_t* __restrict__ ids, int64_t pairs,
                                                                 int columns, int experts, GroupedMoeScratch s) {
  extern __shared__ int32_t counters[];  // [experts] counts, then [experts] scatter cursors
  int32_t* count = counters;
  int32_t* cursor = counters + experts;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // experts is at most a few hundred: a serial scan is microseconds
    int32_t rows = 0, tiles = 0;
    for (int e = 0; e < experts; ++e) {
      s.offsets[e] = rows;
      s.tile_starts[e] = tiles;
      cursor[e] = rows;
      rows += count[e];
      tiles += (count[e] + kBM - 1) / kBM;
    }
    s.offsets[experts] = rows;
    s.tile_starts[experts] = tiles;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < experts) {
      const int32_t row = atomicAdd(&cursor[e], 1);
      s.sorted_token[row] = static_cast<int32_t>(p / columns);
      s.pair_row[p] = row;
    } else {
      s.pair_row[p] = -1;
    }
  }
}

struct GroupedGemm {
  const bf16* a;             // A rows: a + row * k, row = a_rows[sorted row] (or the sorted row)
  const int32_t* a_rows;     // may be null
  const bf16* w;             // [experts, n, k]
  bf16* y;                   // [sorted rows, n]
  const int32_t* offsets;    // [experts + 1]
  const int32_t* tile_starts;  // [experts + 1]
  int experts, n, k;
};

// y[r, :] = a_row(r) . w[e]^T for the sorted rows r of expert e; fp32 accumulation, bf16 output.
__global__ void __launch_bounds__(kGemmThreads) grouped_gemm_kernel(GroupedGemm g) {
  __shared__ __align__(16) bf16 a_tile[2][kBM][kTileStride];
  __shared__ __align__(16) bf16 b_tile[2][kBN][kTileStride];

  const int tile = blockIdx.x;
  if (tile >= g.tile_starts[g.experts]) return;  // past the last row tile (the grid is an upper bound)
  // The expert owning this tile: the last e with tile_starts[e] <= tile (empty experts share their
  // start with the next one, and the search passes over them).
  int lo = 0, hi = g.experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (g.tile_starts[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int e = lo;
  const int row_begin = g.offsets[e] + (tile - g.tile_starts[e]) * kBM;
  const int rows = min(kBM, g.offsets[e + 1] - row_begin);
  const int n0 = blockIdx.y * kBN;
  const bf16* w = g.w + static_cast<int64_t>(e) * g.n * g.k;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Each thread copies fixed 16-byte chunks of every stage: A rows tid / 4 and tid / 4 + 32, B rows
  // tid / 4 + 32 i (i < 4), all at column (tid % 4) * 8 of the stage's k range.
  const int chunk_row = tid / 4, chunk_col = (tid % 4) * 8;
  const bf16* a_src[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = chunk_row + 32 * i;
    if (r < rows) {
      const int sorted = row_begin + r;
      const int64_t src_row = g.a_rows != nullptr ? g.a_rows[sorted] : sorted;
      a_src[i] = g.a + src_row * g.k;
    } else {
      a_src[i] = nullptr;
    }
  }
  auto load_stage = [&](int stage, int k0) {
    const int kc = k0 + chunk_col;  // k % 8 == 0: a chunk is either wholly inside k or wholly past it
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool ok = a_src[i] != nullptr && kc < g.k;
      cp_async16(&a_tile[stage][chunk_row + 32 * i][chunk_col], ok ? a_src[i] + kc : g.a, ok);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = n0 + chunk_row + 32 * i;
      const bool ok = n < g.n && kc < g.k;
      cp_async16(&b_tile[stage][chunk_row + 32 * i][chunk_col], ok ? w + static_cast<int64_t>(n) * g.k + kc : g.w, ok);
    }
  };

  const int wm = warp / 2, wn = warp % 2;  // the warp's 32 rows and 64 columns of the block tile
  const int mat = lane >> 3, mat_row = lane & 7;  // ldmatrix: lane l addresses row (l & 7) of matrix (l >> 3)
  float acc[2][8][4];
#pragma unroll
  for (int a = 0; a < 2; ++a) {
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[a][c][0] = acc[a][c][1] = acc[a][c][2] = acc[a][c][3] = 0.0f;
  }

  const int k_tiles = ceil_div(g.k, kBK);
  load_stage(0, 0);
  cp_async_commit();
  for (int kt = 0; kt < k_tiles; ++kt) {
    // The other stage was last read in iteration kt - 1, which ended with a barrier.
    if (kt + 1 < k_tiles) load_stage((kt + 1) & 1, (kt + 1) * kBK);
    cp_async_commit();   // (possibly empty, to keep the group count uniform)
    cp_async_wait<1>();  // stage kt has landed
    __syncthreads();
    const int s = kt & 1;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4];  // A fragments: (rows 0-7 | 8-15) x (k 0-7 | 8-15)
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        ldmatrix_x4(af[a], &a_tile[s][wm * 32 + a * 16 + (mat & 1) * 8 + mat_row][kk * 16 + (mat >> 1) * 8]);
      }
#pragma unroll
      for (int nb = 0; nb < 4; ++nb) {
        uint32_t b[4];  // columns (0-7: b0 b1 | 8-15: b2 b3) x k (0-7 | 8-15)
        ldmatrix_x4(b, &b_tile[s][wn * 64 + nb * 16 + (mat >> 1) * 8 + mat_row][kk * 16 + (mat & 1) * 8]);
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          mma_bf16_16816(acc[a][2 * nb], af[a], b[0], b[1]);
          mma_bf16_16816(acc[a][2 * nb + 1], af[a], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with stage s before iteration kt + 1 refills it
  }

  // Accumulator element (c, 2h + e) of atom a: row wm*32 + 16a + lane/4 + 8h, column wn*64 + 8c +
  // 2 (lane % 4) + e. n is even, so a column pair is wholly inside or outside.
#pragma unroll
  for (int a = 0; a < 2; ++a) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * 32 + a * 16 + (lane >> 2) + 8 * h;
      if (r >= rows) continue;
      bf16* dst = g.y + static_cast<int64_t>(row_begin + r) * g.n;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int col = n0 + wn * 64 + c * 8 + (lane & 3) * 2;
        if (col < g.n) {
          *reinterpret_cast<__nv_bfloat162*>(dst + col) = __floats2bfloat162_rn(acc[a][c][2 * h], acc[a][c][2 * h + 1]);
        }
      }
    }
  }
}

// out[t, n] = sum_c weights[t, c] * expert_out[pair_row[t, c], n], in column order; grid (tokens).
__global__ void moe_unpermute_kernel(const bf16* __restrict__ expert_out, const int32_t* __restrict__ pair_row,
                                     const float* __restrict__ weights, int columns, int hidden, bf16* __restrict__ out) {
  const int64_t token = blockIdx.x;
  for (int n = threadIdx.x; n < hidden; n += blockDim.x) {
    float acc = 0.0f;
    for (int c = 0; c < columns; ++c) {
      const int32_t row = pair_row[token * columns + c];
      if (row < 0) continue;  // an id outside [0, E): contributes nothing
      acc += weights[token * columns + c] * __bfloat162float(expert_out[static_cast<int64_t>(row) * hidden + n]);
    }
    out[token * hidden + n] = __float2bfloat16_rn(acc);
  }
}

cudaError_t launch_gemm(const GroupedGemm& g, int64_t pairs, cudaStream_t stream) {
  const int64_t max_tiles = (pairs + kBM - 1) / kBM + g.experts;  // >= sum_e ceil(count_e / kBM)
  const int n_tiles = ceil_div(g.n, kBN);
  if (max_tiles > 0x7fffffff || n_tiles > 65535) return cudaErrorInvalidValue;
  grouped_gemm_kernel<<<dim3(static_cast<unsigned>(max_tiles), n_tiles), kGemmThreads, 0, stream>>>(g);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fused_moe_grouped(const FusedMoeParams& p, const GroupedMoeScratch& s, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  const int64_t pairs = p.tokens * p.columns;
  if (p.columns < 1 || p.inter < 1 || p.hidden < 1 || p.hidden % 8 != 0 || p.inter % 8 != 0 || p.experts < 1 ||
      p.experts > kMaxGroupedExperts || pairs > 0x7fffffff || p.tokens > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  const size_t sort_smem = 2 * static_cast<size_t>(p.experts) * sizeof(int32_t);  // <= 32 KiB
  moe_sort_kernel<<<1, kSortThreads, sort_smem, stream>>>(p.ids, pairs, p.columns, p.experts, s);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  GroupedGemm up{static_cast<const bf16*>(p.x), s.sorted_token, static_cast<const bf16*>(p.w13),
                 static_cast<bf16*>(s.gate_up), s.offsets, s.tile_starts, p.experts, 2 * p.inter, p.hidden};
  if ((err = launch_gemm(up, pairs, stream)) != cudaSuccess) return err;
  // Rows past the sorted count (pairs with an invalid id) hold garbage that nothing reads.
  if ((err = launch_silu_mul(s.gate_up, s.act, pairs, p.inter, DType::kBF16, stream)) != cudaSuccess) return err;
  GroupedGemm down{static_cast<const bf16*>(s.act), nullptr, static_cast<const bf16*>(p.w2),
                   static_cast<bf16*>(s.expert_out), s.offsets, s.tile_starts, p.experts, p.hidden, p.inter};
  if ((err = launch_gemm(down, pairs, stream)) != cudaSuccess) return err;
  const int threads = p.hidden >= 256 ? 256 : ceil_div(p.hidden, 32) * 32;
  moe_unpermute_kernel<<<static_cast<unsigned>(p.tokens), threads, 0, stream>>>(
      static_cast<const bf16*>(s.expert_out), s.pair_row, p.weights, p.columns, p.hidden, static_cast<bf16*>(p.out));
  return cudaGetLastError();
}

}  // namespace specula::cuda
