// Token sampling on the GPU: one block per logits row (backend/token_sampler.h has the math).
//
// Why this shape: a row is one vocabulary of fp32 logits (0.5-0.6 MB for 128k-152k tokens), which
// stays in L2 while its block makes several passes over it; batches have at most a few hundred
// rows, so a block per row fills the GPU without any cross-block reduction. Nothing is ever
// sorted: each filter is a threshold found by radix selection over the 32-bit patterns of the
// values (8 bits a pass, warp-private shared-memory histograms, so atomics only contend inside a
// warp), and ties are resolved in token-id order by prefix counts over contiguous per-thread
// chunks of the vocabulary.
//
// Determinism: probability masses are summed as 64-bit fixed-point integers (p * 2^40, with
// p = exp((l - max) / T) <= 1), so every sum, histogram and prefix is exact and independent of
// the order atomics land in; a seeded request draws the same token on every run. Against the
// host sampler (float probabilities summed in double) a row can differ only when its draw falls
// within ~1e-7 of a token boundary.
#include <cooperative_groups.h>

#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_kernel_attributes.h"
#include "backend/cuda/cuda_engine_kernels.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

using u64 = unsigned long long;

constexpr int kThreads = 512;
constexpr int kPlainCluster = 16;  // blocks per row in sample_plain_rows_kernel (Hopper's largest cluster)
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

struct Shared {
  u64 hist[kWarps][256];  // 32 KB
  u64 merged[256];
  u64 part[kWarps];
  double dpart[kWarps];
  float fpart[kWarps];
  int ipart[kWarps];
  u64 bcast_u64[2];
  int bcast_int[2];
};

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

// Raw logits of any sign -> keys whose unsigned order is the float order.
__device__ __forceinline__ uint32_t ordered_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ u64 block_sum_u64(u64 v, Shared& s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  __syncthreads();
  if (lane_id() == 0) s.part[warp_id()] = v;
  __syncthreads();
  u64 total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += s.part[w];
  return total;
}

__device__ double block_sum_double(double v, Shared& s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  __syncthreads();
  if (lane_id() == 0) s.dpart[warp_id()] = v;
  __syncthreads();
  double total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += s.dpart[w];  // fixed order: deterministic
  return total;
}

// (value, index) with the larger value winning, the lower index among equals: "first index of
// the maximum", as the host's argmax.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__device__ void block_argmax(float& v, int& idx, Shared& s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, off);
    const int oi = __shfl_xor_sync(kFull, idx, off);
    if (better(ov, oi, v, idx)) {
      v = ov;
      idx = oi;
    }
  }
  __syncthreads();
  if (lane_id() == 0) {
    s.fpart[warp_id()] = v;
    s.ipart[warp_id()] = idx;
  }
  __syncthreads();
  v = s.fpart[0];
  idx = s.ipart[0];
  for (int w = 1; w < kWarps; ++w) {
    if (better(s.fpart[w], s.ipart[w], v, idx)) {
      v = s.fpart[w];
      idx = s.ipart[w];
    }
  }
}

// Exclusive prefix of v over the threads in order; *total gets the sum over all threads.
__device__ __forceinline__ u64 block_exclusive_scan(u64 v, u64* total, Shared& s) {
  return block_exclusive_scan_u64<kWarps>(v, total, s.part);
}

struct Selection {
  uint32_t key = 0;  // the threshold key K
  u64 above = 0;     // weight of the elements with key > K
  u64 equal = 0;     // weight of the elements with key == K
};

