// A decode chain of a small Llama-family decoder in ONE kernel launch (Backend::decoder_chain):
// `steps` decode steps of a few rows each, every step's token (its argmax, or a sample whose
// distribution q is kept for verification) feeding the next step's input, for drafts 2..k.
//
// Why this shape: a small draft (2 layers, hidden 128) decodes a step in ~24 kernels of a few
// microseconds each, and at such sizes a kernel's cost is its launch and its wait for the
// previous one, not its work (H100: ~67 us a draft step as separate kernels in a CUDA graph).
// Here ONE thread-block cluster of up to 16 blocks runs the chain (~25 us a step on the H100 for
// the embedded draft at one row, plus ~13 us a launch for the launch and the weights' copy), so
// that the weights stay in shared memory and blocks meet at cluster barriers, not grid barriers:
//   - the model lives in the cluster's shared memory (16 x 227 KB holds the embedded draft's
//     2.8 MB: attention and MLP slices always, lm_head rows when they fit, else read from L2), so
//     a stage's weights are a shared-memory read away, loaded once per chain by cp.async;
//   - blocks exchange partial sums through distributed shared memory (DSMEM, ~200 cycles) and
//     meet at cluster barriers (hardware, far cheaper than a grid barrier), 2 a layer + 1 a step:
//     A. a block per (row, kv group): RMSNorm, the group's q/k/v columns (Qwen3 q/k norm, rope),
//        k/v into the paged cache, attention of the group's q heads, and the group's split-K
//        share of o_proj                                                       -> barrier
//     B. every block: residual += sum of the groups' o_proj shares (the same order everywhere,
//        so every block holds the same residual bit for bit), RMSNorm, its slice of gate_up,
//        SiLU(gate) * up, and its split-K share of down_proj                     -> barrier
//     then every block: residual += sum of the down_proj shares; after the last layer the final
//     norm and the block's lm_head rows (tensor cores, lm_head_mma) with its best (value, index)
//     per row                                                                  -> barrier
//     and every block reduces the candidates to the step's tokens and looks up their embeddings
//     (tied embeddings: in the lm_head rows of the block that holds them).
// A sampled row's logits go to its q row (global memory, the block's own entries); the blocks
// sum their slices' fixed-point masses (the token sampler's, over the step's max) and exchange
// them (a barrier), the block whose slice holds the draw finds the token while every block turns
// its logits into q, and a last barrier hands the token to all: two barriers a step more.
// A kv group's attention may be split over q_split blocks by q heads (each computes the group's
// k and v too, the first writes them), when one block's shared memory cannot hold the group.
// An EAGLE-3 head is the same loop over its one layer: stage A's input is [input_layernorm(
// embedding), hidden_norm(g)] (twice the hidden size) with g as the residual, g carried from step
// to step; its lm_head covers the draft vocabulary, mapped to token ids at the reduction.
// What bounds it (Nsight Compute): not bandwidth but the chain of short dependent phases: at
// 2 warps a scheduler each warp issues an instruction every ~14 cycles, half the stalls at block
// barriers between phases, each phase ~0.5-1 us however little it computes. (Variants measured
// and dropped: docs/PERFORMANCE.md, "Design history moved from source comments".)
//
// Numerics follow the layer-by-layer path: every value that path stores in bf16 (normed inputs,
// projections, q/k after norm and rope, attention output, residual, activation) is rounded to
// bf16 here at the same point, sums are fp32, logits fp32 (split-K sums differ from the
// one-pass GEMM's only in fp32 summation order); so drafts equal the unfused path's except where
// two logits are within rounding of each other.
//
// Memory ordering: cluster.sync() is a release/acquire barrier at cluster scope, which orders
// the DSMEM partials and the K/V cache writes before their reads (a (row, group)'s K/V is written
// by one block; with q_split > 1 the group's other blocks read it in later steps, from L2).
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_kernel_attributes.h"
#include "backend/cuda/cuda_decoder_chain.h"
#include "backend/cuda/cuda_utils.cuh"
#include "core/counter_draw.h"

namespace specula::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPvThreads = 256;  // threads of the attention's p . V (partial sums in shared memory)

__host__ __device__ inline int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// Dynamic shared memory of a block: the work area first, at the same offsets in every block (a
// block reads another's partial sums at its own offsets through DSMEM), then the block's weights:
// its kv group's attention weights (blocks below num_kv_heads), its MLP slice, its lm_head rows.
struct ChainLayout {
  int64_t x, e, pa, pb, xs, att, act, gu, qkv, scores, part, red, norms, cos_sin, tables, pos, slots, cand_v, cand_i,
      tok, best_v, best_i, row_max, mass, scan, drawn;
  int64_t area;         // bytes of the work area
  int64_t attn_layer;   // bf16 elements of a layer's attention weights in a unit's block
  int64_t mlp_layer;    // bf16 elements of a layer's MLP slice
  int64_t norms_layer;  // bf16 elements of a layer's norm weights: in, post [H]; q, k [D]; EAGLE-3: hidden [H]
};

__host__ __device__ inline bool eagle3(const DecoderChainParams& p) { return p.hidden_norm != nullptr; }
// The width of stage A's input rows: H, or an EAGLE-3 head's [embedding, g] 2 H.
__host__ __device__ inline int attention_input(const DecoderChainParams& p) {
  return eagle3(p) ? 2 * p.hidden : p.hidden;
}
// q heads of an attention unit, and the units (blocks holding attention weights).
__host__ __device__ inline int unit_heads(const DecoderChainParams& p) {
  return p.num_q_heads / p.num_kv_heads / p.q_split;
}
__host__ __device__ inline int attention_units(const DecoderChainParams& p) { return p.num_kv_heads * p.q_split; }

// Whether row r draws (rather than takes the argmax) at `step`, and the q row it then writes.
__device__ __forceinline__ bool draws(const DecoderChainParams& p, int r, int step) {
  return p.samples && p.inv_temperature[r] > 0.0f && step < p.q_steps[r];
}
__device__ __forceinline__ float* q_row(const DecoderChainParams& p, int r, int step) {
  return p.q_store + static_cast<int64_t>(p.q_first_rows[r] + step) * p.vocab;
}
// The token id of lm_head row `id` (an EAGLE-3 head's draft vocabulary maps to the target's).
__device__ __forceinline__ int target_id(const DecoderChainParams& p, int id) {
  return p.draft_to_target ? p.draft_to_target[id] : id;
}

