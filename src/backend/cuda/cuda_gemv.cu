// Small-M linear layers: decode and speculative verification multiply 1-16 activation rows by
// bf16 or FP8 (e4m3) weights, with the decoder's element-wise neighbours folded in (GemvArgs).
//
// The cost is streaming the weights once, so the kernel must keep HBM busy, not the tensor cores.
// Each warp owns NR output rows (or shares them with another warp, each taking alternate 32-chunk
// stripes of K) and walks K in 16-byte weight chunks (8 bf16 or 16 e4m3 weights, one LDG.128 per
// row), kUnroll chunks in flight per lane so that enough loads are outstanding to cover HBM
// latency. Weight loads bypass L1 (ld.global.nc.L1::no_allocate: each byte is read
// once), which leaves L1 to the activation rows every warp of the SM rereads. e4m3 -> f16 is one
// hardware conversion per pair on sm_89+. Products accumulate in fp32 per lane, then across the
// warp (and the two warps of a shared row, in a fixed order); the FP8 row scale multiplies the
// finished sum. A kernel forms each row's sum in one order whatever M is (one row a warp or two),
// so that a row's result does not depend on the batch it runs in, except where the norm leaves the
// kernel (above kGemvMaxNormRows rows) and the projection becomes a plain, split one.
//
// The norm before a projection is computed once per block into shared memory, the M rows of the
// product's input as rms_norm would have stored them (bf16), while the block's first weight
// loads are already in flight; the grid is then sized to the blocks the GPU holds at once and
// each block loops over row groups, so that the norm runs ~1k times per launch, not once per 8
// rows. Epilogues: the residual add rounds the product to out's dtype and adds it in place (as
// linear + add round it); SwiGLU gives each block the gate rows and the up rows of the same 4
// columns, so that it writes silu(gate) * up itself (as linear + silu_mul round it) and the
// [M, 2I] product never reaches memory. The rope epilogue (a qkv projection of one decode row
// with no q/k norm and full neox rotary: Llama's) pairs the rows j and j + D/2 of a head the
// same way and runs the attention prologue on them, q into its output and k, v into their cache
// slots, so that the prologue is not a launch of its own (cuda_qkv_projection.cu picks it).
//
// Launched overlapped with the previous kernel (cuda_launch.cuh): a block's first weight loads
// go out before it waits for the previous kernel, since weights do not depend on it.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_engine_kernels.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_element.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_qkv_prologue.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kWarps = kGemvWarps;
constexpr int kThreads = kGemvThreads;
// Rows a warp owns and 16-byte chunks a lane keeps in flight per row: by default 2 rows and 4
// chunks, which streams large weights in passes over K. Small weights take one row a warp and the
// whole row at once (one pass): their kernels are short enough that each pass's memory round trip
// shows, and with every weight load issued before the wait for the previous kernel none is left
// after it (Qwen3-0.6B's o_proj and down: two and three passes of 4 chunks otherwise).
constexpr int kNR = 2, kUnroll = 4;
constexpr int kOnePassNR = 1, kOnePassUnroll = 16;
constexpr int kShortRowsNR = 4;  // short_rows below
// Warps that share a row of a plain projection (split_rows below).
constexpr int kSplitWarps = 2;
// Shared memory for a norm's rows: above 64 KiB fewer than 3 blocks fit an SM, too few warps to
// keep enough weight loads in flight; such shapes take the separate ops.
constexpr int64_t kMaxStagedBytes = 64 << 10;
constexpr int64_t kStartNextEarlyBytes = kGemvStartNextEarlyBytes;

// The epilogue after the product: none (NoRope), or the attention prologue of a qkv projection
// with its cache of element type C (bf16, or fp8).
struct NoRope {
  using Cache = bf16;
};
template <class C>
struct RopeInto {
  using Cache = C;
  QkvPrologueParams p;
};
template <class R>
constexpr bool kRoped = !std::is_same_v<R, NoRope>;

