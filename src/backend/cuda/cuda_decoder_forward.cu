// One forward of a small Llama-family decoder in ONE kernel launch (Backend::decoder_forward):
// every layer, attention over the paged cache included, then the final norm and lm_head, for up
// to 16 rows (decode steps, speculative verification, short chunks).
//
// Why: a small model's layer-by-layer step is ~7 kernels a layer whose cost is their launch and
// their wait for the previous one, not their bytes (Qwen3-0.6B at batch 1: ~30 us a layer on the
// H200 where its 31.5 MB of weights take ~8 us). Here one block per SM (a cooperative launch, so
// that all are resident) runs the whole step and the blocks meet at grid barriers, five a layer:
//   A. every block: RMSNorm of the rows, its slice of the q/k/v columns            -> barrier
//   C. a block per (row, kv head, key split): q/k norm and RoPE, the row's own K/V into the
//      cache (split 0), attention of the group's q heads over the split's keys (keys of this
//      step's rows come from q/k/v, older ones from the cache) into partials      -> barrier
//   D. every block: the partials merged (each block all of them: a few KB), its slice of o_proj's
//      columns, residual added                                                     -> barrier
//   E. every block: RMSNorm, its slice of the MLP's features (gate and up), SiLU(gate) * up
//                                                                                  -> barrier
//   F. every block: its slice of down_proj's columns, residual added               -> barrier
// then the final norm and each block's slice of lm_head's rows. Every block's slices are fixed,
// so before each phase it asks L2 for the next phase's weights (a TMA bulk prefetch): HBM keeps
// streaming while blocks compute and wait at the barrier, and a phase reads its weights from L2.
// Weights are read once (no reuse between blocks) with 16-byte loads, several columns in flight
// a warp. Measured (SPECULA_FUSED_FORWARD_TRACE): barriers cost ~0.8 us, but each phase 3-9 us
// of dependent round trips to L2 where its weights take 1-3, so the step is still slower than
// the launches it replaces and the backend runs it only when asked (cuda_decoder_forward.cc).
//
// Numerics follow the layer-by-layer path: values it stores in bf16 (normed rows, projections,
// q/k after norm and RoPE, attention output, residual, activation) are rounded to bf16 at the
// same points; sums are fp32 in a fixed order (results do not depend on timing).
//
// Memory ordering: the barrier is a release (__threadfence + atomic) and an acquire (ld.acquire)
// at GPU scope by one thread, between block barriers; data other blocks wrote during the launch
// is read with ld.global.cg (L2), never through L1.
#include "backend/cuda/cuda_decoder_forward.h"

#include <algorithm>

#include "backend/cuda/cuda_kernel_attributes.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kKeyTile = 64;       // keys staged in shared memory at a time (one split of kMinSplitKeys)
constexpr int kMinSplitKeys = 64;  // keys a split takes at least: fewer would leave the merge the larger part
constexpr int64_t kPrefetchPiece = 1 << 16;

__host__ __device__ inline int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }
__host__ __device__ inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__host__ __device__ inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The rows' facts, computed by every block at the start.
struct RowInfo {
  int real_rows;   // rows of sequences (the rest is padding)
  int splits;      // key splits of each (row, kv head)
  int split_keys;  // keys a split covers
  int32_t len[kMaxForwardRows];        // the row attends keys 0..len-1 of its sequence
  int32_t seq[kMaxForwardRows];
  int32_t first_row[kMaxForwardRows];  // its sequence's first row in this batch
  int32_t first_key[kMaxForwardRows];  // that row's key: keys from here on are rows of this batch
  int32_t pos[kMaxForwardRows];
  int32_t token[kMaxForwardRows];
  int64_t slot[kMaxForwardRows];
};

struct Layout {
  int64_t info, xs, sel, gu, xold, q, own, kt, vt, sc, stats, weights, bytes;
  int mlp_slice;  // MLP features a block takes at most
  int h_slice;    // hidden columns a block takes at most
  int key_stride; // floats between staged keys (D + 4: rows 16 bytes apart in bank terms)
};

