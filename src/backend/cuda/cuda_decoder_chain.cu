// A greedy decode chain of a small Llama-family decoder in ONE persistent kernel
// (Backend::decoder_greedy_chain): `steps` decode steps of a few rows each, every step's argmax
// feeding the next step's input, for the draft model's drafts 2..k.
//
// Why one kernel: a small draft (2 layers, hidden 128) decodes a step in ~24 kernels of a few
// microseconds each, and at such sizes a kernel's cost is its launch and its wait for the
// previous kernel, not its work: on the H100 a draft step cost ~67 us in a CUDA graph against
// ~245 us for the 8-layer target, which capped speculation at concurrency 1 at ~1.6x. Here the
// blocks stay resident (cooperative launch) and meet at grid barriers only where a stage needs
// every block's results: twice per layer and once per step.
//
// Stages (the small projections are computed redundantly by each block that needs their whole
// output, which costs a few tens of KB of L2 reads instead of a barrier):
//   A. a block per (row, kv head): the row's residual (its token's embedding at layer 0, else the
//      previous layer's residual plus its down_proj of the row's activation), RMSNorm, the q
//      heads of the kv group and the k and v heads (Qwen3 q/k norm, rope), k/v into the paged
//      cache, then attention of those q heads over keys 0..position (scores in shared memory,
//      exact softmax).                                                          -> barrier
//   B. o_proj of every row (redundant per block) + residual, RMSNorm, and the block's slice of
//      gate_up with SiLU(gate) * up.                                            -> barrier
//   after the last layer, F: down_proj + residual of every row (redundant), final norm, the
//      block's slice of lm_head with its best (value, index) per row.         -> barrier
//   then every block reduces the candidates to the step's tokens (block 0 stores them).
//
// Numerics follow the layer-by-layer path: every value that path stores in bf16 (normed inputs,
// projections, q/k after norm and rope, attention output, residual, activation) is rounded to
// bf16 here at the same point, sums are fp32, logits fp32; so drafts equal the unfused path's
// except where two logits are within rounding of each other.
//
// Memory ordering: values written by other blocks during the kernel (scratch, KV cache,
// candidates) are read with ld.global.cg (L2, not L1: an SM's L1 may hold a line from an earlier
// step); grid.sync() orders the writes before the reads.
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_decoder_chain.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Shared memory after the two planned areas: tokens, reduction slots, per-warp argmax candidates.
constexpr int kSmemTailBytes = (kMaxChainRows + 32 + 2 * kWarps * kMaxChainRows) * 4;


struct ChainSmem {
  bf16* xs;        // [rows][kmax]: GEMV input rows (bf16, as stored)
  float* f;        // float work area (per stage, see plan_decoder_chain)
  int32_t* tok;    // [kMaxChainRows]: this step's input tokens
  float* red;      // [32]: block reductions
  float* bestv;    // [kWarps][kMaxChainRows]
  int32_t* besti;  // [kWarps][kMaxChainRows]
};

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float bias_at(const bf16* b, int64_t i) { return b ? __bfloat162float(b[i]) : 0.0f; }

// 8 bf16 written earlier in this kernel by another block (L2, bypassing L1).
__device__ __forceinline__ uint4 ld_cg16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ void unpack8(uint4 v, float (&out)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// One warp computes columns [begin, end) of y[r][c] = xs[r] . W[c] (W row-major [N, K], K a
// multiple of 8) for `rows` rows. Short rows (the small models this kernel is for have K = 128)
// would leave most lanes idle with a warp per column, so a column gets just enough lanes for one
// 16-byte load each per pass (lpc) and a warp works on 32 / lpc columns at once, NC each, so that
// the weight loads of several columns are in flight together. emit(r, c, sum) runs on one lane.
template <int NC, class Emit>
__device__ __forceinline__ void warp_columns(const bf16* __restrict__ w, int k_dim, const bf16* xs, int ld, int rows,
                                             int begin, int end, Emit emit) {
  const int lane = threadIdx.x & 31;
  int lpc = 32;
  while (lpc > 1 && lpc * 8 > k_dim) lpc >>= 1;
  const int groups = 32 / lpc, grp = lane / lpc, gl = lane % lpc;
  for (int base = begin; base < end; base += groups * NC) {
    float acc[NC][kMaxChainRows];
    int64_t cols[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = base + grp * NC + c;
      cols[c] = col < end ? col : begin;
#pragma unroll
      for (int r = 0; r < kMaxChainRows; ++r) acc[c][r] = 0.0f;
    }
    for (int k = gl * 8; k < k_dim; k += lpc * 8) {
      uint4 wv[NC];
#pragma unroll
      for (int c = 0; c < NC; ++c) wv[c] = __ldg(reinterpret_cast<const uint4*>(w + cols[c] * k_dim + k));
#pragma unroll
      for (int r = 0; r < kMaxChainRows; ++r) {
        if (r >= rows) break;
        float x[8];
        unpack8(*reinterpret_cast<const uint4*>(xs + r * ld + k), x);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          float wf[8];
          unpack8(wv[c], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[c][r] = fmaf(wf[i], x[i], acc[c][r]);
        }
      }
    }
    for (int off = lpc / 2; off > 0; off >>= 1)
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int r = 0; r < kMaxChainRows; ++r) acc[c][r] += __shfl_xor_sync(0xffffffffu, acc[c][r], off);
    if (gl == 0)
#pragma unroll
      for (int c = 0; c < NC; ++c)
        if (base + grp * NC + c < end)
#pragma unroll
          for (int r = 0; r < kMaxChainRows; ++r)
            if (r < rows) emit(r, static_cast<int>(cols[c]), acc[c][r]);
  }
}

