// Device-side helpers shared by the kernels: element conversions (bf16/f16/f32 storage, fp32
// math), 16-byte vector access, warp/block reductions and the PTX wrappers the attention kernels
// use (cp.async, ldmatrix, mma.sync). Only .cu files include this.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace specula::cuda {

using bf16 = __nv_bfloat16;

// ---- scalar conversions: storage type <-> fp32 ----
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// ---- 16-byte vectors ----
// A global-memory transaction is served in 32-byte sectors; one 16-byte load per thread (LDG.128)
// lets a warp cover 512 contiguous bytes with the fewest instructions, which is what memory-bound
// kernels need to get near the HBM bandwidth.
template <class T>
struct Vec16 {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  union {
    uint4 raw;
    T elems[kN];
  };
};

template <class T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[Vec16<T>::kN]) {
  Vec16<T> v;
  v.raw = *reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < Vec16<T>::kN; ++i) out[i] = to_float(v.elems[i]);
}

template <class T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[Vec16<T>::kN]) {
  Vec16<T> v;
#pragma unroll
  for (int i = 0; i < Vec16<T>::kN; ++i) v.elems[i] = from_float<T>(in[i]);
  *reinterpret_cast<uint4*>(p) = v.raw;
}

// x rounded to bf16 and back: where a fused kernel keeps fp32 but must match a path that stores bf16.
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
// b[i], or 0 for an absent bias.
__device__ __forceinline__ float bias_at(const bf16* b, int64_t i) { return b ? __bfloat162float(b[i]) : 0.0f; }
// 8 bf16 held in one 16-byte load, as floats.
__device__ __forceinline__ void unpack8(uint4 v, float (&out)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Asks L2 for the 128-byte line holding p: a hint, which nothing waits for.
__device__ __forceinline__ void prefetch_l2_line(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// 16 bytes of weights read once (ld.global.nc.L1::no_allocate): they bypass L1, which they would
// only evict other data from.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// ---- reductions ----
// SiLU as every SwiGLU kernel computes it (silu_mul, the GEMV epilogue, fused MoE), so that their
// results agree bit for bit.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// A warp reduction (warp_sum, warp_max) over the whole block (blockDim.x a multiple of 32, at
// most 1024); every thread gets the result. `shared` holds 32 floats. Warp shuffles do the work
// inside a warp (no shared memory traffic); one value per warp then goes through shared memory.
template <float (*WarpReduce)(float)>
__device__ __forceinline__ float block_reduce(float v, float* shared, float identity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpReduce(v);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : identity;
  return WarpReduce(v);
}
__device__ __forceinline__ float block_sum(float v, float* shared) { return block_reduce<warp_sum>(v, shared, 0.0f); }
__device__ __forceinline__ float block_max(float v, float* shared) {
  return block_reduce<warp_max>(v, shared, -INFINITY);
}

// The argmax order of the greedy samplers (argmax_rows, the fused decoder chain) and of the MoE
// router's top-k: a larger value, or the same value at a lower index (the host's first argmax).
// NaN compares false both ways, so it never replaces a number.
__device__ __forceinline__ bool argmax_better(float v, int i, float best, int best_i) {
  return v > best || (v == best && i < best_i);
}

// The best (value, index) in argmax_better's order over the lanes that differ from this one in
// the bits of `from`..16 (from = 1: the whole warp; from = 4: the lanes of the same lane % 4).
// Lanes without a candidate pass (-inf, INT_MAX), which any real candidate beats.
__device__ __forceinline__ void warp_argmax(float& best, int& best_i, int from = 1) {
#pragma unroll
  for (int off = 16; off >= from; off >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, off);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, off);
    if (argmax_better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
}

// ---- fixed-point probability masses (the token samplers, the fused chain's draws) ----
// A probability p <= 1 as p * 2^40, truncated: sums of masses are exact integers, the same in any
// order, so a draw's token does not depend on how a vocabulary is split between threads or blocks.
constexpr float kFixedMassScale = 1099511627776.0f;  // 2^40
__device__ __forceinline__ unsigned long long fixed_mass(float p) { return __float2ull_rz(p * kFixedMassScale); }
// A token's unnormalised probability exp((l - max) / T), with inv_t = 1 / T rounded as the host's.
__device__ __forceinline__ float softmax_numerator(float l, float max_l, float inv_t) {
  return expf(__fmul_rn(__fsub_rn(l, max_l), inv_t));
}

// Exclusive prefix sum of v over a block of kWarps warps (every thread calls); `part`: kWarps
// entries of shared memory; *total gets the block's sum.
template <int kWarps>
__device__ __forceinline__ unsigned long long block_exclusive_scan_u64(unsigned long long v, unsigned long long* total,
                                                                       unsigned long long* part) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long inc = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xffffffffu, inc, off);
    if (lane >= off) inc += n;
  }
  __syncthreads();
  part[warp] = __shfl_sync(0xffffffffu, inc, 31);  // every lane stores the warp's sum: no branch
  __syncthreads();
  unsigned long long base = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) base += part[w];
    all += part[w];
  }
  *total = all;
  return base + inc - v;
}