// The largest key K with W(key >= K) >= target, where W sums the weights of the elements that
// `element(i, key, weight)` accepts (target <= the total weight). Four passes of 8 bits, most
// significant first. COUNTS: every accepted weight is 1, added once per group of lanes that
// share a bin (__match_any_sync), so that many equal keys (e.g. filtered zeros) do not serialise
// the shared-memory atomics.
template <bool COUNTS, class Element>
__device__ Selection radix_select(int64_t n, u64 target, Element element, Shared& s) {
  uint32_t prefix = 0, mask = 0;
  Selection sel;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kWarps * 256; i += kThreads) (&s.hist[0][0])[i] = 0;
    __syncthreads();
    for (int64_t base = 0; base < n; base += kThreads) {  // uniform trip count: whole warps in step
      const int64_t i = base + threadIdx.x;
      uint32_t key = 0;
      u64 w = 0;
      const bool ok = i < n && element(i, key, w) && w > 0 && (key & mask) == prefix;
      const int bin = static_cast<int>((key >> shift) & 255u);
      if constexpr (COUNTS) {
        const unsigned group = __match_any_sync(kFull, ok ? bin : -1);
        if (ok && __ffs(group) - 1 == lane_id()) atomicAdd(&s.hist[warp_id()][bin], static_cast<u64>(__popc(group)));
      } else {
        if (ok) atomicAdd(&s.hist[warp_id()][bin], w);
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      u64 t = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) t += s.hist[w][b];
      s.merged[b] = t;
    }
    __syncthreads();
    if (warp_id() == 0) {
      // Lane l owns bins 255 - 8l .. 248 - 8l (descending); find the bin where the weight from
      // the top reaches the target.
      const int lane = lane_id();
      u64 own = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) own += s.merged[255 - 8 * lane - j];
      u64 inc = own;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const u64 o = __shfl_up_sync(kFull, inc, off);
        if (lane >= off) inc += o;
      }
      const unsigned crossing = __ballot_sync(kFull, sel.above + inc >= target);
      const int first = crossing ? __ffs(crossing) - 1 : 31;
      if (lane == first) {
        u64 acc = sel.above + inc - own;
        int chosen = 255 - 8 * lane - 7;
        for (int j = 0; j < 8; ++j) {
          const int b = 255 - 8 * lane - j;
          if (acc + s.merged[b] >= target || j == 7) {
            chosen = b;
            break;
          }
          acc += s.merged[b];
        }
        s.bcast_u64[0] = acc;
        s.bcast_u64[1] = s.merged[chosen];
        s.bcast_int[0] = chosen;
      }
    }
    __syncthreads();
    sel.above = s.bcast_u64[0];
    sel.equal = s.bcast_u64[1];
    prefix |= static_cast<uint32_t>(s.bcast_int[0]) << shift;
    mask |= 255u << shift;
    __syncthreads();  // the next pass rewrites hist and the broadcast slots
  }
  sel.key = prefix;
  return sel;
}

struct RowView {
  const float* raw;
  const uint32_t* counts;  // null: no penalties, no masks, no bias
  const int32_t* bias;     // d.bias_count (id, float bits) pairs, sorted by id
  // Structured outputs: one bit a token, read in place (a counts row would cost a V-wide clear
  // and build per row); null: every token allowed.
  const uint32_t* allowed;
  SamplingRowDesc d;

  // The bias of token i (its bias bit is set): a binary search of the row's few pairs.
  __device__ __forceinline__ float bias_of(int64_t i) const {
    int lo = 0, hi = d.bias_count - 1;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (bias[2 * mid] < i) lo = mid + 1;
      else hi = mid;
    }
    return __int_as_float(bias[2 * lo + 1]);
  }

  // In the host's order: logit bias, masked -> -inf, repetition (prompt or output), frequency
  // and presence (output counts). Explicit _rn intrinsics: no contraction into an FMA the host's
  // arithmetic does not have.
  __device__ __forceinline__ float processed(int64_t i) const {
    float l = raw[i];
    // -inf stays -inf through bias and penalties: a disallowed token can return at once.
    if (allowed != nullptr && !((allowed[i >> 5] >> (i & 31)) & 1u)) return -INFINITY;
    if (counts == nullptr) return l;
    const uint32_t c = counts[i];
    if (c & kBiasBit) l = __fadd_rn(l, bias_of(i));
    if (c & kMaskedBit) l = -INFINITY;
    const uint32_t count = c & kCountMask;
    if (d.repetition_penalty != 1.0f && (c & (kPromptSeenBit | kCountMask)) != 0)
      l = l > 0.0f ? __fdiv_rn(l, d.repetition_penalty) : __fmul_rn(l, d.repetition_penalty);
    if ((d.frequency_penalty != 0.0f || d.presence_penalty != 0.0f) && count > 0)
      l = __fsub_rn(l, __fadd_rn(__fmul_rn(d.frequency_penalty, static_cast<float>(count)), d.presence_penalty));
    return l;
  }
};

