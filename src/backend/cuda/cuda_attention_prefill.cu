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
//  - K/V tiles are gathered from the paged cache row by row with cp.async (16-byte, L1 bypass),
//    K of the next tile in flight while P.V runs and V in flight while Q.K^T runs; rows past the
//    causal horizon are zero-filled so that padding never injects NaN into P.V. An fp8 cache's
//    tiles arrive the same way (half the bytes) in a staging buffer and are widened to bf16
//    (times the scale) in shared memory once they land, so the tensor cores run as for bf16 and
//    the loads stay asynchronous (plain loads that convert on the way cost 1.8x at 4096 tokens);
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
// Q, K and V tiles in bf16, and for an fp8 cache (kRawBytes) the K and V staging buffers.
template <int DMAX, int BC, int ATOMS, class C>
constexpr size_t prefill_smem_bytes() {
  constexpr size_t kRawBytes = sizeof(C) == 1 ? 2 * BC * DMAX : 0;
  return static_cast<size_t>(rows_per_block<DMAX, BC, ATOMS>() + 2 * BC) * (DMAX + 8) * sizeof(bf16) + kRawBytes;
}

// Copies a [ROWS, dim] tile into shared memory (row stride DMAX + 8); row r comes from `row_ptr(r)`
// or is zero-filled when it returns null; columns past `dim` are zero-filled.
template <int DMAX, int ROWS, class RowPtr>
__device__ __forceinline__ void load_tile_async(bf16* tile, int dim, RowPtr row_ptr, const bf16* any_valid) {
  constexpr int kChunksPerRow = DMAX / 8;
  for (int c = threadIdx.x; c < ROWS * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bf16* src = col < dim ? row_ptr(r) : nullptr;
    cp_async16(tile + r * (DMAX + 8) + col, src ? src + col : any_valid, src != nullptr);
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

// C: the cache's element type (bf16, or fp8 holding x / k_scale and x / v_scale).
template <int DMAX, int BC, int ATOMS, class C>
__global__ void __launch_bounds__(kThreads) prefill_attention_kernel(PagedAttentionParams p, int group) {
  constexpr int kRows = rows_per_block<DMAX, BC, ATOMS>();
  constexpr int kStride = DMAX + 8;  // shared-memory row stride, elements
  constexpr int kScoreChunks = BC / 8;
  constexpr int kOutChunks = DMAX / 8;
  extern __shared__ uint4 smem_raw[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem_raw);
  bf16* k_tile = q_tile + kRows * kStride;
  bf16* v_tile = k_tile + BC * kStride;
  constexpr bool kFp8 = std::is_same_v<C, fp8>;
  uint8_t* k_raw = reinterpret_cast<uint8_t*>(v_tile + BC * kStride);  // fp8 only
  uint8_t* v_raw = k_raw + BC * DMAX;

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
  // `landed` widens once the copies have arrived and every thread has passed a barrier.
  auto load_kv = [&](bf16* tile, uint8_t* raw, const C* cache, int dim, int key0) {
    auto row_ptr = [&](int r) -> const C* {
      const int j = key0 + r;
      if (j >= kv_end) return nullptr;
      return cache + (paged.row(j) * hk + kv_head) * dim;
    };
    if constexpr (kFp8) {
      load_raw_tile_async<DMAX, BC>(raw, dim, row_ptr, cache);
    } else {
      load_tile_async<DMAX, BC>(tile, dim, row_ptr, cache);
    }
  };
  auto landed = [&](const uint8_t* raw, bf16* tile, float scale) {
    if constexpr (kFp8) {
      widen_tile<DMAX, BC>(raw, tile, scale);
      __syncthreads();
    }
  };
  load_kv(k_tile, k_raw, k_cache, d, 0);
  cp_async_commit();  // group: Q + K(0)

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

  for (int t = 0; t < num_tiles; ++t) {
    const int key0 = t * BC;
    load_kv(v_tile, v_raw, v_cache, dv, key0);
    cp_async_commit();    // group: V(t)
    cp_async_wait<1>();   // Q and K(t) have landed
    __syncthreads();
    landed(k_raw, k_tile, p.k_scale);

    // S = Q K^T for the warp's rows x BC keys; each K fragment serves every atom.
    float s[ATOMS][kScoreChunks][4];
#pragma unroll
    for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
      for (int c = 0; c < kScoreChunks; ++c) s[a][c][0] = s[a][c][1] = s[a][c][2] = s[a][c][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < DMAX / 16; ++kk) {
      if (kk * 16 >= d) break;
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

    // Causal mask + online softmax. Element (c, 2h + e) is row h's key key0 + 8c + 2 (lane % 4) + e;
    // the four lanes of a row (same lane / 4) combine their maxima with two shuffles.
    const bool need_mask = key0 + BC - 1 > first_position;
#pragma unroll
    for (int a = 0; a < ATOMS; ++a) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int c = 0; c < kScoreChunks; ++c) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[a][c][2 * h + e];
            x *= score_scale;
            if (need_mask && key0 + c * 8 + (lane & 3) * 2 + e > position[a][h]) x = -INFINITY;
            tile_max = fmaxf(tile_max, x);
          }
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[a][h], tile_max);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row with nothing visible yet
        const float alpha = fast_exp2(row_max[a][h] - base);
        row_max[a][h] = new_max;
        row_sum[a][h] *= alpha;  // this lane's share of the row sum; the shares are added at the end
#pragma unroll
        for (int c = 0; c < kOutChunks; ++c) {
          o[a][c][2 * h] *= alpha;
          o[a][c][2 * h + 1] *= alpha;
        }
#pragma unroll
        for (int c = 0; c < kScoreChunks; ++c) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pr = fast_exp2(s[a][c][2 * h + e] - base);
            s[a][c][2 * h + e] = pr;
            row_sum[a][h] += pr;
          }
        }
      }
    }

    __syncthreads();  // every warp is done with k_tile
    if (t + 1 < num_tiles) load_kv(k_tile, k_raw, k_cache, d, key0 + BC);
    cp_async_commit();   // group: K(t+1) (possibly empty, to keep the group count uniform)
    cp_async_wait<1>();  // V(t) has landed
    __syncthreads();
    landed(v_raw, v_tile, p.v_scale);

    // O += P V. The S accumulator layout of two adjacent 8-key chunks is exactly the A fragment
    // layout of one 16-key step, so P goes from registers to the tensor cores without shuffles;
    // each V fragment serves every atom.
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
        if (dn * 16 >= dv) break;
        uint32_t b[4];  // transposed: keys (0-7 | 8-15) x dims (0-7: b0 b1 | 8-15: b2 b3)
        ldmatrix_x4_trans(b, v_tile + (kc * 16 + (mat & 1) * 8 + mat_row) * kStride + dn * 16 + (mat >> 1) * 8);