// The block's warps share columns [begin, end) in contiguous runs.
template <int NC, class Emit>
__device__ __forceinline__ void block_columns(const bf16* w, int k_dim, const bf16* xs, int ld, int rows, int begin,
                                              int end, Emit emit) {
  const int warp = threadIdx.x >> 5, per = (end - begin + kWarps - 1) / kWarps;
  const int b = begin + warp * per, e = min(end, b + per);
  if (b < e) warp_columns<NC>(w, k_dim, xs, ld, rows, b, e, emit);
}

// xs[r] = bf16(w * (x_r / rms(x_r))) for rows whose fp32 values (bf16-exact) are in src[r * h].
__device__ void norm_rows(const float* src, int rows, int h, const bf16* w, float eps, bf16* xs) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < rows; r += kWarps) {
    float sum_sq = 0.0f;
    for (int k = lane; k < h; k += 32) sum_sq += src[r * h + k] * src[r * h + k];
    const float inv = rsqrtf(warp_sum(sum_sq) / static_cast<float>(h) + eps);
    for (int k = lane; k < h; k += 32) xs[r * h + k] = __float2bfloat16_rn(__bfloat162float(w[k]) * (src[r * h + k] * inv));
  }
  __syncthreads();
}

// dst[i] = src[i] for n bf16 written by other blocks (n a multiple of 8).
__device__ __forceinline__ void load_bf16(const bf16* src, int n, bf16* dst) {
  for (int i = threadIdx.x * 8; i < n; i += kThreads * 8) *reinterpret_cast<uint4*>(dst + i) = ld_cg16(src + i);
}

// Row r's residual at column c as stored: the step's token embedding until layer 0's o_proj
// adds to it, else the scratch residual (written by other blocks: through L2).
__device__ __forceinline__ float residual_at(const DecoderChainParams& p, const ChainSmem& s, bool embed, int r,
                                             int c) {
  return embed ? __bfloat162float(p.embed[static_cast<int64_t>(s.tok[r]) * p.hidden + c])
               : __bfloat162float(__ldcg(p.res + static_cast<int64_t>(r) * p.hidden + c));
}

// dst[r * h + c] = residual row r (fp32, bf16-exact) for every row.
__device__ void load_residual(const DecoderChainParams& p, const ChainSmem& s, bool embed, int rows, float* dst) {
  for (int i = threadIdx.x; i < rows * p.hidden; i += kThreads) dst[i] = residual_at(p, s, embed, i / p.hidden, i % p.hidden);
  __syncthreads();
}

// The columns [b * n, (b + 1) * n) of `total` that block b owns in a column-split stage.
__device__ __forceinline__ bool block_slice(int n, int total, int& begin, int& end) {
  begin = blockIdx.x * n;
  end = min(total, begin + n);
  return begin < end;
}