// Chunk of the vocabulary a thread owns for the order-dependent passes (token-id order).
__device__ __forceinline__ void thread_chunk(int64_t vocab, int64_t& begin, int64_t& end) {
  const int64_t per = (vocab + kThreads - 1) / kThreads;
  begin = per * static_cast<int64_t>(threadIdx.x);
  if (begin > vocab) begin = vocab;
  end = begin + per < vocab ? begin + per : vocab;
}

// The row's final distribution before normalisation: which tokens min_p, top_k and top_p keep,
// and their masses p = exp((l' - max) / T) as fixed-point integers. Found once per row; each
// pass over the vocabulary recomputes p from the logits (cheaper than storing it).
struct Filter {
  const RowView* row;
  float m = 0.0f, inv_t = 1.0f;
  uint32_t kth = 0;        // top_k: keep p >= this (as bits; 0: everything min_p keeps)
  bool top_p_on = false;
  uint32_t tau = 0;        // top_p: keep p > tau, and the first keep_ties tokens at tau
  u64 keep_ties = 0;
  bool partial_ties = false;

  __device__ __forceinline__ float prob(int64_t i) const {
    return softmax_numerator(row->processed(i), m, inv_t);
  }
  __device__ __forceinline__ bool minp_ok(float p) const { return !(row->d.min_p > 0.0f) || p >= row->d.min_p; }
  __device__ __forceinline__ bool kept1(float p) const { return minp_ok(p) && __float_as_uint(p) >= kth; }
  // Fixed-point mass of token i after every filter; `rank` counts the tokens at tau seen so far
  // (in id order) when only some of them are kept.
  __device__ __forceinline__ u64 mass(int64_t i, u64& rank) const {
    const float p = prob(i);
    if (!kept1(p)) return 0;
    if (top_p_on) {
      const uint32_t k = __float_as_uint(p);
      if (k < tau) return 0;
      if (k == tau && partial_ties && rank++ >= keep_ties) return 0;
    }
    return fixed_mass(p);
  }
};

__device__ double block_exclusive_scan_double(double v, double* total, Shared& s) {
  double inc = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const double n = __shfl_up_sync(kFull, inc, off);
    if (lane_id() >= off) inc += n;
  }
  __syncthreads();
  if (lane_id() == 31) s.dpart[warp_id()] = inc;
  __syncthreads();
  double base = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp_id()) base += s.dpart[w];
    all += s.dpart[w];
  }
  *total = all;
  return base + inc - v;
}

// Builds the filter of a non-greedy row whose max processed logit is m (finite).
__device__ void build_filter(Filter& f, int64_t vocab, Shared& s) {
  const SamplingRowDesc& d = f.row->d;
  f.inv_t = __fdiv_rn(1.0f, d.temperature);
  if (d.top_k > 0 && d.top_k < vocab) {
    f.kth = radix_select<true>(vocab, static_cast<u64>(d.top_k), [&](int64_t i, uint32_t& key, u64& w) {
              const float p = f.prob(i);
              key = f.minp_ok(p) ? __float_as_uint(p) : 0u;  // the host sorts the zeroed tokens too
              w = 1;
              return true;
            }, s).key;
  }
  // top_p: threshold tau with mass(p > tau) < P <= mass(p >= tau); tokens at tau are kept in id
  // order while the mass before them is below P.
  if (d.top_p < 1.0f) {
    f.top_p_on = true;
    u64 local = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float p = f.prob(i);
      if (f.kept1(p)) local += fixed_mass(p);
    }
    const u64 total = block_sum_u64(local, s);
    u64 target = static_cast<u64>(ceil(static_cast<double>(d.top_p) * static_cast<double>(total)));
    target = target < 1 ? 1 : (target > total ? total : target);
    const Selection sel = radix_select<false>(vocab, target, [&](int64_t i, uint32_t& key, u64& w) {
      const float p = f.prob(i);
      if (!f.kept1(p)) return false;
      key = __float_as_uint(p);
      w = fixed_mass(p);
      return true;
    }, s);
    f.tau = sel.key;
    const u64 tau_mass = fixed_mass(__uint_as_float(f.tau));
    if (tau_mass > 0) {
      const u64 ties = sel.equal / tau_mass;
      const u64 need = (target - sel.above + tau_mass - 1) / tau_mass;
      f.keep_ties = need < ties ? need : ties;
      f.partial_ties = f.keep_ties < ties;
    }
  }
}