// 2^x on the SFU (MUFU.EX2, ~2 ulp); softmax is computed in the log2 domain so that each
// exponential is a single instruction. ex2.approx(-inf) = +0, which masked scores rely on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- PTX wrappers (sm_80+) ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Asynchronous 16-byte global->shared copy that bypasses L1 (.cg) and registers; with pred
// false it writes 16 zero bytes instead (src-size 0), so tails and padding never hold garbage.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices from shared memory; lane l supplies the address of row (l & 7) of matrix
// (l >> 3). Lane l receives, in register i, elements (l / 4, 2 (l % 4) .. +1) of matrix i, or with
// .trans the elements (2 (l % 4) .. +1, l / 4): exactly the mma.sync fragment layouts.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// D += A (16x16 bf16, row) * B (16x8 bf16, col), fp32 accumulators, one warp-wide tensor-core op.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with f16 inputs.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 -> one register of two bf16 (lo in the low half, as mma fragments expect).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// The same in f16, saturating at +-65504 (never inf).
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// A warp: the largest of v[0, n) (every lane gets it).
__device__ __forceinline__ float warp_max_of(const float* v, int n) {
  float m = -INFINITY;
  for (int i = threadIdx.x & 31; i < n; i += 32) m = fmaxf(m, v[i]);
  return warp_max(m);
}

// A warp: v[i] = exp(v[i] - m) for i < n, in place; returns their sum (every lane).
__device__ __forceinline__ float warp_exp_sum(float* v, int n, float m) {
  float sum = 0.0f;
  for (int i = threadIdx.x & 31; i < n; i += 32) {
    const float e = __expf(v[i] - m);
    v[i] = e;
    sum += e;
  }
  return warp_sum(sum);
}

// A warp: one attention head's d values x (fp32, shared memory) RMS-normalised by `norm` (Qwen3's
// q/k norm; null: none) and rotated by the RoPE row cs ([rotary_dim]: cos | sin, neox pairs;
// null: none), in place, each value rounded to bf16 where the layer-by-layer path stores it.
__device__ __forceinline__ void warp_norm_rope_head(float* x, int d, const bf16* norm, float eps, const float* cs,
                                                    int rotary_dim) {
  const int lane = threadIdx.x & 31;
  if (norm != nullptr) {
    float sum_sq = 0.0f;
    for (int i = lane; i < d; i += 32) sum_sq += x[i] * x[i];
    const float inv = rsqrtf(warp_sum(sum_sq) / static_cast<float>(d) + eps);
    for (int i = lane; i < d; i += 32) x[i] = round_bf16(__bfloat162float(norm[i]) * (x[i] * inv));
    __syncwarp();
  }
  if (cs != nullptr) {
    const int half = rotary_dim / 2;
    for (int j = lane; j < half; j += 32) {  // pairs (j, j + half), each pair one lane's
      const float a = x[j], b = x[j + half];
      x[j] = round_bf16(a * cs[j] - b * cs[half + j]);
      x[j + half] = round_bf16(b * cs[j] + a * cs[half + j]);
    }
  }
  __syncwarp();
}

// Position j of a sequence -> its row in the paged cache ([num_blocks * block_size] rows) through
// the sequence's block table. Block sizes are powers of two in practice (16), where a shift and a
// mask replace two ~20-instruction integer divisions per row.
struct PagedRows {
  const int32_t* table;
  int block_size;
  int shift;  // log2(block_size) when it is a power of two, else -1

  __device__ __forceinline__ PagedRows(const int32_t* t, int bs) : table(t), block_size(bs), shift(-1) {
    if ((bs & (bs - 1)) == 0) {
      shift = 0;
      while ((1 << shift) < bs) ++shift;
    }
  }
  __device__ __forceinline__ int64_t row(int j) const {
    if (shift >= 0) return (static_cast<int64_t>(table[j >> shift]) << shift) + (j & (block_size - 1));
    return static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
  }
};

}  // namespace specula::cuda