__host__ __device__ inline Layout forward_layout(const DecoderForwardParams& p, int blocks) {
  Layout l{};
  const int64_t rows = p.rows, h = p.hidden, d = p.head_dim, gq = p.num_q_heads / p.num_kv_heads;
  const int64_t widest = max64(max64(h, p.intermediate), int64_t{p.num_q_heads} * d);
  l.mlp_slice = (p.intermediate + blocks - 1) / blocks;
  l.h_slice = (p.hidden + blocks - 1) / blocks;
  l.key_stride = static_cast<int>(d + 4);
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t o = at;
    at = align16(at + bytes);
    return o;
  };
  l.info = take(sizeof(RowInfo));
  l.xs = take(rows * widest * 2);
  l.sel = take(max64(p.num_logits, 1) * h * 2);
  l.gu = take(rows * 2 * l.mlp_slice * 4);
  l.xold = take(rows * l.h_slice * 4);
  l.q = take(gq * d * 4);
  l.own = take(2 * d * 4);
  l.kt = take(int64_t{kKeyTile} * l.key_stride * 4);
  l.vt = take(int64_t{kKeyTile} * l.key_stride * 4);
  l.sc = take(gq * kKeyTile * 4);
  l.stats = take(3 * gq * 4);
  l.weights = take(rows * p.num_q_heads * int64_t{kMaxForwardSplits} * 4);
  l.bytes = at;
  return l;
}

struct Smem {
  RowInfo* info;
  bf16 *xs, *sel;
  float *gu, *xold, *q, *own, *kt, *vt, *sc, *stats, *weights;
  int mlp_slice, h_slice, key_stride;
};

__device__ Smem smem_pointers(unsigned char* base, const Layout& l) {
  Smem s;
  s.info = reinterpret_cast<RowInfo*>(base + l.info);
  s.xs = reinterpret_cast<bf16*>(base + l.xs);
  s.sel = reinterpret_cast<bf16*>(base + l.sel);
  s.gu = reinterpret_cast<float*>(base + l.gu);
  s.xold = reinterpret_cast<float*>(base + l.xold);
  s.q = reinterpret_cast<float*>(base + l.q);
  s.own = reinterpret_cast<float*>(base + l.own);
  s.kt = reinterpret_cast<float*>(base + l.kt);
  s.vt = reinterpret_cast<float*>(base + l.vt);
  s.sc = reinterpret_cast<float*>(base + l.sc);
  s.stats = reinterpret_cast<float*>(base + l.stats);
  s.weights = reinterpret_cast<float*>(base + l.weights);
  s.mlp_slice = l.mlp_slice;
  s.h_slice = l.h_slice;
  s.key_stride = l.key_stride;
  return s;
}

// Block b's share [begin, end) of n columns.
struct Slice {
  int begin, end;
};
__device__ __forceinline__ Slice slice_of(int n) {
  return {static_cast<int>(int64_t{n} * blockIdx.x / gridDim.x), static_cast<int>(int64_t{n} * (blockIdx.x + 1) / gridDim.x)};
}

// A grid-wide barrier over one counter that only grows during the launch (barrier k waits for
// k * gridDim.x arrivals); the last block out resets it for the next launch.
struct GridBarrier {
  unsigned* counter;
  unsigned passed = 0;
  __device__ void sync() {
    __syncthreads();
    ++passed;
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      const unsigned target = passed * gridDim.x;
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      } while (seen < target);
    }
    __syncthreads();
  }
  __device__ void finish() {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
      counter[0] = 0;  // every block is past its last barrier
      counter[1] = 0;
    }
  }
};