// Per thread: the rank (among the tokens at tau) of its chunk's first token, for Filter::mass.
__device__ u64 tie_rank_base(const Filter& f, int64_t begin, int64_t end, Shared& s) {
  if (!f.partial_ties) return 0;
  u64 local = 0, all = 0;
  for (int64_t i = begin; i < end; ++i) {
    const float p = f.prob(i);
    local += f.kept1(p) && __float_as_uint(p) == f.tau ? 1 : 0;
  }
  return block_exclusive_scan(local, &all, s);
}

// probs[i] = mass(i) / total for the whole row: the final distribution, normalised (the value
// the host's logits_to_probs gives, up to float rounding).
__device__ void write_probs(const Filter& f, int64_t vocab, int64_t begin, int64_t end, u64 rank0, u64 total,
                            float* probs) {
  const double inv_total = 1.0 / static_cast<double>(total);
  if (!f.partial_ties) {
    // No tie rank to carry: a strided pass, so that a warp's stores land in consecutive words.
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      u64 rank = 0;
      probs[i] = static_cast<float>(static_cast<double>(f.mass(i, rank)) * inv_total);
    }
    return;
  }
  u64 rank = rank0;  // top_p keeps only some tokens at tau: their rank follows token-id order
  for (int64_t i = begin; i < end; ++i) probs[i] = static_cast<float>(static_cast<double>(f.mass(i, rank)) * inv_total);
}

// The first token (in id order) whose cumulative kept mass exceeds u * total; probs (may be null)
// receives the normalised distribution it is drawn from.
__device__ int draw(const Filter& f, int64_t vocab, double u, Shared& s, float* probs = nullptr) {
  int64_t begin, end;
  thread_chunk(vocab, begin, end);
  const u64 rank0 = tie_rank_base(f, begin, end, s);
  u64 local = 0;
  {
    u64 rank = rank0;
    for (int64_t i = begin; i < end; ++i) local += f.mass(i, rank);
  }
  u64 total = 0;
  const u64 before = block_exclusive_scan(local, &total, s);
  if (probs != nullptr && total > 0) write_probs(f, vocab, begin, end, rank0, total, probs);
  if (threadIdx.x == 0) s.bcast_int[1] = -1;
  __syncthreads();
  u64 target = static_cast<u64>(u * static_cast<double>(total));
  if (target >= total) target = total - 1;
  if (total > 0 && before <= target && target < before + local) {
    u64 cum = before, rank = rank0;
    for (int64_t i = begin; i < end; ++i) {
      cum += f.mass(i, rank);
      if (cum > target) {
        s.bcast_int[1] = static_cast<int>(i);
        break;
      }
    }
  }
  __syncthreads();
  return s.bcast_int[1];
}

// Max (and first argmax) of the processed logits.
__device__ void processed_max(const RowView& row, int64_t vocab, float& m, int& arg, Shared& s) {
  m = -INFINITY;
  arg = INT_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row.processed(i);
    if (better(v, static_cast<int>(i), m, arg)) {
      m = v;
      arg = static_cast<int>(i);
    }
  }
  block_argmax(m, arg, s);
}

// Returns the sampled token, or -1 when no logit is finite. probs (may be null): non-greedy rows
// write their final distribution there.
__device__ int sample_row(const RowView& row, int64_t vocab, float* probs, Shared& s) {
  float m;
  int arg;
  processed_max(row, vocab, m, arg, s);
  if (row.d.greedy) return arg;
  if (!isfinite(m)) return -1;
  Filter f;
  f.row = &row;
  f.m = m;
  build_filter(f, vocab, s);
  return draw(f, vocab, row.d.uniform, s, probs);
}