// Stage A, task (row r, q head h): RMSNorm of the row's residual, the q head's and its kv group's
// k and v columns of qkv, Qwen3 q/k norm and rope, k/v into the cache (the group's first q head's
// block writes them), then attention of q over keys 0..position.
__device__ void attention_task(const DecoderChainParams& p, const ChainSmem& s, int layer, int step, int r, int h) {
  const DecoderChainLayer& L = p.layers[layer];
  const int hd = p.hidden, hq = p.num_q_heads, hk = p.num_kv_heads, d = p.head_dim, g = h / (hq / hk);
  const int chunks = d / 8, groups = kThreads / chunks;
  float* res = s.f;              // [hd]
  float* hv = res + hd;          // [3 d]: q, k, v
  float* part = hv + 3 * d;      // [groups][d]
  float* scores = part + groups * d;  // [max_context]
  const int64_t at = static_cast<int64_t>(step) * p.rows + r;
  const int32_t pos = p.positions[at];
  const int64_t slot = p.slots[at];
  const bool own = slot >= 0 && slot < p.num_slots;
  const bool writer = own && h % (hq / hk) == 0;

  for (int c = threadIdx.x; c < hd; c += kThreads) res[c] = residual_at(p, s, layer == 0, r, c);
  __syncthreads();
  norm_rows(res, 1, hd, L.in_norm, p.eps, s.xs);
  const int nq = hq * d, nk = hk * d, q0 = h * d, k0 = nq + g * d, v0 = nq + nk + g * d;
  block_columns<1>(L.qkv, hd, s.xs, hd, 1, q0, q0 + d,
                   [&](int, int c, float v) { hv[c - q0] = round_bf16(v + bias_at(L.qkv_bias, c)); });
  block_columns<1>(L.qkv, hd, s.xs, hd, 1, k0, k0 + d,
                   [&](int, int c, float v) { hv[d + c - k0] = round_bf16(v + bias_at(L.qkv_bias, c)); });
  block_columns<1>(L.qkv, hd, s.xs, hd, 1, v0, v0 + d,
                   [&](int, int c, float v) { hv[2 * d + c - v0] = round_bf16(v + bias_at(L.qkv_bias, c)); });
  __syncthreads();
  // Warp 0: q, warp 1: k (norm, rope; k into the cache), warp 2: v into the cache.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < 3) {
    float* x = hv + warp * d;
    if (warp == 2) {
      if (writer)
        for (int i = lane; i < d; i += 32) L.v_cache[(slot * hk + g) * d + i] = __float2bfloat16_rn(x[i]);
    } else {
      const bf16* norm = warp == 1 ? L.k_norm : L.q_norm;
      if (norm != nullptr) {
        float sum_sq = 0.0f;
        for (int i = lane; i < d; i += 32) sum_sq += x[i] * x[i];
        const float inv = rsqrtf(warp_sum(sum_sq) / static_cast<float>(d) + p.eps);
        for (int i = lane; i < d; i += 32) x[i] = round_bf16(__bfloat162float(norm[i]) * (x[i] * inv));
        __syncwarp();
      }
      if (pos >= 0 && pos < p.max_pos && p.rotary_dim > 0) {
        const int half = p.rotary_dim / 2;
        const float* cs = p.cos_sin + static_cast<int64_t>(pos) * p.rotary_dim;
        for (int j = lane; j < half; j += 32) {  // neox pairs (j, j + half), each pair one lane's
          const float a = x[j], b = x[j + half];
          x[j] = round_bf16(a * cs[j] - b * cs[half + j]);
          x[j + half] = round_bf16(b * cs[j] + a * cs[half + j]);
        }
      }
      __syncwarp();
      if (warp == 1 && writer)
        for (int i = lane; i < d; i += 32) L.k_cache[(slot * hk + g) * d + i] = __float2bfloat16_rn(x[i]);
    }
  }
  __syncthreads();

  // Attention over keys 0..pos; the row's own key and value straight from hv when it writes
  // them (the cache entry is being written by its group's first block), else from the cache.
  const int len = pos + 1;
  const int32_t* table = p.block_tables + static_cast<int64_t>(r) * p.table_width;
  const float* q = hv;
  const float* kself = hv + d;
  const float* vself = hv + 2 * d;
  auto key_slot = [&](int t) { return static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size; };
  float mx = -INFINITY;
  for (int t = threadIdx.x; t < len; t += kThreads) {
    float dot = 0.0f;
    if (t == pos && own) {
      for (int c = 0; c < d; ++c) dot = fmaf(q[c], kself[c], dot);
    } else {
      const bf16* kp = L.k_cache + (key_slot(t) * hk + g) * d;
      for (int c = 0; c < d; c += 8) {
        float kf[8];
        unpack8(ld_cg16(kp + c), kf);
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = fmaf(q[c + i], kf[i], dot);
      }
    }
    const float sc = dot * p.scale;
    scores[t] = sc;
    mx = fmaxf(mx, sc);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) s.red[warp] = mx;
  __syncthreads();
  float bmax = -INFINITY;
  for (int w = 0; w < kWarps; ++w) bmax = fmaxf(bmax, s.red[w]);
  float sum = 0.0f;
  for (int t = threadIdx.x; t < len; t += kThreads) {
    const float e = __expf(scores[t] - bmax);
    scores[t] = e;
    sum += e;
  }
  sum = block_sum(sum, s.red);  // its barriers also publish scores[]
  // p . V: thread (grp, chunk) sums keys grp, grp + groups, ... of its 8 dims, four keys' loads
  // in flight at a time.
  const int grp = threadIdx.x / chunks, chunk = threadIdx.x % chunks;
  if (grp < groups) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    auto value = [&](int t, float (&vf)[8]) {
      if (t == pos && own) {
#pragma unroll
        for (int i = 0; i < 8; ++i) vf[i] = vself[chunk * 8 + i];
      } else {
        unpack8(ld_cg16(L.v_cache + (key_slot(t) * hk + g) * d + chunk * 8), vf);
      }
    };
    int t = grp;
    for (; t + 3 * groups < len; t += 4 * groups) {
      float v0f[8], v1f[8], v2f[8], v3f[8];
      value(t, v0f);
      value(t + groups, v1f);
      value(t + 2 * groups, v2f);
      value(t + 3 * groups, v3f);
      const float w0 = scores[t], w1 = scores[t + groups], w2 = scores[t + 2 * groups], w3 = scores[t + 3 * groups];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += w0 * v0f[i] + w1 * v1f[i] + w2 * v2f[i] + w3 * v3f[i];
    }
    for (; t < len; t += groups) {
      float vf[8];
      value(t, vf);
      const float w = scores[t];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(w, vf[i], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) part[grp * d + chunk * 8 + i] = acc[i];
  }
  __syncthreads();
  bf16* out = p.attn + static_cast<int64_t>(r) * nq + q0;
  for (int i = threadIdx.x; i < d; i += kThreads) {
    float v = 0.0f;
    for (int gi = 0; gi < groups; ++gi) v += part[gi * d + i];
    out[i] = __float2bfloat16_rn(v / sum);
  }
}

