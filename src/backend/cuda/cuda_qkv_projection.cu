// The qkv projection of one decode row with the attention prologue in its epilogue
// (Backend::qkv_projection): the GEMV of cuda_gemv.cu, whose output rows go to the prologue of
// cuda_qkv_prologue.cu in the same launch instead of through memory and a launch of their own.
//
// Why: at batch 1 the prologue kernel moves a few kilobytes and costs what a dependent launch
// costs (~2.5 us on the H200, a Qwen3-0.6B layer being ~30 us); its work fits in the tail of the
// projection, whose blocks already hold the rows it needs.
//
// Shape: a head's D rows are one thread-block cluster of D / 16 blocks, 4 warps of 4 rows each,
// so that every block's rows belong to one head. Each lane takes the same chunks of K in the
// same order as the GEMV (chunk lane + 32 u), so a row's sum is the GEMV's bit for bit; it is
// rounded to bf16 as fused_linear stores qkv. The per-head norm and rope need the whole head:
// after a cluster barrier one warp of each block reads the head's rows from the cluster's shared
// memory (DSMEM, no round trip to L2), runs the prologue's arithmetic (prologue_head) and stores
// the elements of its own block's rows; V rows need no exchange and go straight to the cache.
//
// Larger weights (Llama-3.1-8B's 50 MB) keep the GEMV's own grid, which streams them faster than
// clusters of a head each, with the prologue as its epilogue where no q/k norm needs the whole
// head (launch_gemv_rope_epilogue, cuda_gemv.cu: a row group holds rope pairs).
#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_engine_kernels.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_kv_element.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_qkv_prologue.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kRowsPerWarp = 4;
constexpr int kBlockRows = kGemvWarps * kRowsPerWarp;  // a head of D rows is D / 16 blocks
constexpr int kMaxClusterBlocks = 8;                    // the portable cluster size: D <= 128
constexpr int kUnroll = 4;                              // chunks a lane keeps in flight per row
constexpr int64_t kMaxStagedBytes = 48 << 10;           // the normed row, without an opt-in
// Small weights only (Qwen3-0.6B's qkv: 8 MB): there a dependent launch is a large part of the
// prologue's and the projection's time; Llama-3.1-8B's 50 MB (25 MB in FP8) streamed in passes
// measured no faster fused than the GEMV's grid (docs/PERFORMANCE.md).
constexpr int64_t kMaxWeightBytes = kGemvStartNextEarlyBytes;

// W: the weights' element (bf16 or e4m3 as uint8_t); C: the cache's (bf16 or fp8); NORMED: x goes
// through the RMSNorm staged in dynamic shared memory first.
template <class W, class C, bool NORMED>
__global__ void __launch_bounds__(kGemvThreads) qkv_projection_kernel(const QkvProjectionParams p) {
  using Chunk = WeightChunk<W>;
  constexpr int kN = Chunk::kN;
  extern __shared__ uint4 staged_raw[];
  __shared__ float block_rows[kBlockRows];  // this block's rows of the head, as bf16 rounds them
  __shared__ float stage[kMaxPrologueHeadDim];
  const QkvPrologueParams& q = p.prologue;
  const int d = q.head_dim, hq = q.num_q_heads, hk = q.num_kv_heads;
  const int head = blockIdx.x / (d / kBlockRows), first_row = blockIdx.x % (d / kBlockRows) * kBlockRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t k = p.k, chunks = k / kN;
  const int64_t row0 = static_cast<int64_t>(head) * d + first_row + warp * kRowsPerWarp;
  const W* rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) rows[r] = static_cast<const W*>(p.w) + (row0 + r) * k;
  uint4 wv[kUnroll][kRowsPerWarp];
  auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        wv[u][r] = c < chunks ? load_streaming(rows[r] + c * kN) : make_uint4(0, 0, 0, 0);
    }
  };
  load_weights(lane);  // weights are constants: requested before the wait for the previous kernel
  // The head's kind, and what its prologue will need, requested now so that their round trips
  // overlap the product's instead of following the exchange: the norm weights (constants too),
  // then, once positions may be read, the rotation.
  const bool is_q = head < hq, is_k = !is_q && head < hq + hk, is_v = head >= hq + hk;
  const bf16* head_norm = static_cast<const bf16*>(is_q ? q.q_norm : is_k ? q.k_norm : nullptr);
  float gamma[kPrologueElemsPerLane];
