// Decode attention on the tensor cores, for batches with (sequence, kv head) pairs for at least
// half the SMs (batch 16 and more of an 8-kv-head model): one block a pair, no split of the keys
// across blocks. A bf16 or an fp8 cache (the products then in f16: the kernel's comment).
//
// Why this shape: at batch 64 x ~256 keys the CUDA-core kernel (cuda_attention_decode.cu) spent
// as long on its per-row shuffles and multiply-adds as on its loads, and loaded each tile's K and
// V in two register round trips with barriers between, so HBM idled while it computed (~45 % of
// copy bandwidth). Here:
//  - the block's (query row, query head) entries of its kv head, up to 16, are the rows of one
//    mma.sync m16n8k16 tile (bf16 in, fp32 accumulate): Q K^T and P V of 16 keys are 32 tensor-
//    core ops a warp instead of ~2,000 shuffles and multiply-adds; the rows past the entries are
//    padding that costs the tensor cores nothing they were needed for;
//  - each of the 4 warps owns every 4th chunk of 16 keys and runs its own pipeline: cp.async
//    brings the chunk's K and V rows (16 bytes a lane, L1 bypassed) into the warp's shared-memory
//    stages while it computes an earlier chunk, so only warp barriers sit in the loop and every
//    warp keeps two chunks' loads in flight (~17 KB at head dim 128) all the time;
//  - a warp keeps its own running max / sum (online softmax in registers, fp32, log2 domain) and
//    output; the block merges its 4 warps through shared memory at the end, which the stages no
//    longer need. P is rounded to bf16 for P V (as the prefill kernel does);
//  - keys past the sequence's end are zero-filled, never read, so padding never injects NaN;
//  - shared rows are padded by 16 bytes so that the 8 row addresses of every ldmatrix phase fall
//    in distinct banks.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_kernel_attributes.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_element.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;    // keys a warp takes at a time: one k-step of P V
constexpr int kMaxRows = 16;  // entries a block: one mma row tile
constexpr float kLog2e = 1.4426950408889634f;

// C: the cache's element type. Stages a warp keeps: S - 1 chunks in flight while it computes
// one. bf16: 3 (two blocks an SM, 104 KB each at head dim 128; H200, Llama-3.1-8B heads, batch
// 64: 25.3 / 75.1 / 274 us at 256 / 1024 / 4096 keys against 27.4 / 83.7 / 320 us with two
// stages and three blocks an SM); fp8 chunks are half the bytes: 4 stages, three blocks an SM,
// or, where the batch has pairs for more than three blocks an SM, 3 stages and four blocks
// (at most 128 registers a thread), all of batch 64's 512 blocks in one wave: 13.7 / 44.0 /
// 152 us against 19.2 / 55.9 / 195 (batch 32: 11.3 / 33.2 / 112 against 10.5 / 28.9 / 93.5).
template <class C>
struct MmaCache {
  static constexpr bool kFp8 = sizeof(C) == 1;
  static constexpr int kStages = kFp8 ? 4 : 3;
  static constexpr int kPad = 16 / sizeof(C);  // 16 bytes a row: conflict-free ldmatrix
};
template <int D, class C>
constexpr int row_stride() {
  return D + MmaCache<C>::kPad;  // elements
}
// A warp's stage: the chunk's K rows, then its V rows.
template <int D, class C>
constexpr int stage_elems() {
  return 2 * kChunk * row_stride<D, C>();
}
template <int D, class C, int S>
constexpr size_t shared_bytes() {
  return size_t{kWarps} * S * stage_elems<D, C>() * sizeof(C);
}
// The merge at the end reuses the stages: every warp's outputs, maxima and sums of 16 rows.
template <int D>
constexpr size_t merge_bytes() {
  return size_t{kWarps} * kMaxRows * (D + 2) * sizeof(float);
}