// Stages O and D: res[r][c] = bf16(residual + bf16(x[r] . W[c] + b[c])) for this block's columns
// of every row, x = attention output (o_proj) or activation (down_proj).
__device__ void residual_stage(const DecoderChainParams& p, const ChainSmem& s, bool embed, const bf16* x, int k_dim,
                               const bf16* w, const bf16* bias) {
  int c0, c1;
  if (!block_slice(p.hidden_per_block, p.hidden, c0, c1)) return;
  load_bf16(x, p.rows * k_dim, s.xs);
  __syncthreads();
  block_columns<1>(w, k_dim, s.xs, k_dim, p.rows, c0, c1, [&](int r, int c, float v) {
    const float updated = residual_at(p, s, embed, r, c) + round_bf16(v + bias_at(bias, c));
    p.res[static_cast<int64_t>(r) * p.hidden + c] = __float2bfloat16_rn(updated);
  });
}

// Stage G: post-attention RMSNorm of every row, this block's gate_up columns, SiLU(gate) * up.
__device__ void gate_up_stage(const DecoderChainParams& p, const ChainSmem& s, int layer) {
  const DecoderChainLayer& L = p.layers[layer];
  const int h = p.hidden, rows = p.rows, inter = p.intermediate, cpb = p.gate_cols_per_block;
  int j0, j1;
  if (!block_slice(cpb, inter, j0, j1)) return;
  float* res = s.f;            // [rows][h]
  float* gu = res + rows * h;  // [rows][2 cpb]
  load_residual(p, s, false, rows, res);
  norm_rows(res, rows, h, L.post_norm, p.eps, s.xs);
  block_columns<2>(L.gate_up, h, s.xs, h, rows, j0, j1, [&](int r, int j, float v) {
    gu[r * 2 * cpb + (j - j0)] = round_bf16(v + bias_at(L.gate_up_bias, j));
  });
  block_columns<2>(L.gate_up, h, s.xs, h, rows, inter + j0, inter + j1, [&](int r, int j, float v) {
    gu[r * 2 * cpb + cpb + (j - inter - j0)] = round_bf16(v + bias_at(L.gate_up_bias, j));
  });
  __syncthreads();
  for (int i = threadIdx.x; i < rows * (j1 - j0); i += kThreads) {
    const int r = i / (j1 - j0), j = i % (j1 - j0);
    const float gt = gu[r * 2 * cpb + j], up = gu[r * 2 * cpb + cpb + j];
    p.act[static_cast<int64_t>(r) * inter + j0 + j] = __float2bfloat16_rn(gt / (1.0f + __expf(-gt)) * up);
  }
}