// Speculative verification of draft token x drawn from q (the draft's final distribution):
// accept with min(1, p(x) / q(x)) (u_accept * q(x) < p(x)), else draw from max(0, p - q)
// normalised (p itself when that has no mass). p is the row's final distribution, normalised.
__device__ int verify_row(const RowView& row, int64_t vocab, const float* q, bool& accepted, Shared& s) {
  const SamplingRowDesc& d = row.d;
  float m;
  int arg;
  processed_max(row, vocab, m, arg, s);
  accepted = false;
  if (!isfinite(m)) return -1;
  Filter f;
  f.row = &row;
  f.m = m;
  build_filter(f, vocab, s);
  int64_t begin, end;
  thread_chunk(vocab, begin, end);
  const u64 rank0 = tie_rank_base(f, begin, end, s);
  const int x = d.draft_token;
  u64 local = 0;
  if (threadIdx.x == 0) s.bcast_u64[1] = 0;
  __syncthreads();
  {
    u64 rank = rank0;
    for (int64_t i = begin; i < end; ++i) {
      const u64 w = f.mass(i, rank);
      if (i == x) s.bcast_u64[1] = w;
      local += w;
    }
  }
  const u64 total = block_sum_u64(local, s);  // its barriers publish bcast_u64[1] too
  const double inv_total = 1.0 / static_cast<double>(total);
  const double px = static_cast<double>(s.bcast_u64[1]) * inv_total, qx = q[x];
  if (qx > 0.0 && d.uniform_accept * qx < px) {
    accepted = true;
    return x;
  }
  // The residual, in the host's float arithmetic: r = max(0, p - q) with p rounded to float.
  auto residual = [&](int64_t i, u64& rank) {
    const float p = static_cast<float>(static_cast<double>(f.mass(i, rank)) * inv_total);
    return fmaxf(0.0f, p - q[i]);
  };
  double rl = 0.0;
  {
    u64 rank = rank0;
    for (int64_t i = begin; i < end; ++i) rl += residual(i, rank);
  }
  double mass = 0.0;
  const double before = block_exclusive_scan_double(rl, &mass, s);
  if (!(mass > 0.0)) return draw(f, vocab, d.uniform_residual, s);
  if (threadIdx.x == 0) s.bcast_int[1] = -1;
  __syncthreads();
  const double target = d.uniform_residual * mass;
  if (before <= target && target < before + rl) {
    double cum = before;
    u64 rank = rank0;
    int last = -1;
    for (int64_t i = begin; i < end; ++i) {
      const float r = residual(i, rank);
      if (r <= 0.0f) continue;
      last = static_cast<int>(i);
      cum += r;
      if (cum > target) break;
    }
    if (last >= 0) s.bcast_int[1] = last;
  }
  __syncthreads();
  if (s.bcast_int[1] < 0) {  // rounding left the target at the very end: the last token with mass
    if (threadIdx.x == 0) {
      u64 rank = 0;
      for (int64_t i = 0; i < vocab; ++i)
        if (residual(i, rank) > 0.0f) s.bcast_int[1] = static_cast<int>(i);
    }
    __syncthreads();
  }
  return s.bcast_int[1];
}