#pragma unroll
        for (int a = 0; a < ATOMS; ++a) {
          mma_bf16_16816(o[a][2 * dn], pa[a], b[0], b[1]);
          mma_bf16_16816(o[a][2 * dn + 1], pa[a], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with v_tile before V(t+1) overwrites it
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

template <int DMAX, int BC, int ATOMS, class C>
cudaError_t launch_cached(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr size_t kSmem = prefill_smem_bytes<DMAX, BC, ATOMS, C>();
  const auto kernel = prefill_attention_kernel<DMAX, BC, ATOMS, C>;
  // More than 48 KiB of dynamic shared memory needs an explicit opt-in, once per kernel and GPU.
  const cudaError_t opt_in =
      raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  if (opt_in != cudaSuccess) return opt_in;
  const int group = p.num_q_heads / p.num_kv_heads;
  const dim3 grid(ceil_div(p.max_query_len * group, rows_per_block<DMAX, BC, ATOMS>()), p.num_seqs, p.num_kv_heads);
  kernel<<<grid, kThreads, kSmem, stream>>>(p, group);
  return cudaGetLastError();
}

template <int DMAX, int BC, int ATOMS>
cudaError_t launch_typed(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.cache_fp8) return launch_cached<DMAX, BC, ATOMS, fp8>(p, stream);
  return launch_cached<DMAX, BC, ATOMS, bf16>(p, stream);
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
