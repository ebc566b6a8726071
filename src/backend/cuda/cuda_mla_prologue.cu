// The MLA attention prologue in one launch (Backend::mla_prologue): per token, the compressed
// latent's RMSNorm, the rope of the shared key and of every head's query rope part, the cache
// entry [norm(latent) | rope(k_pe)] and the roped query parts in place in the absorbed query. At
// decode batch sizes each of the separate ops (nine column copies, the norm, rope, the cache
// write) moves a few kilobytes and costs its launch and a memory round trip; the copies are
// copy-engine work that also breaks the overlapped launches of the kernels around them.
//
// Shape: one block per token. Thread i holds the latent's i-th 16-byte vector, as rms_norm's
// one-vector-a-thread rows do, so the block reduction adds the same partial sums in the same
// order and the normalised latent has the separate op's bits; rope pairs then go over the
// block, each computed as the rope op computes it.
#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kMinThreads = 128;

template <class T>
__global__ void mla_prologue_kernel(MlaPrologueParams p) {
  __shared__ float reduce_buf[32];
  allow_next_kernel_start();
  wait_for_previous_kernels();  // q and kv_a are the projections' outputs
  constexpr int kN = Vec16<T>::kN;
  const int64_t token = blockIdx.x;
  const int latent = p.latent, dr = p.rope_dim, half = dr / 2, entry = latent + dr;
  const int64_t slot = p.slots[token];
  const bool keep = slot >= 0 && slot < p.num_slots;
  const T* kv = static_cast<const T*>(p.kv_a) + token * entry;
  T* cached = keep ? static_cast<T*>(p.cache) + slot * entry : nullptr;

  const bool mine = threadIdx.x < latent / kN;
  float a[kN];
  float sum_sq = 0.0f;
  if (mine) {
    load_vec(kv + threadIdx.x * kN, a);
#pragma unroll
    for (int i = 0; i < kN; ++i) sum_sq += a[i] * a[i];
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, reduce_buf) / static_cast<float>(latent) + p.eps);
  if (mine && keep) {
    float g[kN];
    load_vec(static_cast<const T*>(p.kv_norm) + threadIdx.x * kN, g);
#pragma unroll
    for (int i = 0; i < kN; ++i) a[i] = g[i] * (a[i] * inv_rms);
    store_vec(cached + threadIdx.x * kN, a);
  }

  // Rope pairs: each query head's rope part, then the shared key (past the table: copied as is,
  // as the rope op leaves such a token alone).
  const int32_t pos = p.positions[token];
  const bool rotates = pos >= 0 && pos < p.max_pos;
  const float* cos = p.cos_sin + static_cast<int64_t>(rotates ? pos : 0) * dr;
  const float* sin = cos + half;
  const int q_width = p.nope_dim + dr;
  const T* q = static_cast<const T*>(p.q) + token * p.heads * q_width;
  T* q_mla = static_cast<T*>(p.q_mla) + token * p.heads * entry;
  const int pairs = (p.heads + 1) * half;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int head = i / half, j = i % half;
    const T* src;
    T* dst;
    if (head < p.heads) {
      src = q + head * q_width + p.nope_dim;
      dst = q_mla + head * entry + latent;
    } else {
      if (!keep) continue;
      src = kv + latent;
      dst = cached + latent;
    }
    const int ia = p.neox ? j : 2 * j, ib = p.neox ? j + half : 2 * j + 1;
    if (!rotates) {
      dst[ia] = src[ia];
      dst[ib] = src[ib];
      continue;
    }
    const float x = to_float(src[ia]), y = to_float(src[ib]), c = cos[j], s = sin[j];
    dst[ia] = from_float<T>(x * c - y * s);
    dst[ib] = from_float<T>(y * c + x * s);
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

template <class T>
bool supported_typed(const MlaPrologueParams& p) {
  constexpr int kN = Vec16<T>::kN;
  const size_t entry_bytes = static_cast<size_t>(p.latent + p.rope_dim) * sizeof(T);
  return p.latent > 0 && p.latent % kN == 0 && p.latent / kN <= 1024 && p.rope_dim > 0 && p.rope_dim % 2 == 0 &&
         entry_bytes % 16 == 0 && aligned16(p.kv_a) && aligned16(p.kv_norm) && aligned16(p.cache);
}

}  // namespace

bool mla_prologue_supported(const MlaPrologueParams& p, DType dtype) {
  if (dtype == DType::kBF16) return supported_typed<bf16>(p);
  if (dtype == DType::kF32) return supported_typed<float>(p);
  return false;
}

cudaError_t launch_mla_prologue(const MlaPrologueParams& p, DType dtype, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (!mla_prologue_supported(p, dtype)) return cudaErrorInvalidValue;
  const int vecs = p.latent / (dtype == DType::kBF16 ? Vec16<bf16>::kN : Vec16<float>::kN);
  const int threads = vecs <= kMinThreads ? kMinThreads : (vecs + 31) / 32 * 32;
  const LaunchShape shape{dim3(static_cast<unsigned>(p.tokens)), dim3(static_cast<unsigned>(threads))};
  if (dtype == DType::kBF16) return launch_overlapped(mla_prologue_kernel<bf16>, shape, stream, p);
  return launch_overlapped(mla_prologue_kernel<float>, shape, stream, p);
}

}  // namespace specula::cuda