// Stage F: final RMSNorm, this block's lm_head columns, its best (value, index) per row.
__device__ void lm_head_stage(const DecoderChainParams& p, const ChainSmem& s) {
  const int h = p.hidden, rows = p.rows;
  int v0, v1;
  if (!block_slice(p.vocab_per_block, p.vocab, v0, v1)) return;
  float* res = s.f;  // [rows][h]
  load_residual(p, s, false, rows, res);
  norm_rows(res, rows, h, p.final_norm, p.eps, s.xs);
  float best[kMaxChainRows];
  int best_i[kMaxChainRows];
#pragma unroll
  for (int r = 0; r < kMaxChainRows; ++r) {
    best[r] = -INFINITY;
    best_i[r] = INT_MAX;
  }
  block_columns<4>(p.lm_head, h, s.xs, h, rows, v0, v1, [&](int r, int c, float v) {
#pragma unroll
    for (int i = 0; i < kMaxChainRows; ++i)  // registers, not a dynamically indexed array
      if (i == r && argmax_better(v, c, best[i], best_i[i])) {
        best[i] = v;
        best_i[i] = c;
      }
  });
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < kMaxChainRows; ++r) {
    float bv = best[r];
    int bi = best_i[r];
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (argmax_better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if ((threadIdx.x & 31) == 0) {
      s.bestv[warp * kMaxChainRows + r] = bv;
      s.besti[warp * kMaxChainRows + r] = bi;
    }
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int w = 0; w < kWarps; ++w)
      if (argmax_better(s.bestv[w * kMaxChainRows + r], s.besti[w * kMaxChainRows + r], bv, bi)) {
        bv = s.bestv[w * kMaxChainRows + r];
        bi = s.besti[w * kMaxChainRows + r];
      }
    p.cand_val[blockIdx.x * kMaxChainRows + r] = bv;
    p.cand_idx[blockIdx.x * kMaxChainRows + r] = bi;
  }
}

// The step's input tokens: the given first tokens, or the argmax over the lm_head blocks'
// candidates of the previous step (block 0 stores it as that step's output).
__device__ void load_step_tokens(const DecoderChainParams& p, const ChainSmem& s, int step) {
  if (threadIdx.x < p.rows) {
    const int r = threadIdx.x;
    int32_t tok;
    if (step == 0) {
      tok = p.first_tokens[r];
    } else {
      float bv = -INFINITY;
      int bi = INT_MAX;
      for (int b = 0; b < p.vocab_blocks; ++b) {
        const float v = __ldcg(p.cand_val + b * kMaxChainRows + r);
        const int i = __ldcg(p.cand_idx + b * kMaxChainRows + r);
        if (argmax_better(v, i, bv, bi)) {
          bv = v;
          bi = i;
        }
      }
      tok = bi == INT_MAX ? 0 : bi;
      if (blockIdx.x == 0) p.out_tokens[static_cast<int64_t>(step - 1) * p.rows + r] = tok;
    }
    s.tok[r] = tok < 0 || tok >= p.vocab ? 0 : tok;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) decoder_chain_kernel(DecoderChainParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ChainSmem s;
  s.xs = reinterpret_cast<bf16*>(smem_raw);
  s.f = reinterpret_cast<float*>(smem_raw + p.smem_xs_bytes);
  s.tok = reinterpret_cast<int32_t*>(smem_raw + p.smem_xs_bytes + p.smem_f_bytes);
  s.red = reinterpret_cast<float*>(s.tok + kMaxChainRows);
  s.bestv = s.red + 32;
  s.besti = reinterpret_cast<int32_t*>(s.bestv + kWarps * kMaxChainRows);  // kSmemTailBytes in all
  cg::grid_group grid = cg::this_grid();
  const int tasks = p.rows * p.num_q_heads;
  for (int step = 0; step <= p.steps; ++step) {
    load_step_tokens(p, s, step);
    if (step == p.steps) break;
    for (int layer = 0; layer < p.num_layers; ++layer) {
      const DecoderChainLayer& L = p.layers[layer];
      for (int task = blockIdx.x; task < tasks; task += gridDim.x) {
        attention_task(p, s, layer, step, task / p.num_q_heads, task % p.num_q_heads);
        __syncthreads();
      }
      grid.sync();
      residual_stage(p, s, layer == 0, p.attn, p.num_q_heads * p.head_dim, L.o, L.o_bias);
      grid.sync();
      gate_up_stage(p, s, layer);
      grid.sync();
      residual_stage(p, s, false, p.act, p.intermediate, L.down, L.down_bias);
      grid.sync();
    }
    lm_head_stage(p, s);
    grid.sync();
  }
}

}  // namespace

