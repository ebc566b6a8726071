// Linear layers of a few rows on the tensor cores: speculative verification (k + 1 rows) and small
// decode batches, 3 to 16 rows, bf16 weights, with the decoder's neighbours folded in as the GEMV
// folds them (GemvArgs: the RMSNorm before, the residual add or SwiGLU after).
//
// Why: the GEMV (cuda_gemv.cu) reads each weight once but multiplies it on the CUDA cores, and
// every 16-byte weight chunk needs the matching 8 activations of every row: past ~4 rows the
// activation loads from L1 / shared memory, not HBM, bound it, so verification steps used to take
// cuBLAS with separate kernels for the norm and the SwiGLU: 9 kernels a layer where a decode row
// takes 5. Here a warp owns 16 weight rows as the A operand of mma.sync m16n8k16 and the rows of
// x as B (8 a tile, two tiles up to 16 rows), so a warp loads each activation once per 16 weight
// rows. A block's tiles stream back to back: the next tile's first weights are requested before
// the current tile's partial sums are added; a pass's activations are all requested before its
// first product.
//
// Loads: lane l (g = l / 4, q = l % 4) reads 16 contiguous bytes of weight rows g and g + 8 at
// k-step offset 8 q (so a warp instruction covers 8 rows x 64 contiguous bytes), and the same 8
// elements of x row g. The mma's k order is a permutation of memory order, the same for A and B
// (elements 8q .. 8q+3 are the first mma's k 2q, 2q+1, 2q+8, 2q+9; 8q+4 .. 8q+7 the second's), so
// the dot products are the same sums without any shuffle or ldmatrix. The four warps of a block
// split K (k-steps w, w + 4, ...) and add their partial tiles in shared memory in a fixed order:
// a row's sum has one order whatever the number of rows. Weight loads bypass L1 and go out before
// the wait for the previous kernel; the staged norm (each block writes rms_norm(x) for all rows
// into shared memory, rows padded by 64 bytes so that the 8 rows a quarter-warp reads fall in
// different banks) runs while they are in flight.
#include <algorithm>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = 16;  // weight rows a warp's mma covers
constexpr int kStepK = 32;     // K a warp's k-step covers: 8 elements a lane
constexpr int64_t kMaxStagedBytes = 96 << 10;
// Weights small enough that a launch's latency, not its bytes, is its cost: the next kernel may
// start at once (as the GEMV decides).
constexpr int64_t kStartNextEarlyBytes = 12 << 20;

template <class Out>
__device__ __forceinline__ void write_out(const GemvArgs& a, int64_t i, float v) {
  Out* out = static_cast<Out*>(a.out) + i;
  if (a.epilogue == GemvEpilogue::kAccumulate) {
    *out = from_float<Out>(to_float(*out) + to_float(from_float<Out>(v)));
  } else {
    *out = from_float<Out>(v);
  }
}

__device__ __forceinline__ float bias_of(const GemvArgs& a, int64_t row) {
  if (a.bias == nullptr) return 0.0f;
  return a.bias_dtype == DType::kF32 ? static_cast<const float*>(a.bias)[row]
                                     : to_float(static_cast<const bf16*>(a.bias)[row]);
}