// log_softmax of the raw row: the target's logprob and rank, and the top n entries (unsorted).
__device__ void row_logprobs(const float* raw, int64_t vocab, int target, int n, SamplingRowResult& res,
                             TopLogprob* top, Shared& s) {
  float m = -INFINITY;
  int arg = INT_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    if (better(raw[i], static_cast<int>(i), m, arg)) {
      m = raw[i];
      arg = static_cast<int>(i);
    }
  }
  block_argmax(m, arg, s);
  const float target_logit = raw[target];
  double sum = 0.0;
  u64 more_likely = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float l = raw[i];
    sum += exp(static_cast<double>(l) - static_cast<double>(m));
    more_likely += l > target_logit ? 1 : 0;
  }
  const double lse = static_cast<double>(m) + log(block_sum_double(sum, s));
  const u64 rank = 1 + block_sum_u64(more_likely, s);
  res.logprob = static_cast<float>(static_cast<double>(target_logit) - lse);
  res.lse = lse;
  res.rank = static_cast<int32_t>(rank);
  res.num_top = 0;
  if (n <= 0) return;
  if (n > vocab) n = static_cast<int>(vocab);
  const Selection sel = radix_select<true>(vocab, static_cast<u64>(n), [&](int64_t i, uint32_t& key, u64& w) {
    key = ordered_key(raw[i]);
    w = 1;
    return true;
  }, s);
  const u64 need_ties = static_cast<u64>(n) - sel.above;
  int64_t begin, end;
  thread_chunk(vocab, begin, end);
  u64 gt = 0, eq = 0;
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t k = ordered_key(raw[i]);
    gt += k > sel.key ? 1 : 0;
    eq += k == sel.key ? 1 : 0;
  }
  u64 all = 0;
  u64 gt_at = block_exclusive_scan(gt, &all, s);
  u64 eq_rank = block_exclusive_scan(eq, &all, s);
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t k = ordered_key(raw[i]);
    int64_t at = -1;
    if (k > sel.key) {
      at = static_cast<int64_t>(gt_at++);
    } else if (k == sel.key) {
      if (eq_rank < need_ties) at = static_cast<int64_t>(sel.above + eq_rank);
      ++eq_rank;
    }
    if (at >= 0) top[at] = TopLogprob{static_cast<int32_t>(i), raw[i]};
  }
  res.num_top = n;
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(const float* __restrict__ logits, int64_t vocab,
                                                               const SamplingRowDesc* __restrict__ rows,
                                                               const uint32_t* __restrict__ counts,
                                                               const int32_t* __restrict__ ids,
                                                               const float* __restrict__ draft_probs,
                                                               float* __restrict__ probs_out,
                                                               SamplingRowResult* __restrict__ results,
                                                               TopLogprob* __restrict__ top, int max_top) {
  __shared__ Shared s;
  RowView row;
  row.d = rows[blockIdx.x];
  row.raw = logits + static_cast<int64_t>(row.d.logits_row) * vocab;
  row.counts = row.d.counts_row >= 0 ? counts + static_cast<int64_t>(row.d.counts_row) * vocab : nullptr;
  row.bias = row.d.bias_count > 0 ? ids + row.d.bias_begin : nullptr;
  row.allowed = row.d.allowed_begin >= 0 ? reinterpret_cast<const uint32_t*>(ids + row.d.allowed_begin) : nullptr;
  SamplingRowResult res;
  bool accepted = false;
  if (row.d.target >= 0) {
    res.token = row.d.target;
  } else if (row.d.draft_token >= 0) {
    res.token = verify_row(row, vocab, draft_probs + static_cast<int64_t>(row.d.q_row) * vocab, accepted, s);
  } else {
    float* probs = probs_out != nullptr && row.d.probs_out_row >= 0
                       ? probs_out + static_cast<int64_t>(row.d.probs_out_row) * vocab
                       : nullptr;
    res.token = sample_row(row, vocab, probs, s);
  }
  res.accepted = accepted ? 1 : 0;
  if (row.d.top_n >= 0 && res.token >= 0 && res.token < vocab) {
    row_logprobs(row.raw, vocab, res.token, min(row.d.top_n, max_top), res,
                 top + static_cast<int64_t>(blockIdx.x) * max_top, s);
  }
  if (threadIdx.x == 0) results[blockIdx.x] = res;
}