template <class Out>
__device__ __forceinline__ void write_out(const GemvArgs& a, int64_t i, float v) {
  Out* out = static_cast<Out*>(a.out) + i;
  if (a.epilogue == GemvEpilogue::kAccumulate) {
    *out = from_float<Out>(to_float(*out) + to_float(from_float<Out>(v)));
  } else {
    *out = from_float<Out>(v);
  }
}

// y[mi, row] for mi < m, row < n into the epilogue; MT >= m rows of input. STAGED: the input is
// rms_norm(x) in dynamic shared memory; otherwise x itself, read from global memory (through L1).
// GATED: the SwiGLU epilogue (a row group's first half are gate rows, its second half the up rows
// of the same columns, I further on). R: the rope epilogue (RopeInto; a row group's halves are
// rows j.. and j + D/2.. of one head, the rope pairs). NR, U: rows a warp owns and chunks a lane
// keeps in flight per row (above). KS: warps that share a row and split its K (KS 32-chunk stripes side by side, their
// sums added in shared memory in a fixed order); a block's row group is kWarps / KS * NR rows.
template <class W, int MT, class Out, bool STAGED, bool GATED, int NR, int U, int KS, class R = NoRope>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a, bool start_next_early, const R rope) {
  constexpr bool kPaired = GATED || kRoped<R>;  // a row group's halves pair up
  constexpr int kRows = kWarps / KS * NR;  // a row group
  constexpr int kGatedCols = kRows / 2;    // SwiGLU: output columns per row group; rope: pairs
  static_assert(!kPaired || kRows % 2 == 0, "a paired row group has two halves");
  static_assert(!(GATED && kRoped<R>), "one epilogue");
  extern __shared__ uint4 staged_raw[];
  __shared__ float gated[kPaired ? 2 : 1][kPaired ? kGatedCols : 1][MT];  // the group's y, as stored
  __shared__ float slice_sums[KS > 1 ? kRows : 1][MT][KS];
  using Chunk = WeightChunk<W>;
  constexpr int kN = Chunk::kN;
  const int m = static_cast<int>(a.m);
  const int64_t n = a.n, k = a.k, half_n = n / 2;
  const auto* w = static_cast<const W*>(a.w);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slice = warp % KS, warp_row = warp / KS;
  const int64_t chunks = k / kN;
  const int64_t groups = kPaired ? (half_n + kGatedCols - 1) / kGatedCols : (n + kRows - 1) / kRows;
  // Row l of a group: its weight row, and whether it exists (the last group may be partial).
  auto weight_row = [&](int64_t group, int l) -> int64_t {
    if constexpr (kRoped<R>) {  // head h's rows j.. and j + D/2.. (every group whole: D/2 % kGatedCols == 0)
      const int64_t half_d = rope.p.head_dim / 2, groups_a_head = half_d / kGatedCols;
      return group / groups_a_head * 2 * half_d + (l < kGatedCols ? 0 : half_d) + group % groups_a_head * kGatedCols +
             l % kGatedCols;
    } else if constexpr (GATED) {
      return (l < kGatedCols ? 0 : half_n) + group * kGatedCols + l % kGatedCols;
    } else {
      return group * kRows + l;
    }
  };
  auto row_exists = [&](int64_t group, int l) {
    return kPaired ? group * kGatedCols + l % kGatedCols < half_n : group * kRows + l < n;
  };
  auto load_weights = [&](uint4 (&wv)[U][NR], const W* const (&rows)[NR], int64_t c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * KS * u;
#pragma unroll
      for (int r = 0; r < NR; ++r)
        wv[u][r] = c < chunks ? load_streaming(rows[r] + c * kN) : make_uint4(0, 0, 0, 0);
    }
  };
  // Rows past the end (the last group) compute on a clamped row and store nothing.
  auto rows_of = [&](int64_t group, const W* (&rows)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; ++r) rows[r] = w + min(weight_row(group, warp_row * NR + r), n - 1) * k;
  };
  // The group's value of row l, input row mi: into out, or into `gated` for the SwiGLU.
  auto finish = [&](int64_t group, int l, int mi, float sum) {
    const int64_t row = weight_row(group, l);
    float v = a.scale != nullptr ? sum * a.scale[row] : sum;
    if (a.bias != nullptr) {
      v += a.bias_dtype == DType::kF32 ? static_cast<const float*>(a.bias)[row]
                                       : to_float(static_cast<const bf16*>(a.bias)[row]);
    }
    if constexpr (kPaired) {
      gated[l / kGatedCols][l % kGatedCols][mi] = to_float(from_float<Out>(v));
    } else {
      write_out<Out>(a, static_cast<int64_t>(mi) * n + row, v);
    }
  };

  // The first weights go out before anything else: before the previous kernel has finished
  // (weights are constants) and before the norm, whose latency theirs then hides.
  uint4 wv[U][NR];
  {
    const W* rows[NR];
    rows_of(blockIdx.x, rows);
    load_weights(wv, rows, slice * 32 + lane);
  }
  bool prefetched = true;
  if (start_next_early) allow_next_kernel_start();
  wait_for_previous_kernels();
  const bf16* xs[MT];
  if constexpr (STAGED) {
    auto* staged = reinterpret_cast<bf16*>(staged_raw);
    stage_norm<MT>(a, staged);
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) xs[mi] = staged + static_cast<int64_t>(min(mi, m - 1)) * k;
  } else {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) xs[mi] = static_cast<const bf16*>(a.x) + min(mi, m - 1) * k;
  }

  const int64_t pass_chunks = 32 * KS * U, passes = (chunks + pass_chunks - 1) / pass_chunks;
  const int64_t lane_c0 = slice * 32 + lane;
  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x) {
    const W* rows[NR];
    rows_of(group, rows);
    float acc[NR][MT];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) acc[r][mi] = 0.0f;
    // Rope: what the thread that stores a pair (one of the first kGatedCols * MT) needs besides the
    // pair, requested before the product so that its round trips overlap the weights'.
    [[maybe_unused]] int rope_head = 0, rope_j = 0;
    [[maybe_unused]] int64_t rope_slot = -1;
    [[maybe_unused]] bool rope_rotates = false;
    [[maybe_unused]] float2 rotation = make_float2(1.0f, 0.0f);
    if constexpr (kRoped<R>) {
      const QkvPrologueParams& q = rope.p;
      const int mi = threadIdx.x / kGatedCols, half_d = q.head_dim / 2, groups_a_head = half_d / kGatedCols;
      rope_head = static_cast<int>(group / groups_a_head);
      rope_j = static_cast<int>(group % groups_a_head) * kGatedCols + threadIdx.x % kGatedCols;
      if (mi < m && threadIdx.x < kGatedCols * MT) {
        const int32_t pos = q.positions[mi];
        rope_slot = q.slots[mi];
        rope_rotates = rope_head < q.num_q_heads + q.num_kv_heads && prologue_rotates(q, pos);
        if (rope_rotates) {
          const float* cos = q.cos_sin + static_cast<int64_t>(pos) * q.rotary_dim;
          rotation = make_float2(cos[rope_j], cos[half_d + rope_j]);
        }
      }
    }

    for (int64_t pass = 0; pass < passes; ++pass) {
      const int64_t c0 = lane_c0 + pass * pass_chunks;
      if (!prefetched) load_weights(wv, rows, c0);
      prefetched = false;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + 32 * KS * u;
        if (c >= chunks) break;
        float wf[NR][kN];
#pragma unroll
        for (int r = 0; r < NR; ++r) Chunk::decode(wv[u][r], wf[r]);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          float xf[kN];
          load_activations<kN>(xs[mi] + c * kN, xf);
#pragma unroll
          for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int j = 0; j < kN; ++j) acc[r][mi] = fmaf(wf[r][j], xf[j], acc[r][mi]);
        }
      }
    }
    prefetched = false;
    if (!start_next_early && group + gridDim.x >= groups) allow_next_kernel_start();  // the block's last group