// rms_norm(x) of rows 0..m-1 into `staged` (row stride `ld` elements), as rms_norm stores it: a
// warp a row, the raw row kept in shared memory between the sum of squares and the scaling (each
// lane rereads only what it wrote).
__device__ void stage_norm_rows(const GemvArgs& a, bf16* staged, int64_t ld) {
  const auto* x = static_cast<const bf16*>(a.x);
  const auto* gamma = static_cast<const bf16*>(a.norm_weight);
  const int m = static_cast<int>(a.m), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunks = a.k / 8;
  for (int r = warp; r < m; r += kWarps) {
    const bf16* xr = x + r * a.k;
    bf16* sr = staged + r * ld;
    float sum_sq = 0.0f;
    for (int64_t c = lane; c < chunks; c += 32) {
      const uint4 v = *reinterpret_cast<const uint4*>(xr + c * 8);
      *reinterpret_cast<uint4*>(sr + c * 8) = v;
      float f[8];
      unpack8(v, f);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum_sq += f[i] * f[i];
    }
    const float inv = rsqrtf(warp_sum(sum_sq) / static_cast<float>(a.k) + a.eps);
    for (int64_t c = lane; c < chunks; c += 32) {
      float v[8], g[8];
      unpack8(*reinterpret_cast<const uint4*>(sr + c * 8), v);
      unpack8(*reinterpret_cast<const uint4*>(gamma + c * 8), g);
      uint32_t packed[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        packed[i] = pack_bf16x2(g[2 * i] * (v[2 * i] * inv), g[2 * i + 1] * (v[2 * i + 1] * inv));
      *reinterpret_cast<uint4*>(sr + c * 8) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
}

// A warp's weight registers: U k-steps of its rows g and g + 8.
template <int U>
struct WeightPass {
  uint4 a[U], b[U];
};

// Requests the k-steps s0, s0 + 4, ... (U of them) of weight rows row_a and row_b (zeros past K).
template <int U>
__device__ __forceinline__ void load_pass(WeightPass<U>& w, const bf16* row_a, const bf16* row_b, int64_t s0,
                                          int64_t k) {
  const int q = threadIdx.x % 4;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t off = (s0 + static_cast<int64_t>(kWarps) * u) * kStepK + 8 * q;
    w.a[u] = off < k ? load_streaming(row_a + off) : make_uint4(0, 0, 0, 0);
    w.b[u] = off < k ? load_streaming(row_b + off) : make_uint4(0, 0, 0, 0);
  }
}

// The block's sums of one tile: each warp's passes over its k-steps (the first pass's weights
// already requested), then the four warps' partial tiles added in warp order. Warp 0 returns them
// in acc: acc[t][j] is (weight row g, x row 8t + 2q + j), acc[t][2 + j] (row g + 8, the same x
// row). next_a / next_b: the next tile's rows of this lane (or null), whose first pass is
// requested before the adds, so that a block's tiles stream back to back.
template <int NT, int U>
__device__ void tile_sums(int64_t k, WeightPass<U>& w, const bf16* row_a, const bf16* row_b, const bf16* next_a,
                          const bf16* next_b, const bf16* const (&x_rows)[NT], float (&acc)[NT][4],
                          float (&partial)[kWarps][NT][4][32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = lane % 4;
  const int64_t steps = (k + kStepK - 1) / kStepK, pass_steps = static_cast<int64_t>(kWarps) * U;
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;
  for (int64_t s0 = warp; s0 < steps; s0 += pass_steps) {
    if (s0 != warp) load_pass(w, row_a, row_b, s0, k);
    // The pass's activations, all requested before the first product (a k-step past the end
    // reads zeros and adds nothing): loaded one step at a time, each would be a dependent round
    // trip to L2.
    uint4 xv[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t off = (s0 + static_cast<int64_t>(kWarps) * u) * kStepK + 8 * q;
#pragma unroll
      for (int t = 0; t < NT; ++t)
        xv[u][t] = off < k ? *reinterpret_cast<const uint4*>(x_rows[t] + off) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t a0[4] = {w.a[u].x, w.b[u].x, w.a[u].y, w.b[u].y};
      const uint32_t a1[4] = {w.a[u].z, w.b[u].z, w.a[u].w, w.b[u].w};
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        mma_bf16_16816(acc[t], a0, xv[u][t].x, xv[u][t].y);
        mma_bf16_16816(acc[t], a1, xv[u][t].z, xv[u][t].w);
      }
    }
  }
  if (next_a != nullptr) load_pass(w, next_a, next_b, warp, k);
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][t][i][lane] = acc[t][i];
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sum = partial[0][t][i][lane];
#pragma unroll
        for (int v = 1; v < kWarps; ++v) sum += partial[v][t][i][lane];
        acc[t][i] = sum;
      }
  }
}