__device__ __forceinline__ uint32_t load_bf16x2(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The low (high) two e4m3 values of a word -> f16x2, exact: one cvt.rn.f16x2.e4m3x2 on a half of
// the register, without unpacking and repacking it.
__device__ __forceinline__ uint32_t e4m3x2_lo_to_f16x2(uint32_t four) {
  uint32_t r;
  asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;}" : "=r"(r) : "r"(four));
  return r;
}
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t four) {
  uint32_t r;
  asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;}" : "=r"(r) : "r"(four));
  return r;
}

// D: head dim (K and V); C: the cache's element type. grid: x = kv head, y = sequence.
//
// An fp8 cache (x / k_scale, x / v_scale) runs the products in f16, which holds every e4m3 value
// exactly, straight from the fp8 chunk in shared memory, converted in registers:
//  - K: ldmatrix reads each key's bytes as b16 pairs, so a lane gets 4 consecutive dims 4t..4t+3
//    (t = lane % 4) where the fragment wants k = 2t, 2t+1, 2t+8, 2t+9: Q's fragments are loaded
//    in that same order, and a dot product does not depend on the order of its terms;
//  - V: ldmatrix.trans gives a lane keys 2t, 2t+1 of dims 2j, 2j+1 (j = lane / 4); a byte permute
//    pairs the keys of one dim, so each 16-dim group is two n-tiles, of its even and its odd dims,
//    which the output store puts back in place;
//  - Q takes scale * log2(e) * k_scale before its conversion to f16 (saturating), V's scale is
//    applied to the output once.
template <int D, class C, int S, int MIN_BLOCKS>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) decode_attention_mma_kernel(PagedAttentionParams p, int group) {
  static_assert(merge_bytes<D>() <= shared_bytes<D, C, S>(), "the merge must fit the stages it reuses");
  static_assert(D % 32 == 0, "fp8 fragments come 32 dims at a time");
  constexpr bool kFp8 = MmaCache<C>::kFp8;
  constexpr int kStride = row_stride<D, C>();
  constexpr int kPieces = D * sizeof(C) / 16;  // 16-byte pieces of a row
  constexpr int kPieceElems = 16 / sizeof(C);
  extern __shared__ uint4 smem_raw[];
  allow_next_kernel_start();
  wait_for_previous_kernels();  // q and this step's K/V come from the previous kernels

  const int kv_head = blockIdx.x, seq = blockIdx.y;
  const int row0 = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - row0;
  const int entries = q_len * group;
  if (entries == 0) return;
  const int seq_len = p.seq_lens[seq];
  const int context = seq_len - q_len;  // keys before the first query row; the last row sees all
  const int hq = p.num_q_heads, hk = p.num_kv_heads;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  auto row_head = [&](int g) {  // entry g -> its (query row, query head) index into q / out
    return static_cast<int64_t>(row0 + g / group) * hq + kv_head * group + g % group;
  };

  // This lane's rows of the mma tiles (lane / 4 and lane / 4 + 8), their causal limits (-1:
  // padding, sees nothing) and their Q fragments for every 16-dim k-step.
  const int r_lo = lane >> 2, r_hi = r_lo + 8, quad = lane & 3;
  const int limit_lo = r_lo < entries ? context + r_lo / group : -1;
  const int limit_hi = r_hi < entries ? context + r_hi / group : -1;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* q_rows[2] = {q + (r_lo < entries ? row_head(r_lo) : 0) * D, q + (r_hi < entries ? row_head(r_hi) : 0) * D};
  const bool q_valid[2] = {r_lo < entries, r_hi < entries};
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kFp8) {  // dims 16 kk + 4t .. +3: fragment k = 2t, 2t+1 | 2t+8, 2t+9
        const float q_scale = p.scale * kLog2e * p.k_scale;
        float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (q_valid[h]) {
          const uint2 raw = *reinterpret_cast<const uint2*>(q_rows[h] + kk * 16 + 4 * quad);
          const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
          const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
          f[0] = lo.x * q_scale, f[1] = lo.y * q_scale, f[2] = hi.x * q_scale, f[3] = hi.y * q_scale;
        }
        qa[kk][h] = pack_f16x2(f[0], f[1]);
        qa[kk][2 + h] = pack_f16x2(f[2], f[3]);
      } else {  // dims 16 kk + 2t, 2t+1 | 2t+8, 2t+9
        qa[kk][h] = q_valid[h] ? load_bf16x2(q_rows[h] + kk * 16 + 2 * quad) : 0u;
        qa[kk][2 + h] = q_valid[h] ? load_bf16x2(q_rows[h] + kk * 16 + 2 * quad + 8) : 0u;
      }
    }
  }

  C* stages = reinterpret_cast<C*>(smem_raw) + warp * S * stage_elems<D, C>();
  const C* k_cache = static_cast<const C*>(p.k_cache) + static_cast<int64_t>(kv_head) * D;
  const C* v_cache = static_cast<const C*>(p.v_cache) + static_cast<int64_t>(kv_head) * D;
  const int64_t cache_row_stride = static_cast<int64_t>(hk) * D;
  const PagedRows paged(p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq, p.block_size);
  // Chunk c's K and V rows into stage `buf`; rows past the sequence are zero-filled.
  auto load_chunk = [&](int c, int buf) {
    C* k_tile = stages + buf * stage_elems<D, C>();
    C* v_tile = k_tile + kChunk * kStride;
#pragma unroll
    for (int i = lane; i < kChunk * kPieces; i += 32) {
      const int r = i / kPieces, col = (i % kPieces) * kPieceElems, j = c * kChunk + r;
      const bool ok = j < seq_len;
      const int64_t at = (ok ? paged.row(j) : 0) * cache_row_stride + col;
      cp_async16(k_tile + r * kStride + col, k_cache + at, ok);
      cp_async16(v_tile + r * kStride + col, v_cache + at, ok);
    }
  };

  const int num_chunks = ceil_div(seq_len, kChunk);
  const int my_chunks = warp < num_chunks ? ceil_div(num_chunks - warp, kWarps) : 0;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < my_chunks) load_chunk(warp + s * kWarps, s);
    cp_async_commit();
  }

  const float score_scale = kFp8 ? 1.0f : p.scale * kLog2e;  // fp8: already in Q
  const int mat = lane >> 3, mat_row = lane & 7;  // ldmatrix: lane l addresses row (l & 7) of matrix (l >> 3)
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};  // run_sum: this lane's share

  for (int i = 0; i < my_chunks; ++i) {
    if (i + S - 1 < my_chunks) load_chunk(warp + (i + S - 1) * kWarps, (i + S - 1) % S);
    cp_async_commit();
    cp_async_wait<S - 1>();  // chunk i has landed (for this lane) ...
    __syncwarp();            // ... and for every lane of the warp
    const C* k_tile = stages + (i % S) * stage_elems<D, C>();
    const C* v_tile = k_tile + kChunk * kStride;
    const int key0 = (warp + i * kWarps) * kChunk;

    // S = Q K^T: element (c, 2h + e) is row lane/4 + 8h, key 8c + 2 (lane % 4) + e of the chunk.
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    if constexpr (kFp8) {
#pragma unroll
      for (int kk = 0; kk < D / 16; kk += 2) {
        uint32_t r[4];  // keys 0-7 | 8-15 (mat >> 1) x dims 16 kk.. | 16 kk + 16.. (mat & 1)
        ldmatrix_x4(r, k_tile + ((mat >> 1) * 8 + mat_row) * kStride + kk * 16 + (mat & 1) * 16);
#pragma unroll
        for (int m = 0; m < 4; ++m)
          mma_f16_16816(s[m >> 1], qa[kk + (m & 1)], e4m3x2_lo_to_f16x2(r[m]), e4m3x2_hi_to_f16x2(r[m]));
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t b[4];
        ldmatrix_x4(b, k_tile + ((mat >> 1) * 8 + mat_row) * kStride + kk * 16 + (mat & 1) * 8);
        mma_bf16_16816(s[0], qa[kk], b[0], b[1]);
        mma_bf16_16816(s[1], qa[kk], b[2], b[3]);
      }
    }
    // Online softmax per row; the 4 lanes of a row (same lane / 4) hold its 16 keys.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int limit = h ? limit_hi : limit_lo;
      float chunk_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = key0 + 8 * c + 2 * quad + e;
          float& v = s[c][2 * h + e];
          v = j <= limit ? v * score_scale : -INFINITY;
          chunk_max = fmaxf(chunk_max, v);
        }
      }
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 1));
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 2));
      const float new_max = fmaxf(run_max[h], chunk_max);
      const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row that sees no key yet
      const float alpha = fast_exp2(run_max[h] - base);           // 0 while run_max = -inf
      run_max[h] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s[c][2 * h + e] = fast_exp2(s[c][2 * h + e] - base);  // masked: exp2(-inf) = 0
          sum += s[c][2 * h + e];
        }
      }
      run_sum[h] = run_sum[h] * alpha + sum;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][2 * h] *= alpha;
        o[n][2 * h + 1] *= alpha;
      }
    }
    // O += P V: the scores' accumulator layout is the A fragment of P (keys 0-7 | 8-15).
    if constexpr (kFp8) {
      const uint32_t pa[4] = {pack_f16x2(s[0][0], s[0][1]), pack_f16x2(s[0][2], s[0][3]),
                              pack_f16x2(s[1][0], s[1][1]), pack_f16x2(s[1][2], s[1][3])};
#pragma unroll
      for (int dn = 0; dn < D / 16; dn += 2) {
        uint32_t r[4];  // transposed: keys 0-7 | 8-15 (mat & 1) x dims 16 dn.. | 16 dn + 16.. (mat >> 1)
        ldmatrix_x4_trans(r, v_tile + ((mat & 1) * 8 + mat_row) * kStride + dn * 16 + (mat >> 1) * 16);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          // [k 2t: dims 2j, 2j+1 | k 2t+1: dims 2j, 2j+1] -> [dim 2j: k 2t, 2t+1 | dim 2j+1: k 2t, 2t+1]
          const uint32_t lo = __byte_perm(r[2 * g], 0, 0x3120), hi = __byte_perm(r[2 * g + 1], 0, 0x3120);
          mma_f16_16816(o[2 * (dn + g)], pa, e4m3x2_lo_to_f16x2(lo), e4m3x2_lo_to_f16x2(hi));
          mma_f16_16816(o[2 * (dn + g) + 1], pa, e4m3x2_hi_to_f16x2(lo), e4m3x2_hi_to_f16x2(hi));
        }
      }
    } else {
      const uint32_t pa[4] = {pack_bf16x2(s[0][0], s[0][1]), pack_bf16x2(s[0][2], s[0][3]),
                              pack_bf16x2(s[1][0], s[1][1]), pack_bf16x2(s[1][2], s[1][3])};
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t b[4];  // transposed: keys (0-7 | 8-15) x columns (0-7: b0 b1 | 8-15: b2 b3)
        ldmatrix_x4_trans(b, v_tile + ((mat & 1) * 8 + mat_row) * kStride + dn * 16 + (mat >> 1) * 8);
        mma_bf16_16816(o[2 * dn], pa, b[0], b[1]);
        mma_bf16_16816(o[2 * dn + 1], pa, b[2], b[3]);
      }
    }
    __syncwarp();  // every lane is done with stage i % S before the next iteration refills it
  }
  cp_async_wait<0>();

  // Merge the warps: out = sum_w 2^(m_w - M) o_w / sum_w 2^(m_w - M) l_w over warps that saw keys.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 1);
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 2);
  }
  __syncthreads();  // every warp is done with its stages
  float* merged_out = reinterpret_cast<float*>(smem_raw);  // [warp][row][D]
  float* merged_max = merged_out + kWarps * kMaxRows * D;  // [warp][row]
  float* merged_sum = merged_max + kWarps * kMaxRows;      // [warp][row]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? r_hi : r_lo;
    if (r >= entries) continue;
    float* row_out = merged_out + (warp * kMaxRows + r) * D;
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      if constexpr (kFp8) {  // tiles n, n + 1: the even and odd dims of 16 (n / 2) + 4t .. +3
        *reinterpret_cast<float4*>(row_out + 8 * n + 4 * quad) =
            make_float4(o[n][2 * h], o[n + 1][2 * h], o[n][2 * h + 1], o[n + 1][2 * h + 1]);
      } else {
        *reinterpret_cast<float2*>(row_out + 8 * n + 2 * quad) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
        *reinterpret_cast<float2*>(row_out + 8 * n + 8 + 2 * quad) = make_float2(o[n + 1][2 * h], o[n + 1][2 * h + 1]);
      }
    }
    if (quad == 0) {
      merged_max[warp * kMaxRows + r] = run_max[h];
      merged_sum[warp * kMaxRows + r] = run_sum[h];
    }
  }
  __syncthreads();
  bf16* out = static_cast<bf16*>(p.out);
  const float out_scale = kFp8 ? p.v_scale : 1.0f;
  for (int idx = tid; idx < entries * D; idx += kThreads) {
    const int g = idx / D, e = idx % D;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, merged_max[w * kMaxRows + g]);
    float total = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float l = merged_sum[w * kMaxRows + g];
      if (l > 0.0f) {
        const float weight = fast_exp2(merged_max[w * kMaxRows + g] - m);
        total += weight * l;
        acc += weight * merged_out[(w * kMaxRows + g) * D + e];
      }
    }
    out[row_head(g) * D + e] = __float2bfloat16_rn(acc * out_scale / total);  // total > 0: warp 0 saw key 0
  }
}

