// Decode attention on the tensor cores, for batches with (sequence, kv head) pairs for at least
// half the SMs (batch 16 and more of an 8-kv-head model): one block a pair, no split of the keys
// across blocks.
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
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;    // keys a warp takes at a time: one k-step of P V
constexpr int kMaxRows = 16;  // entries a block: one mma row tile
// Stages a warp keeps: two chunks in flight while it computes a third. Shared memory then holds
// two blocks an SM (104 KB each at head dim 128); H200, Llama-3.1-8B heads, batch 64: 25.3 / 75.1
// / 274 us at 256 / 1024 / 4096 keys against 27.4 / 83.7 / 320 us with two stages (three blocks
// an SM, one chunk in flight a warp).
constexpr int kStages = 3;
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
constexpr int row_stride() {
  return D + 8;  // elements
}
// A warp's stage: the chunk's K rows, then its V rows.
template <int D>
constexpr int stage_elems() {
  return 2 * kChunk * row_stride<D>();
}
template <int D, int S>
constexpr size_t shared_bytes() {
  return size_t{kWarps} * S * stage_elems<D>() * sizeof(bf16);
}
// The merge at the end reuses the stages: every warp's outputs, maxima and sums of 16 rows.
template <int D>
constexpr size_t merge_bytes() {
  return size_t{kWarps} * kMaxRows * (D + 2) * sizeof(float);
}

__device__ __forceinline__ uint32_t load_bf16x2(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// D: head dim (K and V); S: stages a warp keeps (S - 1 chunks in flight while one is used).
// grid: x = kv head, y = sequence.
template <int D, int S>
__global__ void __launch_bounds__(kThreads) decode_attention_mma_kernel(PagedAttentionParams p, int group) {
  static_assert(merge_bytes<D>() <= shared_bytes<D, S>(), "the merge must fit the stages it reuses");
  constexpr int kStride = row_stride<D>();
  constexpr int kPieces = D / 8;  // 16-byte pieces of a row
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
  const bf16* q_lo = q + (r_lo < entries ? row_head(r_lo) : 0) * D + 2 * quad;
  const bf16* q_hi = q + (r_hi < entries ? row_head(r_hi) : 0) * D + 2 * quad;
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qa[kk][0] = r_lo < entries ? load_bf16x2(q_lo + kk * 16) : 0u;
    qa[kk][1] = r_hi < entries ? load_bf16x2(q_hi + kk * 16) : 0u;
    qa[kk][2] = r_lo < entries ? load_bf16x2(q_lo + kk * 16 + 8) : 0u;
    qa[kk][3] = r_hi < entries ? load_bf16x2(q_hi + kk * 16 + 8) : 0u;
  }

  bf16* stages = reinterpret_cast<bf16*>(smem_raw) + warp * S * stage_elems<D>();
  const bf16* k_cache = static_cast<const bf16*>(p.k_cache) + static_cast<int64_t>(kv_head) * D;
  const bf16* v_cache = static_cast<const bf16*>(p.v_cache) + static_cast<int64_t>(kv_head) * D;
  const int64_t cache_row_stride = static_cast<int64_t>(hk) * D;
  const PagedRows paged(p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq, p.block_size);
  // Chunk c's K and V rows into stage `buf`; rows past the sequence are zero-filled.
  auto load_chunk = [&](int c, int buf) {
    bf16* k_tile = stages + buf * stage_elems<D>();
    bf16* v_tile = k_tile + kChunk * kStride;
#pragma unroll
    for (int i = lane; i < kChunk * kPieces; i += 32) {
      const int r = i / kPieces, col = (i % kPieces) * 8, j = c * kChunk + r;
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

  const float score_scale = p.scale * kLog2e;
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
    const bf16* k_tile = stages + (i % S) * stage_elems<D>();
    const bf16* v_tile = k_tile + kChunk * kStride;
    const int key0 = (warp + i * kWarps) * kChunk;

    // S = Q K^T: element (c, 2h + e) is row lane/4 + 8h, key 8c + 2 (lane % 4) + e of the chunk.
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, k_tile + ((mat >> 1) * 8 + mat_row) * kStride + kk * 16 + (mat & 1) * 8);
      mma_bf16_16816(s[0], qa[kk], b[0], b[1]);
      mma_bf16_16816(s[1], qa[kk], b[2], b[3]);
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
    const uint32_t pa[4] = {pack_bf16x2(s[0][0], s[0][1]), pack_bf16x2(s[0][2], s[0][3]),
                            pack_bf16x2(s[1][0], s[1][1]), pack_bf16x2(s[1][2], s[1][3])};
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t b[4];  // transposed: keys (0-7 | 8-15) x columns (0-7: b0 b1 | 8-15: b2 b3)
      ldmatrix_x4_trans(b, v_tile + ((mat & 1) * 8 + mat_row) * kStride + dn * 16 + (mat >> 1) * 8);
      mma_bf16_16816(o[2 * dn], pa, b[0], b[1]);
      mma_bf16_16816(o[2 * dn + 1], pa, b[2], b[3]);
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
  float* merged_out = reinterpret_cast<float*>(smem_raw);       // [warp][row][D]
  float* merged_max = merged_out + kWarps * kMaxRows * D;       // [warp][row]
  float* merged_sum = merged_max + kWarps * kMaxRows;           // [warp][row]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? r_hi : r_lo;
    if (r >= entries) continue;
    float* row_out = merged_out + (warp * kMaxRows + r) * D + 2 * quad;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) *reinterpret_cast<float2*>(row_out + 8 * n) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
    if (quad == 0) {
      merged_max[warp * kMaxRows + r] = run_max[h];
      merged_sum[warp * kMaxRows + r] = run_sum[h];
    }
  }
  __syncthreads();
  bf16* out = static_cast<bf16*>(p.out);
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
    out[row_head(g) * D + e] = __float2bfloat16_rn(acc / total);  // total > 0: warp 0 saw key 0
  }
}

template <int D>
cudaError_t launch_d(const PagedAttentionParams& p, cudaStream_t stream) {
  const auto kernel = decode_attention_mma_kernel<D, kStages>;
  constexpr size_t bytes = shared_bytes<D, kStages>();
  const cudaError_t raised = raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (raised != cudaSuccess) return raised;
  const LaunchShape shape{dim3(p.num_kv_heads, p.num_seqs), dim3(kThreads), bytes};
  return launch_overlapped(kernel, shape, stream, p, p.num_q_heads / p.num_kv_heads);
}

}  // namespace

bool decode_attention_mma_applies(const PagedAttentionParams& p) {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_DECODE_ATTENTION_MMA");
    return !(v && v[0] == '0');
  }();
  const int group = p.num_kv_heads > 0 ? p.num_q_heads / p.num_kv_heads : 0;
  return enabled && !p.cache_fp8 && p.head_dim == p.v_head_dim && (p.head_dim == 64 || p.head_dim == 128) &&
         group >= 1 && p.max_query_len * group <= kMaxRows && 2 * p.num_seqs * p.num_kv_heads >= p.sm_count;
}

cudaError_t launch_decode_attention_mma(const PagedAttentionParams& p, cudaStream_t stream) {
  if (!decode_attention_mma_applies(p)) return cudaErrorInvalidValue;
  return p.head_dim == 64 ? launch_d<64>(p, stream) : launch_d<128>(p, stream);
}

}  // namespace specula::cuda