// x's rows as the block reads them: rms_norm(x) staged in shared memory (STAGED), or x itself.
// Returns this lane's row in each tile (rows past m repeat the last).
template <int NT, bool STAGED>
__device__ void input_rows(const GemvArgs& a, uint4* staged_raw, int64_t ld, const bf16* (&x_rows)[NT]) {
  const bf16* xs = static_cast<const bf16*>(a.x);
  int64_t x_ld = a.k;
  if constexpr (STAGED) {
    auto* staged = reinterpret_cast<bf16*>(staged_raw);
    stage_norm_rows(a, staged, ld);
    __syncthreads();
    xs = staged;
    x_ld = ld;
  }
  const int g = threadIdx.x % 32 / 4, m = static_cast<int>(a.m);
#pragma unroll
  for (int t = 0; t < NT; ++t) x_rows[t] = xs + min(8 * t + g, m - 1) * x_ld;
}

// NT: tiles of 8 x rows (m <= 8 NT); U: k-steps a lane keeps in flight; STAGED: the norm before;
// GATED: SwiGLU after (a tile's rows 0..7 are gate rows of 8 output columns, 8..15 the up rows
// of the same columns, so one lane holds both halves of its outputs).
template <int NT, int U, class Out, bool STAGED, bool GATED>
__global__ void __launch_bounds__(kThreads) gemv_mma_kernel(const GemvArgs a, int64_t ld, bool start_next_early) {
  extern __shared__ uint4 staged_raw[];
  __shared__ float partial[kWarps][NT][4][32];
  const int m = static_cast<int>(a.m);
  const int64_t n = a.n, k = a.k, half_n = n / 2;
  const int64_t tiles = GATED ? (half_n + 7) / 8 : (n + kTileRows - 1) / kTileRows;
  const auto* w = static_cast<const bf16*>(a.w);
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;

  // This lane's weight row of tile `tile`: h = 0 row g, h = 1 row g + 8 (clamped: rows past the
  // end compute and store nothing).
  auto weight_row = [&](int64_t tile, int h) -> const bf16* {
    if constexpr (GATED) {
      return w + ((h == 0 ? 0 : half_n) + min(tile * 8 + g, half_n - 1)) * k;
    } else {
      return w + min(tile * kTileRows + g + 8 * h, n - 1) * k;
    }
  };

  WeightPass<U> wp;
  load_pass(wp, weight_row(blockIdx.x, 0), weight_row(blockIdx.x, 1), threadIdx.x / 32, k);
  if (start_next_early) allow_next_kernel_start();
  wait_for_previous_kernels();
  const bf16* x_rows[NT];
  input_rows<NT, STAGED>(a, staged_raw, ld, x_rows);

  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const bool last = tile + gridDim.x >= tiles;
    float acc[NT][4];
    tile_sums<NT, U>(k, wp, weight_row(tile, 0), weight_row(tile, 1), last ? nullptr : weight_row(tile + gridDim.x, 0),
                     last ? nullptr : weight_row(tile + gridDim.x, 1), x_rows, acc, partial);
    if (!start_next_early && last) allow_next_kernel_start();  // the block's last tile
    if (threadIdx.x < 32) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int mi = 8 * t + 2 * q + j;
          if (mi >= m) continue;
          if constexpr (GATED) {
            const int64_t col = tile * 8 + g;
            if (col < half_n) {
              const float gate = to_float(from_float<Out>(acc[t][j] + bias_of(a, col)));
              const float up = to_float(from_float<Out>(acc[t][2 + j] + bias_of(a, half_n + col)));
              static_cast<Out*>(a.out)[mi * half_n + col] = from_float<Out>(silu(gate) * up);
            }
          } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int64_t row = tile * kTileRows + g + 8 * h;
              if (row < n) write_out<Out>(a, mi * n + row, acc[t][2 * h + j] + bias_of(a, row));
            }
          }
        }
      }
    }
    __syncthreads();  // the next tile writes `partial` again
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Staged rows: 64 bytes past a multiple of 128, so that rows g and g + 1 of a quarter-warp's
// 16-byte reads fall in different halves of the banks.
int64_t staged_row_elements(int64_t k) { return (k * 2 + 127) / 128 * 64 + 32; }