__host__ __device__ inline ChainLayout chain_layout(const DecoderChainParams& p) {
  ChainLayout l{};
  const int64_t rows = p.rows, h = p.hidden, d = p.head_dim, g = unit_heads(p), n = p.mlp_cols;
  const int64_t in = attention_input(p);
  int64_t at = 0;
  struct Take {
    int64_t& at;
    __host__ __device__ int64_t operator()(int64_t bytes) const {
      const int64_t o = at;
      at = align16(at + bytes);
      return o;
    }
  } take{at};
  l.x = take(rows * h * 4);   // residual rows (fp32, bf16-exact)
  l.e = take(eagle3(p) ? rows * h * 4 : 0);  // EAGLE-3: the input tokens' embeddings
  l.pa = take(rows * h * 4);  // o_proj shares of this block's (row, unit) tasks
  l.pb = take(rows * h * 4);  // down_proj shares of this block's MLP slice
  l.xs = take(rows * in * 2);  // normed rows (bf16)
  l.att = take(rows * g * d * 2);
  l.act = take(rows * n * 2);
  l.gu = take(rows * 2 * n * 4);
  l.qkv = take((g + 2) * d * 4);
  l.scores = take(g * static_cast<int64_t>(p.max_context) * 4);
  l.part = take(static_cast<int64_t>(kPvThreads) * 8 * 4);
  l.red = take(kMaxChainGroup * 4);
  l.norms_layer = 2 * h + 2 * d + (eagle3(p) ? h : 0);
  l.norms = take((p.num_layers * l.norms_layer + h) * 2);
  l.cos_sin = take(static_cast<int64_t>(p.steps) * rows * p.rotary_dim * 4);
  l.tables = take(rows * p.table_width * 4);
  l.pos = take(static_cast<int64_t>(p.steps) * rows * 4);
  l.slots = take(static_cast<int64_t>(p.steps) * rows * 8);
  l.cand_v = take(rows * 4);
  l.cand_i = take(rows * 4);
  l.tok = take(rows * 4);
  l.best_v = take(kWarps * rows * 4);
  l.best_i = take(kWarps * rows * 4);
  l.row_max = take(rows * 4);
  l.mass = take(rows * 8);
  l.scan = take(kWarps * 8);
  l.drawn = take(rows * 4);
  l.area = at;
  l.attn_layer = (g + 2) * d * in + h * g * d;
  l.mlp_layer = 2 * n * h + h * n;
  return l;
}

// Byte offset of block b's MLP weights, and of its lm_head rows.
__host__ __device__ inline int64_t mlp_offset(const DecoderChainParams& p, const ChainLayout& l, int b) {
  return l.area + (b < attention_units(p) ? p.num_layers * l.attn_layer * 2 : 0);
}
__host__ __device__ inline int64_t lm_offset(const DecoderChainParams& p, const ChainLayout& l, int b) {
  return mlp_offset(p, l, b) + p.num_layers * l.mlp_layer * 2;
}

// This block's pointers into its shared memory, and other blocks' (DSMEM) where it reads them.
struct ChainSmem {
  float *x, *e, *pa, *pb, *gu, *qkv, *scores, *part, *red, *cos_sin, *cand_v, *best_v, *row_max;
  bf16 *xs, *att, *act, *norms;
  int32_t *tables, *pos, *cand_i, *tok, *best_i, *drawn;
  unsigned long long *mass, *scan;
  int64_t* slots;
  const bf16* attn_w;  // blocks < attention_units: their unit's attention weights (see RemoteSmem)
  bf16* mlp_w;        // [layers][gate n | up n rows of H, then down H rows of n]
  const bf16* lm_w;   // rows vocab_begin[rank].. (shared memory or the global lm_head)
  int rank;
};

// Other blocks' shared memory, mapped once (mapa) at the start.
struct RemoteSmem {
  const float* pa[kMaxChainCluster];
  const float* pb[kMaxChainCluster];
  const float* cand_v[kMaxChainCluster];
  const int32_t* cand_i[kMaxChainCluster];
  const unsigned long long* mass[kMaxChainCluster];  // sampled rows' slice masses
  const int32_t* drawn[kMaxChainCluster];             // sampled rows' tokens (lm ids), where found
  // blocks < attention_units: [layers][the unit's q heads' then its group's k, v rows ((g + 2) D
  // of attention_input), o's H rows of its g D columns], g = unit_heads
  const bf16* attn_w[kMaxChainCluster];
  const bf16* lm_w[kMaxChainCluster];    // lm_head rows (when in shared memory)
};