// SPECULA_FUSED_FORWARD_TRACE: each block's time at each event (cuda_decoder_forward.h).
__device__ __forceinline__ void trace(const DecoderForwardParams& p, int event) {
  if (p.trace == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  p.trace[blockIdx.x * kForwardTraceEvents + event] = t;
}

// Asks L2 for [ptr, ptr + bytes) (16-byte aligned) with TMA bulk prefetches, from one thread.
__device__ void prefetch_l2(const void* ptr, int64_t bytes) {
  if (threadIdx.x != 0 || ptr == nullptr) return;
  const char* p = static_cast<const char*>(ptr);
  for (int64_t off = 0; off + 16 <= bytes; off += kPrefetchPiece) {
    const unsigned n = static_cast<unsigned>(min64(kPrefetchPiece, bytes - off)) & ~15u;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
  }
}
// This block's rows [begin, end) of a [n, k] weight into L2.
__device__ void prefetch_rows(const bf16* w, int n, int64_t k) {
  const Slice sl = slice_of(n);
  prefetch_l2(w + sl.begin * k, (sl.end - sl.begin) * k * 2);
}

// y[r][c] = xs[r] . row_of(c) for columns [begin, end) and `rows` rows (at most R): a warp takes
// NC columns at a time, its lanes splitting K in 16-byte loads (K a multiple of 8), so that 4 NC
// loads a lane are in flight together (a block's slice of a phase is then one or two round trips
// to L2). emit(r, c, sum) runs on lane 0.
template <int R, int NC, class RowOf, class Emit>
__device__ __forceinline__ void gemv(RowOf row_of, int k_dim, const bf16* xs, int ldx, int rows, int begin, int end,
                                     Emit emit) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int c0 = begin + warp * NC; c0 < end; c0 += kWarps * NC) {
    float acc[NC][R];
    const bf16* w[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      w[c] = row_of(min(c0 + c, end - 1));
#pragma unroll
      for (int r = 0; r < R; ++r) acc[c][r] = 0.0f;
    }
#pragma unroll 4
    for (int k = lane * 8; k < k_dim; k += 256) {
      float wf[NC][8];
#pragma unroll
      for (int c = 0; c < NC; ++c) unpack8(c0 + c < end ? load_streaming(w[c] + k) : make_uint4(0, 0, 0, 0), wf[c]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        float x[8];
        unpack8(*reinterpret_cast<const uint4*>(xs + r * ldx + k), x);
#pragma unroll
        for (int c = 0; c < NC; ++c)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[c][r] = fmaf(wf[c][i], x[i], acc[c][r]);
      }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < rows) acc[c][r] = warp_sum(acc[c][r]);
    if (lane == 0)
#pragma unroll
      for (int c = 0; c < NC; ++c)
        if (c0 + c < end)
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (r < rows) emit(r, c0 + c, acc[c][r]);
  }
}

template <int R>
constexpr int columns_a_warp() {
  return R <= 4 ? 4 : R <= 8 ? 2 : 1;
}

// The residual stream at this block's hidden columns stays in s.xold from phase to phase (this
// block alone writes them: phases D and F), so that adding to it costs no round trip; layer 0
// starts from the embeddings.
__device__ void stage_embeddings(const DecoderForwardParams& p, const Smem& s) {
  const Slice sl = slice_of(p.hidden);
  const int n = sl.end - sl.begin, h = p.hidden;
  for (int e = threadIdx.x; e < s.info->real_rows * n; e += kThreads) {
    const int r = e / n, c = sl.begin + e - r * n;
    s.xold[r * s.h_slice + c - sl.begin] = __bfloat162float(p.embed[int64_t{s.info->token[r]} * h + c]);
  }
}