int64_t staged_bytes(const GemvArgs& a) {
  return a.norm_weight == nullptr ? 0 : a.m * staged_row_elements(a.k) * static_cast<int64_t>(sizeof(bf16));
}

template <int NT, int U, class Out, bool STAGED, bool GATED>
cudaError_t launch_typed(const GemvArgs& a, cudaStream_t stream) {
  const auto kernel = gemv_mma_kernel<NT, U, Out, STAGED, GATED>;
  const int64_t tiles = GATED ? (a.n / 2 + 7) / 8 : (a.n + kTileRows - 1) / kTileRows;
  const int smem = static_cast<int>(staged_bytes(a));
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  // As many blocks as are resident at once, each looping over tiles: a staged norm is computed
  // once a block, not once a tile.
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  if (e != cudaSuccess) return e;
  const int64_t grid = std::min<int64_t>(tiles, static_cast<int64_t>(std::max(per_sm, 1)) * sms);
  const bool start_next_early = a.n * a.k * static_cast<int64_t>(sizeof(bf16)) <= kStartNextEarlyBytes;
  return launch_overlapped(kernel, {dim3(static_cast<unsigned>(grid)), dim3(kThreads), static_cast<size_t>(smem)},
                           stream, a, staged_row_elements(a.k), start_next_early);
}

template <int NT, class Out, bool STAGED, bool GATED>
cudaError_t launch_unroll(const GemvArgs& a, cudaStream_t stream) {
  // A warp's k-steps (the embedded model's K = 256: 2, its down projection's 704: 6, Llama-3.1-8B's
  // 4096: 32): up to 8 in one pass of loads, one memory round trip; more in passes of 8.
  const int64_t steps_per_warp = (a.k + kStepK * kWarps - 1) / (kStepK * kWarps);
  if (steps_per_warp > 4) return launch_typed<NT, 8, Out, STAGED, GATED>(a, stream);
  return launch_typed<NT, 4, Out, STAGED, GATED>(a, stream);
}

template <class Out, bool STAGED, bool GATED>
cudaError_t launch_tiles(const GemvArgs& a, cudaStream_t stream) {
  return a.m <= 8 ? launch_unroll<1, Out, STAGED, GATED>(a, stream) : launch_unroll<2, Out, STAGED, GATED>(a, stream);
}

template <class Out>
cudaError_t launch_epilogue(const GemvArgs& a, cudaStream_t stream) {
  const bool staged = a.norm_weight != nullptr, gated = a.epilogue == GemvEpilogue::kSiluMul;
  if (gated) return staged ? launch_tiles<Out, true, true>(a, stream) : launch_tiles<Out, false, true>(a, stream);
  return staged ? launch_tiles<Out, true, false>(a, stream) : launch_tiles<Out, false, false>(a, stream);
}

}  // namespace

bool gemv_mma_supports(const GemvArgs& a) {
  if (a.w_dtype != DType::kBF16 || a.scale != nullptr) return false;
  if (a.out_dtype != DType::kBF16 && a.out_dtype != DType::kF32) return false;
  if (a.m < 1 || a.m > kGemvMmaMaxRows || a.k % 8 != 0 || a.n < 1) return false;
  if (!aligned16(a.x) || !aligned16(a.w)) return false;
  if (a.epilogue == GemvEpilogue::kSiluMul && a.n % 2 != 0) return false;
  return a.norm_weight == nullptr || (aligned16(a.norm_weight) && staged_bytes(a) <= kMaxStagedBytes);
}

cudaError_t launch_gemv_mma(const GemvArgs& a, cudaStream_t stream) {
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  if (!gemv_mma_supports(a)) return cudaErrorInvalidValue;
  return a.out_dtype == DType::kF32 ? launch_epilogue<float>(a, stream) : launch_epilogue<bf16>(a, stream);
}

}  // namespace specula::cuda