// One warp computes columns [begin, end) of y[r][c] = xs[r] . W[c] (row c of W at w + c * ldw,
// k_dim a multiple of 8; W in this block's shared memory, another block's (DSMEM) or global: a
// generic pointer) for `rows` rows. Short rows (K = 128 in the embedded draft) would leave most
// lanes idle with a warp per column, so a column gets just enough lanes for one 16-byte load each
// per pass (lpc) and a warp works on 32 / lpc columns at once, NC each, so that several columns'
// loads are in flight together. emit(r, c, sum) runs on one lane.
template <int R, int NC, class Emit>
__device__ __forceinline__ void warp_gemv(const bf16* w, int ldw, int k_dim, const bf16* xs, int ldx, int rows,
                                          int begin, int end, Emit emit) {
  const int lane = threadIdx.x & 31;
  // At most 8 lanes a column: 8 lanes' 16-byte loads of one row are one conflict-free 128-byte
  // shared-memory wavefront, and fewer lanes a column means fewer shuffles to sum it.
  int lpc = 8;
  while (lpc > 1 && lpc * 8 > k_dim) lpc >>= 1;
  const int groups = 32 / lpc, grp = lane / lpc, gl = lane % lpc;
  for (int base = begin; base < end; base += groups * NC) {
    float acc[NC][R];
    int cols[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = base + grp * NC + c;
      cols[c] = col < end ? col : begin;
#pragma unroll
      for (int r = 0; r < R; ++r) acc[c][r] = 0.0f;
    }
#pragma unroll 2  // K = 128 at 8 lanes a column: both passes' loads in flight together
    for (int k = gl * 8; k < k_dim; k += lpc * 8) {
      uint4 wv[NC];
#pragma unroll
      for (int c = 0; c < NC; ++c) wv[c] = *reinterpret_cast<const uint4*>(w + static_cast<int64_t>(cols[c]) * ldw + k);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        float x[8];
        unpack8(*reinterpret_cast<const uint4*>(xs + r * ldx + k), x);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          float wf[8];
          unpack8(wv[c], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[c][r] = fmaf(wf[i], x[i], acc[c][r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;  // warp-uniform
      for (int off = lpc / 2; off > 0; off >>= 1)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[c][r] += __shfl_xor_sync(0xffffffffu, acc[c][r], off);
    }
    if (gl == 0)
#pragma unroll
      for (int c = 0; c < NC; ++c)
        if (base + grp * NC + c < end)
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (r < rows) emit(r, cols[c], acc[c][r]);
  }
}

// The block's warps share columns [begin, end) in contiguous runs.
template <int R, int NC, class Emit>
__device__ __forceinline__ void block_gemv(const bf16* w, int ldw, int k_dim, const bf16* xs, int ldx, int rows,
                                           int begin, int end, Emit emit) {
  const int warp = threadIdx.x >> 5, per = (end - begin + kWarps - 1) / kWarps;
  const int b = begin + warp * per, e = min(end, b + per);
  if (b < e) warp_gemv<R, NC>(w, ldw, k_dim, xs, ldx, rows, b, e, emit);
}

// dst[r] = bf16(w * (src[r] / rms(src[r]))), a warp per row; ends with a block barrier.
__device__ void norm_rows(const float* src, int rows, int h, const bf16* w, float eps, bf16* dst) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < rows; r += kWarps) {
    float sum_sq = 0.0f;
    for (int k = lane; k < h; k += 32) sum_sq += src[r * h + k] * src[r * h + k];
    const float inv = rsqrtf(warp_sum(sum_sq) / static_cast<float>(h) + eps);
    for (int k = lane; k < h; k += 32) dst[r * h + k] = __float2bfloat16_rn(__bfloat162float(w[k]) * (src[r * h + k] * inv));
  }
  __syncthreads();
}

// rows x cols bf16 (cols a multiple of 8) from global to shared memory, asynchronously.
// (32-bit index arithmetic: no 64-bit division per 16 bytes.)
// swizzle: 16-byte chunk c of row r goes to chunk c ^ (r & 7) (see lm_head_mma).
__device__ void copy_rows_async(bf16* dst, int ld_dst, const bf16* src, int64_t ld_src, int rows, int cols,
                                bool swizzle = false) {
  const int chunks = cols / 8;
  auto copy = [&](int r, int c) {
    cp_async16(dst + r * ld_dst + (swizzle ? c ^ (r & 7) : c) * 8, src + r * ld_src + c * 8, true);
  };
  if (chunks <= kThreads) {  // a row per chunks threads
    const int c = threadIdx.x % chunks;
    if (threadIdx.x >= kThreads / chunks * chunks) return;
#pragma unroll 1
    for (int r = threadIdx.x / chunks; r < rows; r += kThreads / chunks) copy(r, c);
    return;
  }
#pragma unroll 1
  for (int i = threadIdx.x; i < rows * chunks; i += kThreads) {
    const int r = i / chunks;
    copy(r, i - r * chunks);
  }
}

// lm_head rows in shared memory go through the tensor cores (lm_head_mma) when the hidden size
// is a multiple of 64 (so that the row swizzle stays within a row) and at most kMmaMaxHidden.
constexpr int kMmaMaxHidden = 256;
__host__ __device__ inline bool lm_head_mma_applies(const DecoderChainParams& p) {
  return p.lm_head_in_smem && p.hidden % 64 == 0 && p.hidden <= kMmaMaxHidden;
}

// The block's weights into its shared memory, asynchronously in three commit groups, each waited
// for just before its first use so that the copies overlap the first step: (0) layer 0's attention
// weights, (1) the other layers' and every MLP slice, (2) the lm_head rows.
__device__ void load_weights(const DecoderChainParams& p, const ChainLayout& l, unsigned char* smem, int rank) {
  const int64_t h = p.hidden, d = p.head_dim, hq = p.num_q_heads, hk = p.num_kv_heads, g = unit_heads(p);
  const int64_t n = p.mlp_cols;
  const int64_t inter = p.intermediate, in = attention_input(p);
  const bool unit = rank < attention_units(p);
  const int64_t group = rank / p.q_split, q0 = (group * p.q_split + rank % p.q_split) * g;  // its first q head
  auto attention = [&](int layer) {
    const DecoderChainLayer& L = p.layers[layer];
    bf16* w = reinterpret_cast<bf16*>(smem + l.area) + layer * l.attn_layer;
    copy_rows_async(w, in, L.qkv + q0 * d * in, in, g * d, in);                               // q heads
    copy_rows_async(w + g * d * in, in, L.qkv + (hq + group) * d * in, in, d, in);            // k head
    copy_rows_async(w + (g + 1) * d * in, in, L.qkv + (hq + hk + group) * d * in, in, d, in);  // v head
    copy_rows_async(w + (g + 2) * d * in, g * d, L.o + q0 * d, hq * d, h, g * d);              // o columns
  };
  if (unit) attention(0);
  cp_async_commit();
  for (int layer = 0; layer < p.num_layers; ++layer) {
    if (unit && layer > 0) attention(layer);
    const DecoderChainLayer& L = p.layers[layer];
    const int64_t j0 = static_cast<int64_t>(rank) * n, nb = min(n, inter - j0);
    if (nb > 0) {
      bf16* w = reinterpret_cast<bf16*>(smem + mlp_offset(p, l, rank)) + layer * l.mlp_layer;
      copy_rows_async(w, h, L.gate_up + j0 * h, h, nb, h);                    // gate rows
      copy_rows_async(w + n * h, h, L.gate_up + (inter + j0) * h, h, nb, h);  // up rows
      copy_rows_async(w + 2 * n * h, n, L.down + j0, inter, h, nb);           // down columns
    }
  }
  cp_async_commit();
  if (p.lm_head_in_smem) {
    const int v0 = p.vocab_begin[rank], v1 = p.vocab_begin[rank + 1];
    copy_rows_async(reinterpret_cast<bf16*>(smem + lm_offset(p, l, rank)), h, p.lm_head + v0 * h, h, v1 - v0, h,
                    lm_head_mma_applies(p));
  }
  cp_async_commit();
}

// The small per-chain inputs every block needs: norms, positions, slots, rope rows, block tables,
// the first tokens.
__device__ void load_inputs(const DecoderChainParams& p, const ChainSmem& s) {
  const int h = p.hidden, d = p.head_dim, rows = p.rows, rot = p.rotary_dim;
  const int per_layer = 2 * h + 2 * d + (eagle3(p) ? h : 0);
  for (int i = threadIdx.x; i < p.num_layers * per_layer + h; i += kThreads) {
    const int layer = i / per_layer, j = i % per_layer;
    const DecoderChainLayer* L = layer < p.num_layers ? &p.layers[layer] : nullptr;
    bf16 v = __float2bfloat16_rn(1.0f);
    if (!L) v = p.final_norm[j];
    else if (j < h) v = L->in_norm[j];
    else if (j < 2 * h) v = L->post_norm[j - h];
    else if (j < 2 * h + d) { if (L->q_norm) v = L->q_norm[j - 2 * h]; }
    else if (j < 2 * h + 2 * d) { if (L->k_norm) v = L->k_norm[j - 2 * h - d]; }
    else v = p.hidden_norm[j - 2 * h - 2 * d];
    s.norms[i] = v;
  }
  for (int i = threadIdx.x; i < p.steps * rows; i += kThreads) {
    s.pos[i] = p.positions[i];
    s.slots[i] = p.slots[i];
  }
  for (int i = threadIdx.x; i < p.steps * rows * rot; i += kThreads) {
    const int at = i / rot, pos = p.positions[at];
    s.cos_sin[i] = pos >= 0 && pos < p.max_pos ? p.cos_sin[static_cast<int64_t>(pos) * rot + i % rot] : 0.0f;
  }
  for (int i = threadIdx.x; i < rows * p.table_width; i += kThreads) s.tables[i] = p.block_tables[i];
  if (threadIdx.x < rows) {
    const int32_t t = p.first_tokens[threadIdx.x];
    s.tok[threadIdx.x] = t < 0 || t >= p.vocab ? 0 : t;
  }
  if (eagle3(p))  // g of step 0
    for (int i = threadIdx.x; i < rows * h; i += kThreads) s.x[i] = __bfloat162float(p.first_hidden[i]);
}

// x[r] (an EAGLE-3 head: e[r]) = the embedding of tok[r]: from the lm_head rows of the block that
// holds them when the embeddings are tied and those rows are in shared memory (DSMEM), else (and
// at step 0, while they are still being copied) from global memory.
__device__ void embed_rows(const DecoderChainParams& p, const ChainSmem& s, const RemoteSmem& rm, bool from_global) {
  const int h = p.hidden;
  float* dst = eagle3(p) ? s.e : s.x;
  const bool tied = !from_global && p.lm_head_in_smem && p.embed == p.lm_head;
  for (int i = threadIdx.x; i < p.rows * h; i += kThreads) {
    const int r = i / h, c = i % h, t = s.tok[r];
    const bf16* row = p.embed + static_cast<int64_t>(t) * h;
    int at = c;
    if (tied) {
      int b = 0;
      while (b + 1 < p.cluster && t >= p.vocab_begin[b + 1]) ++b;
      const int local = t - p.vocab_begin[b];
      row = rm.lm_w[b] + static_cast<int64_t>(local) * h;
      if (lm_head_mma_applies(p)) at = ((c >> 3) ^ (local & 7)) * 8 + (c & 7);  // swizzled rows
    }
    dst[i] = __bfloat162float(row[at]);
  }
  __syncthreads();
}

// Stage A, task (row r, attention unit u of kv group g): the row's RMSNorm, the unit's q and the
// group's k/v columns, q/k norm and rope, k/v into the cache (the group's first unit), attention
// of the unit's q heads over keys 0..position, and the unit's share of o_proj into pa[r]. The
// unit's weights are in block u's shared memory.
template <int R>
__device__ void attention_task(const DecoderChainParams& p, const ChainLayout& l, const ChainSmem& s,
                               const RemoteSmem& rm, int layer, int step, int r, int u) {
  const DecoderChainLayer& L = p.layers[layer];
  const int h = p.hidden, hq = p.num_q_heads, hk = p.num_kv_heads, d = p.head_dim, gq = unit_heads(p), gd = gq * d;
  const int g = u / p.q_split, q0 = u * gq;  // its kv group, its first q head
  const int qkv_cols = gd + 2 * d, maxc = p.max_context, in = attention_input(p);
  const bf16* w_qkv = (u == s.rank ? s.attn_w : rm.attn_w[u]) + layer * l.attn_layer;  // own: no DSMEM hop
  const bf16* w_o = w_qkv + static_cast<int64_t>(qkv_cols) * in;
  const bf16* norms = s.norms + layer * l.norms_layer;
  const int at = step * p.rows + r;
  const int pos = s.pos[at];
  const int64_t slot = s.slots[at];
  const bool own = slot >= 0 && slot < p.num_slots;
  const bool writes_kv = own && u % p.q_split == 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  bf16* xs = s.xs + r * in;
  if (eagle3(p)) {  // [input_layernorm(embedding), hidden_norm(g)]
    norm_rows(s.e + r * h, 1, h, norms, p.eps, xs);
    norm_rows(s.x + r * h, 1, h, norms + 2 * h + 2 * d, p.eps, xs + h);
  } else {
    norm_rows(s.x + r * h, 1, h, norms, p.eps, xs);
  }
  block_gemv<1, 4>(w_qkv, in, in, xs, in, 1, 0, qkv_cols, [&](int, int c, float v) {
    const int col = c < gd ? q0 * d + c : c < gd + d ? hq * d + g * d + (c - gd) : (hq + hk) * d + g * d + (c - gd - d);
    s.qkv[c] = round_bf16(v + bias_at(L.qkv_bias, col));
  });
  __syncthreads();
  // A warp per head: q heads 0..gq-1, then k (norm, rope, into the cache), then v (into the cache).
  for (int hh = warp; hh < gq + 2; hh += kWarps) {
    float* x = s.qkv + hh * d;
    if (hh <= gq) {
      const bf16* norm = hh < gq ? (L.q_norm ? norms + 2 * h : nullptr) : (L.k_norm ? norms + 2 * h + d : nullptr);
      const bool rope = pos >= 0 && pos < p.max_pos && p.rotary_dim > 0;
      warp_norm_rope_head(x, d, norm, p.eps, rope ? s.cos_sin + static_cast<int64_t>(at) * p.rotary_dim : nullptr,
                          p.rotary_dim);
    }
    if (hh >= gq && writes_kv) {
      bf16* cache = hh == gq ? L.k_cache : L.v_cache;
      for (int i = lane; i < d; i += 32) cache[(slot * hk + g) * d + i] = __float2bfloat16_rn(x[i]);
    }
  }
  __syncthreads();

  // Scores: thread (key, q head) pairs, q = thread % gq (keys from the cache, the row's own from
  // qkv: its cache entry is being written by this block).
  const int len = min(pos + 1, maxc);
  const int32_t* table = s.tables + r * p.table_width;
  const float* kself = s.qkv + gd;
  const float* vself = s.qkv + gd + d;
  auto key_slot = [&](int t) { return static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size; };
  const int per = kThreads / gq;
  if (threadIdx.x < per * gq) {
    const int q = threadIdx.x % gq;
    const float* qv = s.qkv + q * d;
#pragma unroll 1
    for (int t = threadIdx.x / gq; t < len; t += per) {
      const bool self = t == pos && own;
      const bf16* kp = L.k_cache + (key_slot(t) * hk + g) * d;
      float dot = 0.0f;
#pragma unroll 4
      for (int c = 0; c < d; c += 8) {
        float kf[8];
        if (self) {
#pragma unroll
          for (int i = 0; i < 8; ++i) kf[i] = kself[c + i];
        } else {
          unpack8(__ldcg(reinterpret_cast<const uint4*>(kp + c)), kf);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = fmaf(qv[c + i], kf[i], dot);
      }
      s.scores[q * maxc + t] = dot * p.scale;
    }
  }
  __syncthreads();
  // Softmax, a warp per q head: exponentials in place, their sum into red[q].
  for (int q = warp; q < gq; q += kWarps) {
    float* sc = s.scores + q * maxc;
    const float sum = warp_exp_sum(sc, len, warp_max_of(sc, len));
    if (lane == 0) s.red[q] = sum;
  }
  __syncthreads();
  // p . V: thread (grp, chunk) sums keys grp, grp + groups, ... of 8 dims of one q head.
  const int chunks = gd / 8, groups = kPvThreads / chunks;
  const int grp = threadIdx.x / chunks, chunk = threadIdx.x % chunks;
  if (grp < groups) {
    const int q = chunk * 8 / d, d0 = chunk * 8 % d;
    const float* sc = s.scores + q * maxc;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    auto value = [&](int t, float (&vf)[8]) {
      if (t == pos && own) {
#pragma unroll
        for (int i = 0; i < 8; ++i) vf[i] = vself[d0 + i];
      } else {
        unpack8(__ldcg(reinterpret_cast<const uint4*>(L.v_cache + (key_slot(t) * hk + g) * d + d0)), vf);
      }
    };
    int t = grp;
    for (; t + 3 * groups < len; t += 4 * groups) {
      float v0f[8], v1f[8], v2f[8], v3f[8];
      value(t, v0f);
      value(t + groups, v1f);
      value(t + 2 * groups, v2f);
      value(t + 3 * groups, v3f);
      const float w0 = sc[t], w1 = sc[t + groups], w2 = sc[t + 2 * groups], w3 = sc[t + 3 * groups];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += w0 * v0f[i] + w1 * v1f[i] + w2 * v2f[i] + w3 * v3f[i];
    }
    for (; t < len; t += groups) {
      float vf[8];
      value(t, vf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(sc[t], vf[i], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) s.part[grp * gd + chunk * 8 + i] = acc[i];
  }
  __syncthreads();
  bf16* att = s.att + r * gd;
  for (int c = threadIdx.x; c < gd; c += kThreads) {
    float v = 0.0f;
    for (int gi = 0; gi < groups; ++gi) v += s.part[gi * gd + c];
    att[c] = __float2bfloat16_rn(v / s.red[c / d]);
  }
  __syncthreads();
  // The unit's share of o_proj (its q heads' input columns), summed with the others' after the barrier.
  block_gemv<1, 4>(w_o, gd, gd, att, gd, 1, 0, h, [&](int, int c, float v) { s.pa[r * h + c] = v; });
}

// x[r] = bf16(x[r] + bf16(sum of shares + bias)): shares from `share(r)`, summed in one fixed
// order so that every block computes the same residual.
template <class Shares>
__device__ void add_shares(const DecoderChainParams& p, const ChainSmem& s, const bf16* bias, int count, Shares share) {
  const int h = p.hidden;
  for (int i = threadIdx.x; i < p.rows * h; i += kThreads) {
    const int r = i / h, c = i % h;
    float v = 0.0f;
    for (int k = 0; k < count; ++k) v += share(r, k)[r * h + c];
    s.x[i] = round_bf16(s.x[i] + round_bf16(v + bias_at(bias, c)));
  }
  __syncthreads();
}

// Stage B: post-attention RMSNorm of every row, the block's gate_up features, SiLU(gate) * up, and
// its share of down_proj into pb.
template <int R>
__device__ void mlp_stage(const DecoderChainParams& p, const ChainLayout& l, const ChainSmem& s, int layer) {
  const DecoderChainLayer& L = p.layers[layer];
  const int h = p.hidden, rows = p.rows, inter = p.intermediate, n = p.mlp_cols;
  cp_async_wait<1>();  // MLP weights (no-op after the first layer)
  norm_rows(s.x, rows, h, s.norms + layer * l.norms_layer + h, p.eps, s.xs);  // its barrier publishes them
  const int j0 = s.rank * n, nb = min(n, inter - j0);
  if (nb <= 0) return;
  const bf16* w_gu = s.mlp_w + layer * l.mlp_layer;
  const bf16* w_down = w_gu + 2 * n * h;
  // Columns [0, nb) are gate features, [n, n + nb) up features (rows nb..n of gate never filled).
  block_gemv<R, 2>(w_gu, h, h, s.xs, h, rows, 0, n + nb, [&](int r, int c, float v) {
    if (c < nb) s.gu[r * 2 * n + c] = round_bf16(v + bias_at(L.gate_up_bias, j0 + c));
    else if (c >= n) s.gu[r * 2 * n + c] = round_bf16(v + bias_at(L.gate_up_bias, inter + j0 + c - n));
  });
  __syncthreads();
  for (int i = threadIdx.x; i < rows * nb; i += kThreads) {
    const int r = i / nb, j = i % nb;
    const float gt = s.gu[r * 2 * n + j], up = s.gu[r * 2 * n + n + j];
    s.act[r * n + j] = __float2bfloat16_rn(gt / (1.0f + __expf(-gt)) * up);
  }
  __syncthreads();
  block_gemv<R, 2>(w_down, n, nb, s.act, n, rows, 0, h, [&](int r, int c, float v) { s.pb[r * h + c] = v; });
}

// The block's lm_head rows on the tensor cores: D[16 vocab rows][8 x rows] += A[16][16] (lm_head
// rows, from shared memory by ldmatrix) * B[16][8] (the normed rows, held in registers for the
// whole stage), one mma.sync per 16 rows and 16 of K: ~10x fewer instructions than the scalar
// GEMV, which at this size is what the stage's time is. The rows are stored with their 16-byte
// chunks XOR-swizzled by row (copy_rows_async), since ldmatrix reads one chunk of 8 rows at a
// time and rows 256 bytes apart would otherwise all hit the same 4 banks. Each lane keeps the best
// (value, index) of the x rows 2 (lane % 4) and +1; s.best_v/best_i get each warp's. keep[r]
// (null: none) receives row r's logits at their token ids.
__device__ void lm_head_mma(const DecoderChainParams& p, const ChainSmem& s, int n, int v0, float* const* keep) {
  const int h = p.hidden, rows = p.rows, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  uint32_t b[kMmaMaxHidden / 16][2];
  const int xr = min(lane & 7, rows - 1);  // x rows past `rows` repeat the last (results ignored)
#pragma unroll
  for (int ks = 0; ks < kMmaMaxHidden / 16; ks += 2) {
    if (ks * 16 >= h) break;
    uint32_t f[4];
    ldmatrix_x4(f, s.xs + xr * h + (ks * 2 + (lane >> 3)) * 8);
    b[ks][0] = f[0];
    b[ks][1] = f[1];
    b[ks + 1][0] = f[2];
    b[ks + 1][1] = f[3];
  }
  float bv[2] = {-INFINITY, -INFINITY};
  int bi[2] = {INT_MAX, INT_MAX};
  float* kept[2] = {2 * t4 < rows ? keep[2 * t4] : nullptr, 2 * t4 + 1 < rows ? keep[2 * t4 + 1] : nullptr};
  for (int tile = warp; tile * 16 < n; tile += kWarps) {
    const int ar = min(tile * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, n - 1);
    const bf16* arow = s.lm_w + ar * h;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < kMmaMaxHidden / 16; ++ks) {
      if (ks * 16 >= h) break;
      uint32_t a[4];
      ldmatrix_x4(a, arow + ((ks * 2 + (lane >> 4)) ^ (ar & 7)) * 8);
      mma_bf16_16816(d, a, b[ks][0], b[ks][1]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // d[j]: vocab row g (+8 for j >= 2), x row 2 t4 + (j & 1)
      const int v = tile * 16 + g + (j >= 2 ? 8 : 0);
      if (v < n && kept[j & 1]) kept[j & 1][target_id(p, v0 + v)] = d[j];
      if (v < n && argmax_better(d[j], v0 + v, bv[j & 1], bi[j & 1])) {
        bv[j & 1] = d[j];
        bi[j & 1] = v0 + v;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    warp_argmax(bv[k], bi[k], 4);  // lanes of the same t4 hold the same x rows
    const int xrow = 2 * t4 + k;
    if (g == 0 && xrow < rows) {
      s.best_v[warp * rows + xrow] = bv[k];
      s.best_i[warp * rows + xrow] = bi[k];
    }
  }
}

// The block's lm_head rows as a scalar GEMV (rows in L2, or a hidden size lm_head_mma does not
// take): each warp's best (value, index) per row into s.best_v/best_i; keep as lm_head_mma's.
template <int R>
__device__ void lm_head_scalar(const DecoderChainParams& p, const ChainSmem& s, int v0, int v1, float* const* keep) {
  const int h = p.hidden, rows = p.rows;
  float best[R];
  int best_i[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    best[r] = -INFINITY;
    best_i[r] = INT_MAX;
  }
  block_gemv<R, 4>(s.lm_w, h, h, s.xs, h, rows, 0, v1 - v0, [&](int r, int c, float v) {
    if (keep[r]) keep[r][target_id(p, v0 + c)] = v;
#pragma unroll
    for (int i = 0; i < R; ++i)  // registers, not a dynamically indexed array
      if (i == r && argmax_better(v, v0 + c, best[i], best_i[i])) {
        best[i] = v;
        best_i[i] = v0 + c;
      }
  });
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    float bv = best[r];
    int bi = best_i[r];
    warp_argmax(bv, bi);
    if ((threadIdx.x & 31) == 0) {
      s.best_v[warp * rows + r] = bv;
      s.best_i[warp * rows + r] = bi;
    }
  }
}

// Final RMSNorm and the block's lm_head rows: its best (value, index) per row into cand, and the
// logits of the rows that draw at `step` into their q rows.
template <int R>
__device__ void lm_head_stage(const DecoderChainParams& p, const ChainLayout& l, const ChainSmem& s, int step) {
  const int h = p.hidden, rows = p.rows;
  cp_async_wait<0>();  // lm_head rows (no-op after the first step)
  norm_rows(s.x, rows, h, s.norms + p.num_layers * l.norms_layer, p.eps, s.xs);  // its barrier publishes them
  const int v0 = p.vocab_begin[s.rank], v1 = p.vocab_begin[s.rank + 1];
  float* keep[kMaxChainRows];
#pragma unroll
  for (int r = 0; r < kMaxChainRows; ++r) keep[r] = r < rows && draws(p, r, step) ? q_row(p, r, step) : nullptr;
  if (lm_head_mma_applies(p) && v1 > v0) lm_head_mma(p, s, v1 - v0, v0, keep);
  else lm_head_scalar<R>(p, s, v0, v1, keep);
  __syncthreads();
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int w = 0; w < kWarps; ++w)
      if (argmax_better(s.best_v[w * rows + r], s.best_i[w * rows + r], bv, bi)) {
        bv = s.best_v[w * rows + r];
        bi = s.best_i[w * rows + r];
      }
    s.cand_v[r] = bv;
    s.cand_i[r] = bi;
  }
}

// The step's argmaxes: the best of every block's candidates (the same in every block), each
// row's largest logit into row_max; block 0 stores them as the step's output (draw_tokens then
// replaces the sampled rows').
__device__ void reduce_tokens(const DecoderChainParams& p, const ChainSmem& s, const RemoteSmem& rm, int step) {
  if (threadIdx.x < p.rows) {
    const int r = threadIdx.x;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int b = 0; b < p.cluster; ++b) {
      const float v = rm.cand_v[b][r];
      const int i = rm.cand_i[b][r];
      if (argmax_better(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    int32_t tok = bi == INT_MAX || bi < 0 || bi >= p.lm_vocab ? 0 : bi;
    if (p.draft_to_target != nullptr) tok = p.draft_to_target[tok];
    if (tok < 0 || tok >= p.vocab) tok = 0;
    if (s.rank == 0) p.out_tokens[static_cast<int64_t>(step) * p.rows + r] = tok;
    s.tok[r] = tok;
    s.row_max[r] = bv;
  }
  __syncthreads();
}

// Row r's draw at `step` (it draws): the token sampler's plain draw over the logits that
// lm_head_stage left in its q row, max row_max[r]. Its fixed-point masses' total over every
// block's slice, and the target u * total.
struct DrawTarget {
  unsigned long long total = 0, before = 0, target = 0;  // before: the masses of the blocks before this one
};
__device__ __forceinline__ DrawTarget draw_target(const DecoderChainParams& p, const ChainSmem& s,
                                                  const RemoteSmem& rm, int r, int step) {
  DrawTarget d;
  for (int b = 0; b < p.cluster; ++b) {
    const unsigned long long m = rm.mass[b][r];
    d.total += m;
    if (b < s.rank) d.before += m;
  }
  const double u = uniform_draw(p.seeds[r], s.pos[step * p.rows + r] + p.draw_offset, p.draw_stream);
  d.target = static_cast<unsigned long long>(u * static_cast<double>(d.total));
  if (d.target >= d.total && d.total > 0) d.target = d.total - 1;
  return d;
}

// The sampled rows' tokens at `step` (after reduce_tokens): every block sums its slice's masses
// (each thread a contiguous run of ids, in id order); after an exchange the block whose slice
// holds the target finds the token (the first id whose cumulative mass passes it) and every block
// writes q = mass / total over its slice; after a second exchange every block takes the token.
// A row whose logits are not finite keeps its argmax, and q is zero (the verification then
// rejects the draft and draws from p: still lossless).
template <int R>
__device__ void draw_tokens(const DecoderChainParams& p, const ChainSmem& s, const RemoteSmem& rm,
                            cg::cluster_group& cluster, int step) {
  const int v0 = p.vocab_begin[s.rank], n = p.vocab_begin[s.rank + 1] - v0;
  const int per = (n + kThreads - 1) / kThreads;
  const int b0 = min(n, per * static_cast<int>(threadIdx.x)), b1 = min(n, b0 + per);
  unsigned long long local[R], start[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    local[r] = start[r] = 0;
    if (r >= p.rows || !draws(p, r, step)) continue;  // block-uniform
    const float* q = q_row(p, r, step);
    const float m = s.row_max[r], inv_t = p.inv_temperature[r];
    if (isfinite(m))
      for (int i = b0; i < b1; ++i) local[r] += fixed_mass(softmax_numerator(q[target_id(p, v0 + i)], m, inv_t));
    unsigned long long block_total = 0;
    start[r] = block_exclusive_scan_u64<kWarps>(local[r], &block_total, s.scan);
    if (threadIdx.x == 0) s.mass[r] = block_total;
  }
  cluster.sync();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= p.rows || !draws(p, r, step)) continue;
    float* q = q_row(p, r, step);
    const float m = s.row_max[r], inv_t = p.inv_temperature[r];
    const DrawTarget d = draw_target(p, s, rm, r, step);
    const unsigned long long from = d.before + start[r];
    if (d.total > 0 && from <= d.target && d.target < from + local[r]) {
      unsigned long long cum = from;
      for (int i = b0; i < b1; ++i) {
        cum += fixed_mass(softmax_numerator(q[target_id(p, v0 + i)], m, inv_t));
        if (cum > d.target) {
          s.drawn[r] = v0 + i;
          break;
        }
      }
    }
    __syncthreads();  // the search above read the logits that q replaces
    const double inv_total = d.total > 0 ? 1.0 / static_cast<double>(d.total) : 0.0;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      float& e = q[target_id(p, v0 + i)];
      e = d.total > 0 ? static_cast<float>(static_cast<double>(fixed_mass(softmax_numerator(e, m, inv_t))) * inv_total)
                      : 0.0f;
    }
  }
  cluster.sync();
  if (threadIdx.x < p.rows && draws(p, threadIdx.x, step)) {
    const int r = threadIdx.x;
    const DrawTarget d = draw_target(p, s, rm, r, step);
    unsigned long long cum = 0;
    for (int b = 0; b < p.cluster && d.total > 0; ++b) {
      const unsigned long long m = rm.mass[b][r];
      if (d.target < cum + m) {
        int32_t tok = target_id(p, rm.drawn[b][r]);
        if (tok < 0 || tok >= p.vocab) tok = 0;
        if (s.rank == 0) p.out_tokens[static_cast<int64_t>(step) * p.rows + r] = tok;
        s.tok[r] = tok;
        break;
      }
      cum += m;
    }
  }
  __syncthreads();
}

// The q rows a reduced draft vocabulary leaves partly unwritten (target ids outside it), zeroed
// before any draw: a slice of each per block.
__device__ void zero_q_rows(const DecoderChainParams& p, int rank) {
  const int per = (p.vocab + p.cluster - 1) / p.cluster, lo = min(p.vocab, rank * per), hi = min(p.vocab, lo + per);
  for (int r = 0; r < p.rows; ++r)
    for (int step = 0; step < p.steps; ++step) {
      if (!draws(p, r, step)) continue;
      float* q = q_row(p, r, step);
      for (int i = lo + static_cast<int>(threadIdx.x); i < hi; i += kThreads) q[i] = 0.0f;
    }
}

// R: the rows the kernel is compiled for (>= p.rows): unrolled per-row accumulators stay small.
template <int R>
__global__ void __launch_bounds__(kThreads, 1) decoder_chain_kernel(const __grid_constant__ DecoderChainParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ RemoteSmem rm;
  cg::cluster_group cluster = cg::this_cluster();
  const ChainLayout l = chain_layout(p);
  ChainSmem s;
  s.rank = static_cast<int>(cluster.block_rank());
  s.x = reinterpret_cast<float*>(smem + l.x);
  s.e = reinterpret_cast<float*>(smem + l.e);
  s.pa = reinterpret_cast<float*>(smem + l.pa);
  s.pb = reinterpret_cast<float*>(smem + l.pb);
  s.gu = reinterpret_cast<float*>(smem + l.gu);
  s.qkv = reinterpret_cast<float*>(smem + l.qkv);
  s.scores = reinterpret_cast<float*>(smem + l.scores);
  s.part = reinterpret_cast<float*>(smem + l.part);
  s.red = reinterpret_cast<float*>(smem + l.red);
  s.cos_sin = reinterpret_cast<float*>(smem + l.cos_sin);
  s.cand_v = reinterpret_cast<float*>(smem + l.cand_v);
  s.best_v = reinterpret_cast<float*>(smem + l.best_v);
  s.row_max = reinterpret_cast<float*>(smem + l.row_max);
  s.mass = reinterpret_cast<unsigned long long*>(smem + l.mass);
  s.scan = reinterpret_cast<unsigned long long*>(smem + l.scan);
  s.drawn = reinterpret_cast<int32_t*>(smem + l.drawn);
  s.xs = reinterpret_cast<bf16*>(smem + l.xs);
  s.att = reinterpret_cast<bf16*>(smem + l.att);
  s.act = reinterpret_cast<bf16*>(smem + l.act);
  s.norms = reinterpret_cast<bf16*>(smem + l.norms);
  s.tables = reinterpret_cast<int32_t*>(smem + l.tables);
  s.pos = reinterpret_cast<int32_t*>(smem + l.pos);
  s.cand_i = reinterpret_cast<int32_t*>(smem + l.cand_i);
  s.tok = reinterpret_cast<int32_t*>(smem + l.tok);
  s.best_i = reinterpret_cast<int32_t*>(smem + l.best_i);
  s.slots = reinterpret_cast<int64_t*>(smem + l.slots);
  s.attn_w = reinterpret_cast<const bf16*>(smem + l.area);
  s.mlp_w = reinterpret_cast<bf16*>(smem + mlp_offset(p, l, s.rank));
  s.lm_w = p.lm_head_in_smem ? reinterpret_cast<const bf16*>(smem + lm_offset(p, l, s.rank))
                             : p.lm_head + static_cast<int64_t>(p.vocab_begin[s.rank]) * p.hidden;

  load_weights(p, l, smem, s.rank);
  if (threadIdx.x < p.cluster) {
    const int b = threadIdx.x;
    rm.pa[b] = cluster.map_shared_rank(s.pa, b);
    rm.pb[b] = cluster.map_shared_rank(s.pb, b);
    rm.cand_v[b] = cluster.map_shared_rank(s.cand_v, b);
    rm.cand_i[b] = cluster.map_shared_rank(s.cand_i, b);
    rm.mass[b] = cluster.map_shared_rank(s.mass, b);
    rm.drawn[b] = cluster.map_shared_rank(s.drawn, b);
    rm.attn_w[b] =
        b < attention_units(p) ? cluster.map_shared_rank(reinterpret_cast<bf16*>(smem + l.area), b) : nullptr;
    rm.lm_w[b] = cluster.map_shared_rank(reinterpret_cast<bf16*>(smem + lm_offset(p, l, b)), b);
  }
  load_inputs(p, s);
  if (p.samples && p.lm_vocab < p.vocab) zero_q_rows(p, s.rank);
  cp_async_wait<2>();
  __syncthreads();
  // Every block's layer-0 attention weights are in place before any block reads them, and the
  // zeroed q rows before any block writes a logit into them.
  cluster.sync();
  embed_rows(p, s, rm, true);

  const int units = attention_units(p), tasks = p.rows * units;
  for (int step = 0; step < p.steps; ++step) {
    for (int layer = 0; layer < p.num_layers; ++layer) {
      const DecoderChainLayer& L = p.layers[layer];
      for (int task = s.rank; task < tasks; task += p.cluster) {
        attention_task<R>(p, l, s, rm, layer, step, task / units, task % units);
        __syncthreads();
      }
      cluster.sync();
      add_shares(p, s, L.o_bias, units, [&](int r, int u) { return rm.pa[(r * units + u) % p.cluster]; });
      mlp_stage<R>(p, l, s, layer);
      cluster.sync();
      add_shares(p, s, L.down_bias, p.mlp_blocks, [&](int, int b) { return rm.pb[b]; });
    }
    lm_head_stage<R>(p, l, s, step);
    cluster.sync();
    reduce_tokens(p, s, rm, step);
    if (p.samples) draw_tokens<R>(p, s, rm, cluster, step);
    if (step + 1 < p.steps) embed_rows(p, s, rm, false);
  }
  cluster.sync();  // no block leaves while another may still read its shared memory
}

}  // namespace

// The parameters travel by value (__grid_constant__), within the classic 4 KB limit.
static_assert(sizeof(DecoderChainParams) <= 4096, "decoder chain parameters over 4 KB");

int64_t plan_decoder_chain(DecoderChainParams& p, int cluster, int64_t smem_budget, bool lm_head_in_l2) {
  const int hk = p.num_kv_heads;
  if (cluster <= 0 || cluster > kMaxChainCluster || hk <= 0 || hk > cluster || p.num_q_heads % hk != 0 ||
      p.num_q_heads / hk > kMaxChainGroup || p.lm_vocab <= 0)
    return 0;
  p.cluster = cluster;
  p.mlp_cols = ((p.intermediate + cluster - 1) / cluster + 7) / 8 * 8;
  p.mlp_blocks = (p.intermediate + p.mlp_cols - 1) / p.mlp_cols;
  // The fewest q splits whose attention and MLP weights fit every block.
  const int64_t row_bytes = static_cast<int64_t>(p.hidden) * 2;
  int64_t fixed[kMaxChainCluster], cap[kMaxChainCluster], total_cap = 0;
  for (p.q_split = 1;; p.q_split *= 2) {
    const int group = p.num_q_heads / hk;
    if (group % p.q_split != 0 || hk * p.q_split > cluster) return 0;
    if (group / p.q_split * p.head_dim > 8 * kPvThreads) continue;
    const ChainLayout l = chain_layout(p);
    bool fits = true;
    for (int b = 0; b < cluster; ++b) {
      fixed[b] = lm_offset(p, l, b);
      fits = fits && fixed[b] <= smem_budget;
    }
    if (fits) break;
  }
  for (int b = 0; b < cluster; ++b) {
    cap[b] = (smem_budget - fixed[b]) / row_bytes;
    total_cap += cap[b];
  }
  // lm_head rows: in shared memory if they fit, spread so that the fullest block holds the fewest
  // rows possible (the stage lasts as long as its slowest block); else an even split read from L2.
  int64_t rows[kMaxChainCluster];
  p.lm_head_in_smem = !lm_head_in_l2 && total_cap >= p.lm_vocab;
  if (p.lm_head_in_smem) {
    int64_t lo = 0, hi = p.lm_vocab;  // the smallest per-block ceiling that covers the vocabulary
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      int64_t covered = 0;
      for (int b = 0; b < cluster; ++b) covered += std::min(cap[b], mid);
      if (covered >= p.lm_vocab) hi = mid;
      else lo = mid + 1;
    }
    int64_t left = p.lm_vocab;
    for (int b = 0; b < cluster; ++b) {
      rows[b] = std::min({cap[b], lo, left});
      left -= rows[b];
    }
  } else {
    const int64_t per = (p.lm_vocab + cluster - 1) / cluster;
    int64_t left = p.lm_vocab;
    for (int b = 0; b < cluster; ++b) {
      rows[b] = std::min(per, left);
      left -= rows[b];
    }
  }
  int64_t smem = 0;
  p.vocab_begin[0] = 0;
  for (int b = 0; b < cluster; ++b) {
    p.vocab_begin[b + 1] = p.vocab_begin[b] + static_cast<int>(rows[b]);
    smem = std::max(smem, fixed[b] + (p.lm_head_in_smem ? rows[b] * row_bytes : 0));
  }
  return smem;
}