// Every block: the rows' facts (RowInfo) from the attention metadata.
__device__ void load_rows(const DecoderForwardParams& p, const Smem& s) {
  RowInfo& ri = *s.info;
  const int i = threadIdx.x;
  if (i < p.rows) {
    int seq = -1;
    for (int q = 0; q < p.num_seqs; ++q)
      if (p.query_start_loc[q] <= i && i < p.query_start_loc[q + 1]) seq = q;
    ri.seq[i] = seq;
    ri.len[i] = 0;
    ri.first_row[i] = i;
    ri.first_key[i] = 0;
    ri.slot[i] = -1;
    ri.pos[i] = p.positions[i];
    const int32_t t = p.token_ids[i];
    ri.token[i] = t < 0 || t >= p.vocab ? 0 : t;
    if (seq >= 0) {
      const int first = p.query_start_loc[seq], query_len = p.query_start_loc[seq + 1] - first;
      const int first_key = p.seq_lens[seq] - query_len;
      ri.first_row[i] = first;
      ri.first_key[i] = first_key;
      ri.len[i] = max(0, min(first_key + (i - first) + 1, p.table_width * p.block_size));
      const int64_t slot = p.slots[i];
      ri.slot[i] = slot >= 0 && slot < p.num_slots ? slot : -1;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int real = max(0, min(p.query_start_loc[p.num_seqs], p.rows));
    int longest = 1;
    for (int r = 0; r < real; ++r) longest = max(longest, ri.len[r]);
    int splits = min(ceil_div(longest, kMinSplitKeys), kMaxForwardSplits);
    splits = max(1, min(splits, static_cast<int>(gridDim.x) / max(1, real * p.num_kv_heads)));
    ri.real_rows = real;
    ri.splits = splits;
    ri.split_keys = ceil_div(longest, splits);
  }
  __syncthreads();
}

// s.xs[r] = bf16(w * RMSNorm(row r)) for the real rows, a warp a row; the rows are the embeddings
// of the tokens (layer 0's input) or the residual stream.
__device__ void norm_rows(const DecoderForwardParams& p, const Smem& s, bool embeddings, const bf16* w, bf16* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, h = p.hidden;
  for (int r = warp; r < s.info->real_rows; r += kWarps) {
    // One pass over global memory: the row's values (bf16-exact) parked in `out`, then normalised there.
    const uint4* e = reinterpret_cast<const uint4*>(p.embed + static_cast<int64_t>(s.info->token[r]) * h);
    const float4* x = reinterpret_cast<const float4*>(p.x + static_cast<int64_t>(r) * h);
    bf16* o = out + r * h;
    float sum_sq = 0.0f;
    for (int k = lane * 8; k < h; k += 256) {
      float v[8];
      if (embeddings) {
        unpack8(e[k / 8], v);
      } else {
        const float4 a = __ldcg(x + k / 4), b = __ldcg(x + k / 4 + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        sum_sq += v[i] * v[i];
        o[k + i] = __float2bfloat16_rn(v[i]);
      }
    }
    const float inv = rsqrtf(warp_sum(sum_sq) / static_cast<float>(h) + p.eps);
    for (int k = lane * 8; k < h; k += 256)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        o[k + i] = __float2bfloat16_rn(__bfloat162float(w[k + i]) * (__bfloat162float(o[k + i]) * inv));
  }
  __syncthreads();
}

// A warp: one head (D raw q or k values in shared memory) normalised and rotated to `pos` in place.
__device__ void norm_rope_head(const DecoderForwardParams& p, const bf16* norm, int pos, float* x) {
  const bool rope = pos >= 0 && pos < p.max_pos && p.rotary_dim > 0;
  warp_norm_rope_head(x, p.head_dim, norm, p.eps, rope ? p.cos_sin + static_cast<int64_t>(pos) * p.rotary_dim : nullptr,
                      p.rotary_dim);
}

// n floats from global memory written during this launch (L2) into shared memory, 16 bytes a thread.
__device__ __forceinline__ void copy_floats(float* dst, const float* src, int n) {
  for (int e = threadIdx.x; e < n / 4; e += kThreads)
    reinterpret_cast<float4*>(dst)[e] = __ldcg(reinterpret_cast<const float4*>(src) + e);
}

// Phase A: q/k/v columns of this block.
template <int R>
__device__ void qkv_phase(const DecoderForwardParams& p, const Smem& s, int layer) {
  const DecoderChainLayer& L = p.layers[layer];
  const int h = p.hidden, n = (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim;
  prefetch_rows(L.o, h, int64_t{p.num_q_heads} * p.head_dim);  // phase D's
  norm_rows(p, s, layer == 0, L.in_norm, s.xs);
  const Slice sl = slice_of(n);
  gemv<R, columns_a_warp<R>()>([&](int c) { return L.qkv + static_cast<int64_t>(c) * h; }, h, s.xs, h,
                               s.info->real_rows, sl.begin, sl.end, [&](int r, int c, float v) {
                                 p.qkv[static_cast<int64_t>(r) * n + c] = round_bf16(v + bias_at(L.qkv_bias, c));
                               });
}

// Phase C, one unit: row i's q heads of kv group g over keys [split * split_keys, ..) into the
// partials (running max, sum of exponentials, unnormalised p . V); split 0 also writes the row's
// K/V into the cache (no unit of this launch reads that slot from the cache: this batch's keys
// come from q/k/v). Each tile's loads (and the first one's q and own K/V) are issued together: one
// round trip to L2 a tile.
__device__ void attention_unit(const DecoderForwardParams& p, const Smem& s, int layer, int i, int g, int split) {
  const DecoderChainLayer& L = p.layers[layer];
  const RowInfo& ri = *s.info;
  const int d = p.head_dim, hq = p.num_q_heads, hk = p.num_kv_heads, gq = hq / hk, ks = s.key_stride;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int seq = ri.seq[i], first_key = ri.first_key[i], first_row = ri.first_row[i];
  const int t0 = split * ri.split_keys, t1 = min(ri.len[i], t0 + ri.split_keys);
  const int64_t n_qkv = int64_t{hq + 2 * hk} * d;
  const bool own = split == 0 && ri.slot[i] >= 0;
  const int chunks = d / 8;
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.table_width;

  // K and V rows of keys [tile, tile + nt): older keys from the cache, this batch's from q/k/v
  // (k raw: rotated after the barrier).
  auto stage = [&](int tile, int nt) {
    for (int e = threadIdx.x; e < nt * chunks; e += kThreads) {
      const int kk = e / chunks, c = e - kk * chunks, t = tile + kk;
      float* kt = s.kt + kk * ks + c * 8;
      float* vt = s.vt + kk * ks + c * 8;
      if (t < first_key) {
        const int64_t slot = static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size;
        const int64_t at = (slot * hk + g) * d + c * 8;
        float kf[8], vf[8];
        unpack8(__ldcg(reinterpret_cast<const uint4*>(L.k_cache + at)), kf);
        unpack8(__ldcg(reinterpret_cast<const uint4*>(L.v_cache + at)), vf);
#pragma unroll
        for (int x = 0; x < 8; ++x) kt[x] = kf[x], vt[x] = vf[x];
      } else {
        const float* row = p.qkv + (first_row + (t - first_key)) * n_qkv;
        const float4* k4 = reinterpret_cast<const float4*>(row + (hq + g) * d + c * 8);
        const float4* v4 = reinterpret_cast<const float4*>(row + (hq + hk + g) * d + c * 8);
        reinterpret_cast<float4*>(kt)[0] = __ldcg(k4);
        reinterpret_cast<float4*>(kt)[1] = __ldcg(k4 + 1);
        reinterpret_cast<float4*>(vt)[0] = __ldcg(v4);
        reinterpret_cast<float4*>(vt)[1] = __ldcg(v4 + 1);
      }
    }
  };
  // After the tile's barrier: this batch's keys normalised and rotated, a warp a key.
  auto rope_new_keys = [&](int tile, int nt) {
    for (int kk = warp; kk < nt; kk += kWarps) {
      const int t = tile + kk;
      if (t >= first_key) norm_rope_head(p, L.k_norm, ri.pos[first_row + (t - first_key)], s.kt + kk * ks);
    }
  };

  copy_floats(s.q, p.qkv + i * n_qkv + g * gq * d, gq * d);
  if (own) {
    copy_floats(s.own, p.qkv + i * n_qkv + (hq + g) * d, d);
    copy_floats(s.own + d, p.qkv + i * n_qkv + (hq + hk + g) * d, d);
  }
  if (threadIdx.x < gq) {
    s.stats[threadIdx.x] = -INFINITY;  // running max
    s.stats[gq + threadIdx.x] = 0.0f;  // running sum
  }
  if (t0 < t1) stage(t0, min(kKeyTile, t1 - t0));
  __syncthreads();
  for (int qh = warp; qh < gq; qh += kWarps) norm_rope_head(p, L.q_norm, ri.pos[i], s.q + qh * d);
  if (own && warp == kWarps - 1) {
    norm_rope_head(p, L.k_norm, ri.pos[i], s.own);
    const int64_t at = (ri.slot[i] * hk + g) * d;
    for (int e = lane; e < d; e += 32) {
      L.k_cache[at + e] = __float2bfloat16_rn(s.own[e]);
      L.v_cache[at + e] = __float2bfloat16_rn(s.own[d + e]);
    }
  }
  if (t0 < t1) rope_new_keys(t0, min(kKeyTile, t1 - t0));
  __syncthreads();

  constexpr int kAcc = 8;  // q-head x dim elements a thread accumulates (gq * D <= 2048)
  float acc[kAcc];
#pragma unroll
  for (int j = 0; j < kAcc; ++j) acc[j] = 0.0f;
  const int elems = gq * d;
  const float scale = p.scale;
  for (int tile = t0; tile < t1; tile += kKeyTile) {
    const int nt = min(kKeyTile, t1 - tile);
    if (tile != t0) {
      stage(tile, nt);
      __syncthreads();
      rope_new_keys(tile, nt);
      __syncthreads();
    }
    for (int e = threadIdx.x; e < gq * nt; e += kThreads) {
      const int qh = e / nt, kk = e - qh * nt;
      const float4* qv = reinterpret_cast<const float4*>(s.q + qh * d);
      const float4* kv = reinterpret_cast<const float4*>(s.kt + kk * ks);
      float dot = 0.0f;
      for (int c = 0; c < d / 4; ++c) {
        const float4 a = qv[c], b = kv[c];
        dot = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, dot))));
      }
      s.sc[qh * kKeyTile + kk] = dot * scale;
    }
    __syncthreads();
    for (int qh = warp; qh < gq; qh += kWarps) {
      float* sc = s.sc + qh * kKeyTile;
      const float m_old = s.stats[qh], m_new = fmaxf(m_old, warp_max_of(sc, nt));
      const float sum = warp_exp_sum(sc, nt, m_new);
      __syncwarp();  // every lane has read s.stats[qh] before lane 0 rewrites it
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
        s.stats[qh] = m_new;
        s.stats[gq + qh] = s.stats[gq + qh] * alpha + sum;
        s.stats[2 * gq + qh] = alpha;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kAcc; ++j) {
      const int e = threadIdx.x + j * kThreads;
      if (e >= elems) break;
      const int qh = e / d, dd = e - qh * d;
      float a = acc[j] * s.stats[2 * gq + qh];
      const float* pr = s.sc + qh * kKeyTile;
      for (int kk = 0; kk < nt; ++kk) a = fmaf(pr[kk], s.vt[kk * ks + dd], a);
      acc[j] = a;
    }
    __syncthreads();
  }
  // Partials: [row][q head][split] sums of d floats, then (max, sum) pairs after all of them.
  const int64_t units = int64_t{p.rows} * hq * kMaxForwardSplits;
