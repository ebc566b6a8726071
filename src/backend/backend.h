// The op set that models are written against. One implementation per device: backend/cpu (fp32,
// OpenBLAS + OpenMP) and backend/cuda (bf16 storage, fp32 accumulation). Every CUDA kernel has
// its CPU twin here and a test that compares the two on random inputs.
//
// Conventions: all tensors passed to an op live on the backend's device; `out` tensors are
// allocated by the caller with the right shape and dtype; ops run in stream order (asynchronously
// on CUDA) and never synchronise unless the name says so.
#pragma once

#include <memory>
#include <string>

#include "backend/attention_metadata.h"
#include "core/tensor.h"

namespace specula {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // The dtype of weights, activations and the KV cache on this backend: F32 on the CPU, BF16 on
  // CUDA. Logits handed to samplers are always F32.
  virtual DType compute_dtype() const = 0;

  // ---- memory ----
  // Persistent device memory (weights, KV cache, persistent input buffers).
  virtual Tensor empty(Shape shape, DType dtype) = 0;
  // Per-step activation memory from an arena, valid until reset_scratch(). Allocations made in the
  // same order with the same sizes get the same addresses, which is what CUDA-graph replay needs.
  virtual Tensor scratch(Shape shape, DType dtype) = 0;
  virtual void reset_scratch() = 0;
  // Copies between any two devices (host<->device included); same dtype and element count.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // Converts src into dst's dtype (F32/F16/BF16), same device and element count.
  virtual void cast(const Tensor& src, Tensor& dst) = 0;
  // Fills with zero bytes.
  virtual void zero(Tensor& t) = 0;
  // Waits until every op issued so far has finished.
  virtual void synchronize() = 0;

  // ---- the forward pass ----
  // out[t, :] = table[ids[t], :].  ids I32 [T], table [V, H], out [T, H].
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor& out) = 0;
  // out = x / sqrt(mean(x^2) + eps) * weight, row by row over the last dim (computed in fp32).
  // x and out are [rows, H] (any leading shape), weight [H].
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // Fused residual add + norm, in place: residual += x; x = rms_norm(residual) * weight.
  virtual void add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, float eps) = 0;
  // out[M, N] = x[M, K] @ weight[N, K]^T (+ bias[N]); weight in HF's [out_features, in_features].
  virtual void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) = 0;
  // Rotary embedding in place on q [T, Hq, D] and k [T, Hk, D] (either may be a view of a fused
  // qkv buffer reshaped). cos_sin is F32 [max_positions, rotary_dim]: cos in the first half, sin in
  // the second. Only the first rotary_dim dims of each head rotate. neox=true rotates
  // (x[i], x[i + rotary_dim/2]) pairs (HF Llama's rotate_half); neox=false rotates interleaved
  // (x[2i], x[2i+1]) pairs (GPT-J style, DeepSeek's rope_interleave).
  virtual void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& cos_sin, int rotary_dim,
                    bool neox) = 0;
  // gate_up [T, 2I] (gate first, then up) -> out [T, I] = silu(gate) * up.
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;
  // out = a + b, same shapes.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // Writes k, v [T, Hk, D] into the paged cache at slot_mapping[t] (I64; -1 skips the row).
  virtual void write_kv_cache(const Tensor& k, const Tensor& v, KVCacheLayer& cache,
                              const Tensor& slot_mapping) = 0;
  // Causal attention of q [T, Hq, D] over the paged cache (see AttentionMetadata), GQA with
  // Hq / Hk query heads per kv head, softmax(q k^T * scale) v -> out [T, Hq, Dv]. Padding rows of q
  // (past the last sequence) are left untouched.
  virtual void paged_attention(const Tensor& q, const KVCacheLayer& cache, const AttentionMetadata& md,
                               float scale, Tensor& out) = 0;
  // out[i, :] = x[indices[i], :]; indices I32 [L].
  virtual void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) = 0;
};

// fp32 CPU backend; threads = 0 means all cores.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

// True when specula was built with CUDA and a GPU is visible.
bool cuda_available();
// Throws specula::Error when CUDA is unavailable.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0);

}  // namespace specula