template <int D, class C, int S, int MIN_BLOCKS>
cudaError_t launch_dcs(const PagedAttentionParams& p, cudaStream_t stream) {
  const auto kernel = decode_attention_mma_kernel<D, C, S, MIN_BLOCKS>;
  constexpr size_t bytes = shared_bytes<D, C, S>();
  const cudaError_t raised = raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (raised != cudaSuccess) return raised;
  const LaunchShape shape{dim3(p.num_kv_heads, p.num_seqs), dim3(kThreads), bytes};
  return launch_overlapped(kernel, shape, stream, p, p.num_q_heads / p.num_kv_heads);
}

template <int D>
cudaError_t launch_d(const PagedAttentionParams& p, cudaStream_t stream) {
  if (!p.cache_fp8) return launch_dcs<D, bf16, MmaCache<bf16>::kStages, 1>(p, stream);
  if (p.num_seqs * p.num_kv_heads > 3 * p.sm_count) return launch_dcs<D, fp8, 3, 4>(p, stream);
  return launch_dcs<D, fp8, MmaCache<fp8>::kStages, 1>(p, stream);
}

}  // namespace

bool decode_attention_mma_applies(const PagedAttentionParams& p) {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_DECODE_ATTENTION_MMA");
    return !(v && v[0] == '0');
  }();
  const int group = p.num_kv_heads > 0 ? p.num_q_heads / p.num_kv_heads : 0;
  return enabled && p.head_dim == p.v_head_dim && (p.head_dim == 64 || p.head_dim == 128) &&
         group >= 1 && p.max_query_len == 1 && group <= kMaxRows && 2 * p.num_seqs * p.num_kv_heads >= p.sm_count;
}

cudaError_t launch_decode_attention_mma(const PagedAttentionParams& p, cudaStream_t stream) {
  if (!decode_attention_mma_applies(p)) return cudaErrorInvalidValue;
  return p.head_dim == 64 ? launch_d<64>(p, stream) : launch_d<128>(p, stream);
}

}  // namespace specula::cuda