#pragma unroll
  for (int j = 0; j < kAcc; ++j) {
    const int e = threadIdx.x + j * kThreads;
    if (e >= elems) break;
    const int qh = e / d, dd = e - qh * d;
    const int64_t unit = (int64_t{i} * hq + g * gq + qh) * kMaxForwardSplits + split;
    p.partials[unit * d + dd] = acc[j];
  }
  if (threadIdx.x < gq) {
    const int64_t unit = (int64_t{i} * hq + g * gq + threadIdx.x) * kMaxForwardSplits + split;
    p.partials[units * d + unit * 2] = s.stats[threadIdx.x];
    p.partials[units * d + unit * 2 + 1] = s.stats[gq + threadIdx.x];
  }
  __syncthreads();
}

__device__ void attention_phase(const DecoderForwardParams& p, const Smem& s, int layer) {
  const RowInfo& ri = *s.info;
  const int per_row = p.num_kv_heads * ri.splits, units = ri.real_rows * per_row;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int i = u / per_row, rest = u - i * per_row;
    attention_unit(p, s, layer, i, rest / ri.splits, rest % ri.splits);
  }
}

// Phase D: the attention partials merged into s.xs (every block all rows and heads), then this
// block's o_proj columns added to the residual stream (layer 0's: the embeddings).
template <int R>
__device__ void o_phase(const DecoderForwardParams& p, const Smem& s, int layer) {
  const DecoderChainLayer& L = p.layers[layer];
  const RowInfo& ri = *s.info;
  const int h = p.hidden, d = p.head_dim, hq = p.num_q_heads, inter = p.intermediate, width = hq * d;
  {  // phase E's weights: this block's gate and up rows
    const Slice f = slice_of(inter);
    prefetch_l2(L.gate_up + int64_t{f.begin} * h, int64_t{f.end - f.begin} * h * 2);
    prefetch_l2(L.gate_up + int64_t{inter + f.begin} * h, int64_t{f.end - f.begin} * h * 2);
  }
  const Slice sl = slice_of(h);
  const int64_t units = int64_t{p.rows} * hq * kMaxForwardSplits;
  const int heads = ri.real_rows * hq, splits = ri.splits;
  for (int e = threadIdx.x; e < heads; e += kThreads) {  // each split's weight in its head's sum
    const float* ml = p.partials + units * d + int64_t{e} * kMaxForwardSplits * 2;
    float m = -INFINITY;
    for (int sp = 0; sp < splits; ++sp) m = fmaxf(m, __ldcg(ml + 2 * sp));
    float total = 0.0f;
    for (int sp = 0; sp < splits; ++sp) {
      const float w = m == -INFINITY ? 0.0f : __expf(__ldcg(ml + 2 * sp) - m);
      s.weights[e * kMaxForwardSplits + sp] = w;
      total += w * __ldcg(ml + 2 * sp + 1);
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int sp = 0; sp < splits; ++sp) s.weights[e * kMaxForwardSplits + sp] *= inv;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < heads * (d / 4); e += kThreads) {
    const int head = e / (d / 4), d0 = (e - head * (d / 4)) * 4;
    const float4* src = reinterpret_cast<const float4*>(p.partials + int64_t{head} * kMaxForwardSplits * d + d0);
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int sp = 0; sp < splits; ++sp) {
      const float w = s.weights[head * kMaxForwardSplits + sp];
      const float4 v = __ldcg(src + sp * (d / 4));
      a.x = fmaf(w, v.x, a.x);
      a.y = fmaf(w, v.y, a.y);
      a.z = fmaf(w, v.z, a.z);
      a.w = fmaf(w, v.w, a.w);
    }
    const int r = head / hq, col = (head - r * hq) * d + d0;
    bf16* out = s.xs + r * width + col;
    out[0] = __float2bfloat16_rn(a.x);
    out[1] = __float2bfloat16_rn(a.y);
    out[2] = __float2bfloat16_rn(a.z);
    out[3] = __float2bfloat16_rn(a.w);
  }
  __syncthreads();
  gemv<R, columns_a_warp<R>()>([&](int c) { return L.o + static_cast<int64_t>(c) * width; }, width, s.xs, width,
                               ri.real_rows, sl.begin, sl.end, [&](int r, int c, float v) {
                                 float& x = s.xold[r * s.h_slice + c - sl.begin];
                                 x = round_bf16(x + round_bf16(v + bias_at(L.o_bias, c)));
                                 p.x[static_cast<int64_t>(r) * h + c] = x;
                               });
}