#pragma unroll
  for (int j = 0; j < kPrologueElemsPerLane; ++j) {
    const int i = lane + 32 * j;
    gamma[j] = warp == 0 && head_norm != nullptr && i < d ? to_float(head_norm[i]) : 0.0f;
  }
  allow_next_kernel_start();  // (small weights only: the next kernel may stream its own meanwhile)
  wait_for_previous_kernels();
  const int32_t pos = q.positions[0];
  const bool rotated = !is_v && prologue_rotates(q, pos);
  float2 rotation[kProloguePairsPerLane];
#pragma unroll
  for (int jj = 0; jj < kProloguePairsPerLane; ++jj) {
    const int j = lane + 32 * jj, half = q.rotary_dim / 2;
    const float* cos = q.cos_sin + static_cast<int64_t>(pos) * q.rotary_dim;
    rotation[jj] = warp == 0 && rotated && j < half ? make_float2(cos[j], cos[half + j]) : make_float2(0.0f, 0.0f);
  }
  const bf16* x = static_cast<const bf16*>(p.x);
  if constexpr (NORMED) {
    GemvArgs norm;
    norm.x = p.x;
    norm.norm_weight = p.norm_weight;
    norm.eps = p.norm_eps;
    norm.m = 1;
    norm.k = k;
    auto* staged = reinterpret_cast<bf16*>(staged_raw);
    stage_norm<1>(norm, staged);
    __syncthreads();
    x = staged;
  }

  float acc[kRowsPerWarp] = {};
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    if (c0 != lane) load_weights(c0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
      float xf[kN];
      load_activations<kN>(x + c * kN, xf);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float wf[kN];
        Chunk::decode(wv[u][r], wf);
#pragma unroll
        for (int j = 0; j < kN; ++j) acc[r] = fmaf(wf[j], xf[j], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == r) {
      const int64_t row = row0 + r;
      float v = p.w_scale != nullptr ? sum * p.w_scale[row] : sum;
      if (p.bias != nullptr) {
        v += p.bias_dtype == DType::kF32 ? static_cast<const float*>(p.bias)[row]
                                         : to_float(static_cast<const bf16*>(p.bias)[row]);
      }
      block_rows[warp * kRowsPerWarp + r] = to_float(from_float<bf16>(v));  // as fused_linear stores qkv
    }
  }
  __syncthreads();

  // The prologue, as qkv_prologue_kernel runs it for token 0. Every block of a cluster is the
  // same head, so the early returns below are the whole cluster's.
  const int64_t slot = q.slots[0];
  const bool keep_kv = slot >= 0 && slot < q.num_slots;
  if (!is_q && !keep_kv) return;  // a token whose K/V is not kept
  const PrologueDestination<bf16, C> dst(q, 0, head, slot);
  if (is_v) {  // v: its rows straight into the cache slot
    if (threadIdx.x < kBlockRows) dst.store(first_row + threadIdx.x, block_rows[threadIdx.x]);
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  float head_x[kPrologueElemsPerLane];
  if (warp == 0) {
#pragma unroll
    for (int j = 0; j < kPrologueElemsPerLane; ++j) {
      const int i = lane + 32 * j;
      head_x[j] = i < d ? cluster.map_shared_rank(block_rows, i / kBlockRows)[i % kBlockRows] : 0.0f;
    }
  }
  // Done reading the others' rows; the wait before leaving keeps this block's rows readable
  // until every block of the cluster has arrived (split so that the prologue runs in between).
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  if (warp == 0) {
    prologue_head<bf16>(
        q, head_norm != nullptr, [&](int j) { return gamma[j]; }, rotated, [&](int jj) { return rotation[jj]; },
        head_x, stage, [&](int i, float v) {
          if (i >= first_row && i < first_row + kBlockRows) dst.store(i, v);
        });
  }
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

template <class W, class C>
cudaError_t launch_typed(const QkvProjectionParams& p, cudaStream_t stream) {
  const int d = p.prologue.head_dim, heads = p.prologue.num_q_heads + 2 * p.prologue.num_kv_heads;
  const int cluster = d / kBlockRows;
  LaunchShape shape{dim3(static_cast<unsigned>(heads * cluster)), dim3(kGemvThreads)};
  shape.cluster = dim3(static_cast<unsigned>(cluster), 1, 1);
  if (p.norm_weight == nullptr) return launch_overlapped(qkv_projection_kernel<W, C, false>, shape, stream, p);
  shape.shared_bytes = static_cast<size_t>(p.k) * sizeof(bf16);
  return launch_overlapped(qkv_projection_kernel<W, C, true>, shape, stream, p);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool fused_qkv_projection_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_FUSED_QKV_PROJECTION");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

namespace {

// The one-row GEMV of the rope epilogue for these parameters (its out is not written).
GemvArgs rope_epilogue_gemv(const QkvProjectionParams& p) {
  GemvArgs a;
  a.x = p.x;
  a.w = p.w;
  a.w_dtype = p.w_fp8 ? DType::kF8E4M3 : DType::kBF16;
  a.scale = p.w_scale;
  a.bias = p.bias;
  a.bias_dtype = p.bias_dtype;
  a.out_dtype = DType::kBF16;
  a.m = 1;
  a.n = static_cast<int64_t>(p.prologue.num_q_heads + 2 * p.prologue.num_kv_heads) * p.prologue.head_dim;
  a.k = p.k;
  a.norm_weight = p.norm_weight;
  a.eps = p.norm_eps;
  return a;
}

// Whether the cluster form above takes these shapes.
bool cluster_form_supports(const QkvProjectionParams& p) {
  const int d = p.prologue.head_dim;
  const int64_t chunk = p.w_fp8 ? 16 : 8;
  const int64_t rows = static_cast<int64_t>(p.prologue.num_q_heads + 2 * p.prologue.num_kv_heads) * d;
  const int64_t weight_bytes = rows * p.k * (p.w_fp8 ? 1 : 2);
  return p.prologue.tokens == 1 && rows > 0 && weight_bytes <= kMaxWeightBytes && d % kBlockRows == 0 &&
         d / kBlockRows <= kMaxClusterBlocks && d <= kMaxPrologueHeadDim && p.k > 0 && p.k % chunk == 0 && aligned16(p.x) && aligned16(p.w) &&
         (!p.w_fp8 || p.w_scale != nullptr) &&
         (p.norm_weight == nullptr ||
          (aligned16(p.norm_weight) && p.k * static_cast<int64_t>(sizeof(bf16)) <= kMaxStagedBytes));
}

}  // namespace

bool qkv_projection_supports(const QkvProjectionParams& p) {
  return fused_qkv_projection_enabled() &&
         (cluster_form_supports(p) || gemv_rope_epilogue_supports(rope_epilogue_gemv(p), p.prologue));
}

cudaError_t launch_qkv_projection(const QkvProjectionParams& p, cudaStream_t stream) {
  if (!qkv_projection_supports(p)) return cudaErrorInvalidValue;
  if (!cluster_form_supports(p)) return launch_gemv_rope_epilogue(rope_epilogue_gemv(p), p.prologue, stream);
  if (p.w_fp8) {
    return p.prologue.cache_fp8 ? launch_typed<uint8_t, fp8>(p, stream) : launch_typed<uint8_t, bf16>(p, stream);
  }
  return p.prologue.cache_fp8 ? launch_typed<bf16, fp8>(p, stream) : launch_typed<bf16, bf16>(p, stream);
}

}  // namespace specula::cuda