// Plain rows of a small batch (sampling_row_is_plain): a cluster of kPlainCluster blocks per row,
// each over a contiguous slice of the vocabulary, combined through distributed shared memory.
// Why: with one block per row, the passes over a 128k-152k vocabulary run on one SM, bound by its
// instruction rate (~0.15 ms a step on the H100, a tenth of a 0.6B model's step). The tokens are
// sample_row's (its RowView, Filter and helpers): the max (first index among equals) and the
// fixed-point masses, hence their sum and the draw's target, do not depend on how the row is cut,
// and the draw is the first token whose cumulative mass passes the target.
__global__ void __launch_bounds__(kThreads) sample_plain_rows_kernel(const float* __restrict__ logits, int64_t vocab,
                                                                     const SamplingRowDesc* __restrict__ rows,
                                                                     float* __restrict__ probs_out,
                                                                     SamplingRowResult* __restrict__ results) {
  namespace cg = cooperative_groups;
  __shared__ Shared s;
  __shared__ float slice_max;
  __shared__ int slice_arg;
  __shared__ u64 slice_mass;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  RowView row;  // no counts, bias or mask: processed(i) is the raw logit
  row.d = rows[blockIdx.y];
  row.raw = logits + static_cast<int64_t>(row.d.logits_row) * vocab;
  row.counts = nullptr;
  row.bias = nullptr;
  row.allowed = nullptr;
  const SamplingRowDesc& d = row.d;
  const int64_t per_block = (vocab + kPlainCluster - 1) / kPlainCluster;
  const int64_t lo = min(vocab, rank * per_block), hi = min(vocab, lo + per_block);

  float m = -INFINITY;
  int arg = INT_MAX;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    const float v = row.processed(i);
    if (better(v, static_cast<int>(i), m, arg)) {
      m = v;
      arg = static_cast<int>(i);
    }
  }
  block_argmax(m, arg, s);
  if (threadIdx.x == 0) {
    slice_max = m;
    slice_arg = arg;
  }
  cluster.sync();
  m = -INFINITY;
  arg = INT_MAX;
  for (int b = 0; b < kPlainCluster; ++b) {
    const float v = *cluster.map_shared_rank(&slice_max, b);
    const int i = *cluster.map_shared_rank(&slice_arg, b);
    if (better(v, i, m, arg)) {
      m = v;
      arg = i;
    }
  }
  SamplingRowResult res;
  res.token = -1;
  if (d.greedy || !isfinite(m)) {
    if (d.greedy) res.token = arg;
    if (rank == 0 && threadIdx.x == 0) results[blockIdx.y] = res;
    cluster.sync();  // no block leaves while another may still read its shared memory
    return;
  }
  Filter f;  // sample_row's: no filter is on, so it only sets the temperature
  f.row = &row;
  f.m = m;
  build_filter(f, vocab, s);
  u64 no_ties = 0;
  auto mass = [&](int64_t i) { return f.mass(i, no_ties); };
  // The thread's contiguous chunk of the slice, in token-id order.
  const int64_t per_thread = (hi - lo + kThreads - 1) / kThreads;
  const int64_t begin = min(hi, lo + per_thread * threadIdx.x), end = min(hi, begin + per_thread);
  u64 local = 0;
  for (int64_t i = begin; i < end; ++i) local += mass(i);
  u64 block_total = 0;
  const u64 before_in_block = block_exclusive_scan(local, &block_total, s);
  if (threadIdx.x == 0) slice_mass = block_total;
  cluster.sync();
  u64 total = 0, before = before_in_block;
  for (int b = 0; b < kPlainCluster; ++b) {
    const u64 t = *cluster.map_shared_rank(&slice_mass, b);
    total += t;
    if (b < rank) before += t;
  }
  if (probs_out != nullptr && d.probs_out_row >= 0) {  // write_probs' values, the slice a block
    float* probs = probs_out + static_cast<int64_t>(d.probs_out_row) * vocab;
    const double inv_total = 1.0 / static_cast<double>(total);
    for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads)
      probs[i] = static_cast<float>(static_cast<double>(mass(i)) * inv_total);
  }
  u64 target = static_cast<u64>(d.uniform * static_cast<double>(total));
  if (target >= total) target = total - 1;
  if (before <= target && target < before + local) {
    u64 cum = before;
    for (int64_t i = begin; i < end; ++i) {
      cum += mass(i);
      if (cum > target) {
        res.token = static_cast<int>(i);
        break;
      }
    }
    results[blockIdx.y] = res;
  }
  cluster.sync();
}