// Phase E: this block's MLP features: gate and up, then SiLU(gate) * up into p.act.
template <int R>
__device__ void mlp_up_phase(const DecoderForwardParams& p, const Smem& s, int layer) {
  const DecoderChainLayer& L = p.layers[layer];
  const int h = p.hidden, inter = p.intermediate, n = s.mlp_slice;
  prefetch_rows(L.down, h, inter);  // phase F's
  norm_rows(p, s, false, L.post_norm, s.xs);
  const Slice f = slice_of(inter);
  const int nf = f.end - f.begin;
  // Columns [0, nf) are gate features, [nf, 2 nf) the same features' up.
  gemv<R, columns_a_warp<R>()>(
      [&](int c) { return L.gate_up + static_cast<int64_t>(c < nf ? f.begin + c : inter + f.begin + c - nf) * h; }, h,
      s.xs, h, s.info->real_rows, 0, 2 * nf, [&](int r, int c, float v) {
        const int feature = c < nf ? f.begin + c : inter + f.begin + c - nf;
        s.gu[r * 2 * n + (c < nf ? c : n + c - nf)] = round_bf16(v + bias_at(L.gate_up_bias, feature));
      });
  __syncthreads();
  for (int e = threadIdx.x; e < s.info->real_rows * nf; e += kThreads) {
    const int r = e / nf, j = e - r * nf;
    p.act[static_cast<int64_t>(r) * inter + f.begin + j] = __float2bfloat16_rn(silu(s.gu[r * 2 * n + j]) * s.gu[r * 2 * n + n + j]);
  }
}