DecoderChainPlan plan_decoder_chain(const DecoderChainParams& p, int sm_count) {
  DecoderChainPlan plan;
  const int d = p.head_dim, chunks = d / 8, groups = chunks > 0 ? kThreads / chunks : 0;
  const int kmax = std::max({p.hidden, p.num_q_heads * p.head_dim, p.intermediate});
  // Blocks: one per (row, kv head) in stage A; stage B's gate_up columns in slices of at least 16
  // per block (2 per warp); lm_head columns in slices of at least 128.
  plan.gate_cols_per_block = std::max(16, (p.intermediate + sm_count - 1) / sm_count);
  const int gate_blocks = (p.intermediate + plan.gate_cols_per_block - 1) / plan.gate_cols_per_block;
  plan.vocab_per_block = std::max(128, (p.vocab + sm_count - 1) / sm_count);
  plan.vocab_blocks = (p.vocab + plan.vocab_per_block - 1) / plan.vocab_per_block;
  plan.hidden_per_block = 8;  // a column per warp
  const int hidden_blocks = (p.hidden + plan.hidden_per_block - 1) / plan.hidden_per_block;
  plan.blocks = std::min(std::max({p.rows * p.num_q_heads, gate_blocks, plan.vocab_blocks, hidden_blocks}), sm_count);
  plan.blocks = std::min(plan.blocks, kMaxChainBlocks);
  plan.smem_xs_bytes = (static_cast<int64_t>(p.rows) * kmax * 2 + 15) / 16 * 16;
  const int64_t a_floats = p.hidden + 3LL * d + static_cast<int64_t>(groups) * d + p.max_context;
  const int64_t b_floats = static_cast<int64_t>(p.rows) * p.hidden + 2LL * p.rows * plan.gate_cols_per_block;
  plan.smem_f_bytes = (std::max(a_floats, b_floats) * 4 + 15) / 16 * 16;
  plan.smem_bytes = plan.smem_xs_bytes + plan.smem_f_bytes + kSmemTailBytes;
  return plan;
}

cudaError_t launch_decoder_chain(const DecoderChainParams& params, int blocks, cudaStream_t stream) {
  DecoderChainParams p = params;
  const int smem = static_cast<int>(p.smem_xs_bytes + p.smem_f_bytes + kSmemTailBytes);
  // The attribute is per kernel; the largest size asked so far stays set.
  static int configured_smem = 48 * 1024;
  static const cudaError_t carveout = [] {
    // As much L1 as the shared memory leaves: each block re-reads its slices of the weights
    // (~100 KB for the embedded draft) every step, which L1 can then serve instead of L2.
    return cudaFuncSetAttribute(decoder_chain_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxL1);
  }();
  if (carveout != cudaSuccess) return carveout;
  // How many blocks can be co-resident at this shared-memory size: queried once per size (the
  // launch is on the draft's every step).
  static int capacity_smem = -1, capacity = 0;
  if (smem > configured_smem) {
    const cudaError_t e = cudaFuncSetAttribute(decoder_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    configured_smem = smem;
  }
  if (smem != capacity_smem) {
    int per_sm = 0, device = 0, sms = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decoder_chain_kernel, kThreads, smem);
    if (e != cudaSuccess) return e;
    if ((e = cudaGetDevice(&device)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return e;
    capacity = per_sm * sms;
    capacity_smem = smem;
  }
  if (blocks <= 0 || blocks > kMaxChainBlocks || capacity < blocks) return cudaErrorCooperativeLaunchTooLarge;
  void* args[] = {&p};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(decoder_chain_kernel), dim3(blocks),
                                     dim3(kThreads), args, static_cast<size_t>(smem), stream);
}

}  // namespace specula::cuda