#pragma unroll
    for (int r = 0; r < NR; ++r) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const float sum = warp_sum(acc[r][mi]);
        const int l = warp_row * NR + r;
        if (lane == (r * MT + mi) % 32 && mi < m) {
          if constexpr (KS > 1) {
            slice_sums[l][mi][slice] = sum;
          } else if (row_exists(group, l)) {
            finish(group, l, mi, sum);
          }
        }
      }
    }
    if constexpr (KS > 1) {
      __syncthreads();
      if (threadIdx.x < kRows * MT) {
        const int l = threadIdx.x / MT, mi = threadIdx.x % MT;
        if (mi < m && row_exists(group, l)) {
          float sum = 0.0f;
#pragma unroll
          for (int s = 0; s < KS; ++s) sum += slice_sums[l][mi][s];
          finish(group, l, mi, sum);
        }
      }
      if constexpr (!GATED) __syncthreads();  // the next group writes `slice_sums` again
    }
    if constexpr (GATED) {
      __syncthreads();
      for (int t = threadIdx.x; t < kGatedCols * MT; t += kThreads) {
        const int col = t % kGatedCols, mi = t / kGatedCols;
        const int64_t out_col = group * kGatedCols + col;
        if (mi < m && out_col < half_n) {
          static_cast<Out*>(a.out)[mi * half_n + out_col] = from_float<Out>(silu(gated[0][col][mi]) * gated[1][col][mi]);
        }
      }
      __syncthreads();  // the next group writes `gated` (and `slice_sums`) again
    }
    if constexpr (kRoped<R>) {  // the prologue of qkv_prologue_kernel on this group's pairs
      __syncthreads();
      const QkvPrologueParams& q = rope.p;
      const int mi = threadIdx.x / kGatedCols, col = threadIdx.x % kGatedCols, half_d = q.head_dim / 2;
      const bool kept = rope_slot >= 0 && rope_slot < q.num_slots;
      if (threadIdx.x < kGatedCols * MT && mi < m && (rope_head < q.num_q_heads || kept)) {
        const PrologueDestination<Out, typename R::Cache> dst(q, mi, rope_head, rope_slot);
        float2 pair = make_float2(gated[0][col][mi], gated[1][col][mi]);
        if (rope_rotates) pair = rope_rotate(pair.x, pair.y, rotation);
        dst.store(rope_j, pair.x);
        dst.store(rope_j + half_d, pair.y);
      }
      __syncthreads();  // the next group writes `gated` again
    }
  }
}