__global__ void build_counts_kernel(const CountsDesc* __restrict__ descs, const int32_t* __restrict__ ids,
                                    uint32_t* __restrict__ counts, int64_t vocab) {
  const CountsDesc d = descs[blockIdx.x];
  uint32_t* row = counts + static_cast<int64_t>(blockIdx.x) * vocab;
  for (int i = d.prompt_begin + threadIdx.x; i < d.output_begin; i += blockDim.x) {
    const int32_t id = ids[i];
    if (id >= 0 && id < vocab) atomicOr(&row[id], kPromptSeenBit);
  }
  for (int i = d.output_begin + threadIdx.x; i < d.masked_begin; i += blockDim.x) {
    const int32_t id = ids[i];
    if (id >= 0 && id < vocab) atomicAdd(&row[id], 1u);
  }
  for (int i = d.masked_begin + threadIdx.x; i < d.bias_begin; i += blockDim.x) {
    const int32_t id = ids[i];
    if (id >= 0 && id < vocab) atomicOr(&row[id], kMaskedBit);
  }
  for (int i = d.bias_begin + 2 * threadIdx.x; i < d.end; i += 2 * blockDim.x) {
    const int32_t id = ids[i];
    if (id >= 0 && id < vocab) atomicOr(&row[id], kBiasBit);
  }
}

}  // namespace

cudaError_t launch_build_token_counts(const CountsDesc* descs, const int32_t* ids, int num_rows, uint32_t* counts,
                                      int64_t vocab, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  build_counts_kernel<<<num_rows, 256, 0, stream>>>(descs, ids, counts, vocab);
  return cudaGetLastError();
}

bool sampling_row_is_plain(const SamplingRowDesc& d, int64_t vocab) {
  return (d.top_k <= 0 || d.top_k >= vocab) && !(d.top_p < 1.0f) && !(d.min_p > 0.0f) && d.counts_row < 0 &&
         d.allowed_begin < 0 && d.top_n < 0 && d.target < 0 && d.draft_token < 0;
}

cudaError_t launch_sample_plain_rows(const float* logits, int64_t vocab, const SamplingRowDesc* rows, int num_rows,
                                     float* probs_out, SamplingRowResult* results, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  if (vocab <= 0 || vocab > INT_MAX) return cudaErrorInvalidValue;
  const cudaError_t allowed =
      raise_kernel_attribute(sample_plain_rows_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (allowed != cudaSuccess) return allowed;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kPlainCluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kPlainCluster, static_cast<unsigned>(num_rows));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, sample_plain_rows_kernel, logits, vocab, rows, probs_out, results);
}

namespace {
__global__ void feed_sampled_tokens_kernel(int32_t* token_ids, int64_t n, const SamplingRowResult* results) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t id = token_ids[i];
  if (id >= 0) return;
  const int32_t token = results[-(id + 1)].token;
  token_ids[i] = token < 0 ? 0 : token;
}
}  // namespace

cudaError_t launch_feed_sampled_tokens(int32_t* token_ids, int64_t n, const SamplingRowResult* results,
                                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kFeedThreads = 256;
  const int64_t blocks = (n + kFeedThreads - 1) / kFeedThreads;
  feed_sampled_tokens_kernel<<<static_cast<unsigned>(blocks), kFeedThreads, 0, stream>>>(token_ids, n, results);
  return cudaGetLastError();
}

namespace {
__global__ void copy_sampled_tokens_kernel(const SamplingRowResult* results, int n, int32_t* out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = results[i].token < 0 ? 0 : results[i].token;
}
}  // namespace

cudaError_t launch_copy_sampled_tokens(const SamplingRowResult* results, int n, int32_t* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kCopyThreads = 128;
  copy_sampled_tokens_kernel<<<(n + kCopyThreads - 1) / kCopyThreads, kCopyThreads, 0, stream>>>(results, n, out);
  return cudaGetLastError();
}

cudaError_t launch_sample_rows(const float* logits, int64_t vocab, const SamplingRowDesc* rows, int num_rows,
                               const uint32_t* counts, const int32_t* ids, const float* draft_probs,
                               float* probs_out, SamplingRowResult* results, TopLogprob* top, int max_top,
                               cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  if (vocab <= 0 || vocab > INT_MAX) return cudaErrorInvalidValue;
  sample_rows_kernel<<<num_rows, kThreads, 0, stream>>>(logits, vocab, rows, counts, ids, draft_probs, probs_out,
                                                        results, top, max_top);
  return cudaGetLastError();
}

}  // namespace specula::cuda