// Phase F: this block's down_proj columns added to the residual stream.
template <int R>
__device__ void down_phase(const DecoderForwardParams& p, const Smem& s, int layer) {
  const DecoderChainLayer& L = p.layers[layer];
  const int h = p.hidden, inter = p.intermediate, rows = s.info->real_rows;
  if (layer + 1 < p.num_layers) {
    prefetch_rows(p.layers[layer + 1].qkv, (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim, h);
  } else {  // the start of this block's lm_head rows
    const Slice v = slice_of(p.vocab);
    prefetch_l2(p.lm_head + int64_t{v.begin} * h, min64(int64_t{v.end - v.begin} * h * 2, 1 << 20));
  }
  const Slice sl = slice_of(h);
  const int chunks = inter / 8;
  for (int e = threadIdx.x; e < rows * chunks; e += kThreads) {
    const int r = e / chunks, c = e - r * chunks;
    reinterpret_cast<uint4*>(s.xs + r * inter)[c] = __ldcg(reinterpret_cast<const uint4*>(p.act + int64_t{r} * inter) + c);
  }
  __syncthreads();
  gemv<R, columns_a_warp<R>()>([&](int c) { return L.down + static_cast<int64_t>(c) * inter; }, inter, s.xs, inter, rows,
                               sl.begin, sl.end, [&](int r, int c, float v) {
                                 float& x = s.xold[r * s.h_slice + c - sl.begin];
                                 x = round_bf16(x + round_bf16(v + bias_at(L.down_bias, c)));
                                 p.x[static_cast<int64_t>(r) * h + c] = x;
                               });
}

// The final norm (hidden states out: this block's columns), then this block's lm_head rows for
// the rows whose logits are wanted.
template <int R>
__device__ void lm_head_phase(const DecoderForwardParams& p, const Smem& s) {
  const int h = p.hidden, rows = s.info->real_rows;
  norm_rows(p, s, false, p.final_norm, s.xs);
  if (p.hidden_out != nullptr) {
    const Slice sl = slice_of(h);
    for (int e = threadIdx.x; e < rows * (sl.end - sl.begin); e += kThreads) {
      const int r = e / (sl.end - sl.begin), c = sl.begin + e % (sl.end - sl.begin);
      p.hidden_out[static_cast<int64_t>(r) * h + c] = s.xs[r * h + c];
    }
  }
  if (p.num_logits <= 0) return;
  for (int e = threadIdx.x; e < p.num_logits * (h / 8); e += kThreads) {
    const int l = e / (h / 8), c = e - l * (h / 8);
    const int r = min(max(p.logits_indices[l], 0), max(rows - 1, 0));
    reinterpret_cast<uint4*>(s.sel + l * h)[c] = reinterpret_cast<const uint4*>(s.xs + r * h)[c];
  }
  __syncthreads();
  const Slice v = slice_of(p.vocab);
  gemv<R, columns_a_warp<R>()>([&](int c) { return p.lm_head + static_cast<int64_t>(c) * h; }, h, s.sel, h,
                               p.num_logits, v.begin, v.end,
                               [&](int l, int c, float x) { p.logits[static_cast<int64_t>(l) * p.vocab + c] = x; });
}

template <int R>
__global__ void __launch_bounds__(kThreads, 1) decoder_forward_kernel(const __grid_constant__ DecoderForwardParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Smem s = smem_pointers(smem, forward_layout(p, gridDim.x));
  GridBarrier barrier{p.grid_sync};
  prefetch_rows(p.layers[0].qkv, (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim, p.hidden);
  trace(p, 0);
  load_rows(p, s);
  stage_embeddings(p, s);  // read first in phase D, after barriers
  auto phase_done = [&](int layer, int phase) {
    trace(p, 1 + (layer * 5 + phase) * 2);
    barrier.sync();
    trace(p, 2 + (layer * 5 + phase) * 2);
  };
  for (int layer = 0; layer < p.num_layers; ++layer) {
    qkv_phase<R>(p, s, layer);
    phase_done(layer, 0);
    attention_phase(p, s, layer);
    phase_done(layer, 1);
    o_phase<R>(p, s, layer);
    phase_done(layer, 2);
    mlp_up_phase<R>(p, s, layer);
    phase_done(layer, 3);
    down_phase<R>(p, s, layer);
    phase_done(layer, 4);
  }
  lm_head_phase<R>(p, s);
  trace(p, kForwardTraceEvents - 1);
  barrier.finish();
}

using ForwardKernel = void (*)(DecoderForwardParams);

// The instance compiled for the fewest rows >= rows (logits rows included).
ForwardKernel kernel_for(int rows) {
  static const ForwardKernel kernels[] = {decoder_forward_kernel<1>, decoder_forward_kernel<2>,
                                          decoder_forward_kernel<4>, decoder_forward_kernel<8>,
                                          decoder_forward_kernel<16>};
  return kernels[rows <= 1 ? 0 : rows <= 2 ? 1 : rows <= 4 ? 2 : rows <= 8 ? 3 : 4];
}

int kernel_rows(const DecoderForwardParams& p) { return std::max(p.rows, p.num_logits); }

}  // namespace

int64_t decoder_forward_smem(const DecoderForwardParams& p, int blocks) { return forward_layout(p, blocks).bytes; }

int decoder_forward_max_blocks(const DecoderForwardParams& p, int64_t smem) {
  const ForwardKernel kernel = kernel_for(kernel_rows(p));
  if (smem > 48 * 1024 &&
      raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int per_sm = 0, device = 0, sms = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, static_cast<size_t>(smem)) != cudaSuccess ||
      cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return (per_sm >= 1 ? 1 : 0) * sms;
}

cudaError_t launch_decoder_forward(const DecoderForwardParams& p, int blocks, int64_t smem, cudaStream_t stream) {
  const ForwardKernel kernel = kernel_for(kernel_rows(p));
  if (smem > 48 * 1024) {
    const cudaError_t e =
        raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeCooperative;  // every block resident at once: the grid barriers need it
  attr.val.cooperative = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

}  // namespace specula::cuda