namespace {

using ChainKernel = void (*)(DecoderChainParams);

// The instance compiled for the fewest rows >= p.rows, and its index.
ChainKernel kernel_for(int rows, int& index) {
  static const ChainKernel kernels[] = {decoder_chain_kernel<1>, decoder_chain_kernel<2>, decoder_chain_kernel<4>,
                                        decoder_chain_kernel<8>};
  index = rows <= 1 ? 0 : rows <= 2 ? 1 : rows <= 4 ? 2 : 3;
  return kernels[index];
}

cudaLaunchConfig_t chain_config(const DecoderChainParams& p, int64_t smem, cudaStream_t stream,
                                cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(p.cluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(p.cluster);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Cluster sizes above 8 are non-portable (the H100 has them), and shared memory above 48 KB must
// be asked for; each instance keeps the largest size asked so far, per GPU.
cudaError_t configure_kernel(ChainKernel kernel, int64_t smem) {
  const cudaError_t e = raise_kernel_attribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (e != cudaSuccess || smem <= 48 * 1024) return e;
  return raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}

}  // namespace

int decoder_chain_max_clusters(const DecoderChainParams& p, int64_t smem) {
  int index = 0;
  const ChainKernel kernel = kernel_for(p.rows, index);
  if (configure_kernel(kernel, smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = chain_config(p, smem, nullptr, &attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

cudaError_t launch_decoder_chain(const DecoderChainParams& p, int64_t smem, cudaStream_t stream) {
  int index = 0;
  const ChainKernel kernel = kernel_for(p.rows, index);
  const cudaError_t e = configure_kernel(kernel, smem);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = chain_config(p, smem, stream, &attr);
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

}  // namespace specula::cuda