int64_t staged_bytes(const GemvArgs& a) {
  return a.norm_weight == nullptr ? 0 : a.m * a.k * static_cast<int64_t>(sizeof(bf16));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <class W, int MT, class Out, bool STAGED, bool GATED, int NR = kNR, int U = kUnroll, int KS = 1,
          class R = NoRope>
cudaError_t launch_typed(const GemvArgs& a, cudaStream_t stream, const R& rope = R{}) {
  const auto kernel = gemv_kernel<W, MT, Out, STAGED, GATED, NR, U, KS, R>;
  constexpr int kRows = kWarps / KS * NR, kGatedCols = kRows / 2;
  int64_t groups = GATED || kRoped<R> ? (a.n / 2 + kGatedCols - 1) / kGatedCols : (a.n + kRows - 1) / kRows;
  const int smem = static_cast<int>(staged_bytes(a));
  if (STAGED && smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  if (STAGED || KS > 1) {
    // As many blocks as are resident at once: each computes the norm once, and split rows (KS
    // times the groups) run as one wave rather than a second, mostly empty one.
    int device = 0, sms = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
    if (e != cudaSuccess) return e;
    groups = std::min<int64_t>(groups, static_cast<int64_t>(std::max(per_sm, 1)) * sms);
  }
  const bool start_next_early = a.n * a.k * static_cast<int64_t>(sizeof(W)) <= kStartNextEarlyBytes;
  return launch_overlapped(kernel, {dim3(static_cast<unsigned>(groups)), dim3(kThreads), static_cast<size_t>(smem)},
                           stream, a, start_next_early, rope);
}

// One pass (above): small weights whose rows the default needs several passes for and one pass
// of kOnePassUnroll chunks a lane covers.
bool one_pass(const GemvArgs& a, int64_t chunk_weights, int64_t weight_bytes) {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_GEMV_ONE_PASS");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  const int64_t chunks = a.k / chunk_weights;
  return enabled && chunks > 32 * kUnroll && chunks <= 32 * kOnePassUnroll &&
         a.n * a.k * weight_bytes <= kStartNextEarlyBytes;
}

// Two warps a row (KS = 2) for a plain projection (no norm, no SwiGLU) whose row takes the
// default several passes (o_proj, down, lm_head), over a grid of resident blocks: a warp for two
// rows, a block per 8 and no cap on the grid read their weights well below the copy rate,
// most of all at M = 2 (docs/PERFORMANCE.md, "Plain projections over two warps a row"); the
// kernels with a norm, already on a grid of resident blocks, measured slower split.
// SPECULA_GEMV_SPLIT_ROWS=0 turns it off.
bool split_rows(const GemvArgs& a, int64_t chunk_weights) {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_GEMV_SPLIT_ROWS");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled && a.k / chunk_weights > 32 * kUnroll;
}

// Four rows a warp for a single row whose K is one pass of kUnroll chunks a lane (Qwen3-0.6B's
// gate_up, K = 1024): 16 loads a lane in flight instead of 8, and row groups of 16 rows, which
// fit the grid of resident blocks in one round rather than two. SPECULA_GEMV_SHORT_ROWS=0 turns
// it off.
bool short_rows(const GemvArgs& a, int64_t chunk_weights) {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_GEMV_SHORT_ROWS");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled && a.k / chunk_weights <= 32 * kUnroll;
}

template <class W, class Out, bool STAGED, bool GATED, int KS>
cudaError_t launch_for_rows(const GemvArgs& a, cudaStream_t stream) {
  if (a.m == 1) return launch_typed<W, 1, Out, STAGED, GATED, kNR, kUnroll, KS>(a, stream);
  if (a.m == 2) return launch_typed<W, 2, Out, STAGED, GATED, kNR, kUnroll, KS>(a, stream);
  if constexpr (!STAGED) {  // a norm takes at most kGemvMaxNormRows = 2 rows
    if (a.m <= 4) return launch_typed<W, 4, Out, false, GATED, kNR, kUnroll, KS>(a, stream);
  }
  if constexpr (!STAGED && !GATED) {
    if (a.m <= 8) return launch_typed<W, 8, Out, false, false, kNR, kUnroll, KS>(a, stream);
    return launch_typed<W, 16, Out, false, false, kNR, kUnroll, KS>(a, stream);
  }
  return cudaErrorInvalidValue;
}

template <class W, class Out, bool STAGED, bool GATED>
cudaError_t launch_rows(const GemvArgs& a, cudaStream_t stream) {
  constexpr int64_t kChunkWeights = 16 / sizeof(W);
  const bool one = a.m == 1 && one_pass(a, kChunkWeights, sizeof(W));  // (2 rows spill registers)
  if constexpr (!STAGED && !GATED) {
    if (split_rows(a, kChunkWeights)) {  // (one pass too, so that the sums keep one order at every M)
      if (one) return launch_typed<W, 1, Out, false, false, kOnePassNR, kOnePassUnroll / kSplitWarps, kSplitWarps>(a, stream);
      return launch_for_rows<W, Out, false, false, kSplitWarps>(a, stream);
    }
  }
  if (one) return launch_typed<W, 1, Out, STAGED, GATED, kOnePassNR, kOnePassUnroll>(a, stream);
  if (a.m == 1 && short_rows(a, kChunkWeights)) {
    return launch_typed<W, 1, Out, STAGED, GATED, kShortRowsNR, kUnroll>(a, stream);
  }
  return launch_for_rows<W, Out, STAGED, GATED, 1>(a, stream);
}

template <class W, class Out>
cudaError_t launch_epilogue(const GemvArgs& a, cudaStream_t stream) {
  const bool staged = a.norm_weight != nullptr, gated = a.epilogue == GemvEpilogue::kSiluMul;
  if (gated) return staged ? launch_rows<W, Out, true, true>(a, stream) : launch_rows<W, Out, false, true>(a, stream);
  return staged ? launch_rows<W, Out, true, false>(a, stream) : launch_rows<W, Out, false, false>(a, stream);
}

template <class W>
cudaError_t launch_weights(const GemvArgs& a, cudaStream_t stream) {
  return a.out_dtype == DType::kF32 ? launch_epilogue<W, float>(a, stream) : launch_epilogue<W, bf16>(a, stream);
}

}  // namespace

bool gemv_supports(const GemvArgs& a) {
  const bool fp8 = a.w_dtype == DType::kF8E4M3;
  if (!fp8 && a.w_dtype != DType::kBF16) return false;
  if (a.out_dtype != DType::kBF16 && a.out_dtype != DType::kF32) return false;
  if (a.m < 1 || a.k % (fp8 ? 16 : 8) != 0) return false;
  if (!aligned16(a.x) || !aligned16(a.w) || (fp8 && a.scale == nullptr)) return false;
  if (a.m > (a.norm_weight != nullptr ? kGemvMaxNormRows
             : a.epilogue == GemvEpilogue::kSiluMul ? kGemvMaxGatedRows
                                                    : kGemvMaxRows)) {
    return false;
  }
  if (a.epilogue == GemvEpilogue::kSiluMul && a.n % 2 != 0) return false;
  return a.norm_weight == nullptr || (aligned16(a.norm_weight) && staged_bytes(a) <= kMaxStagedBytes);
}

cudaError_t launch_gemv(const GemvArgs& a, cudaStream_t stream) {
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  if (!gemv_supports(a)) return cudaErrorInvalidValue;
  return a.w_dtype == DType::kF8E4M3 ? launch_weights<uint8_t>(a, stream) : launch_weights<bf16>(a, stream);
}

bool gemv_rope_epilogue_supports(const GemvArgs& a, const QkvPrologueParams& q) {
  // The normed single row that launch_rows streams in passes of kNR rows a warp (whose sums the
  // two ops' fused_linear forms in the same order), whole heads of pairs per row group.
  const bool fp8_weights = a.w_dtype == DType::kF8E4M3;
  const int64_t chunk_weights = fp8_weights ? 16 : 8, weight_bytes = fp8_weights ? 1 : 2;
  constexpr int kPairsPerGroup = kWarps * kNR / 2;
  return gemv_supports(a) && a.m == 1 && q.tokens == 1 && a.norm_weight != nullptr && a.out_dtype == DType::kBF16 &&
         a.epilogue == GemvEpilogue::kStore && q.q_norm == nullptr && q.k_norm == nullptr && q.x_scale == nullptr &&
         q.neox && q.head_dim > 0 && q.rotary_dim == q.head_dim && q.head_dim % (2 * kPairsPerGroup) == 0 &&
         a.n == static_cast<int64_t>(q.num_q_heads + 2 * q.num_kv_heads) * q.head_dim &&
         !one_pass(a, chunk_weights, weight_bytes) && !short_rows(a, chunk_weights);
}

cudaError_t launch_gemv_rope_epilogue(const GemvArgs& a, const QkvPrologueParams& q, cudaStream_t stream) {
  if (!gemv_rope_epilogue_supports(a, q)) return cudaErrorInvalidValue;
  if (a.w_dtype == DType::kF8E4M3) {
    if (q.cache_fp8) return launch_typed<uint8_t, 1, bf16, true, false, kNR, kUnroll, 1>(a, stream, RopeInto<fp8>{q});
    return launch_typed<uint8_t, 1, bf16, true, false, kNR, kUnroll, 1>(a, stream, RopeInto<bf16>{q});
  }
  if (q.cache_fp8) return launch_typed<bf16, 1, bf16, true, false, kNR, kUnroll, 1>(a, stream, RopeInto<fp8>{q});
  return launch_typed<bf16, 1, bf16, true, false, kNR, kUnroll, 1>(a, stream, RopeInto<bf16>{q});
}

}  // namespace specula::cuda
