// The fp32 CPU backend: the reference implementation of every op in backend.h. It is what CI and
// the tests run, and the "twin" every CUDA kernel is compared against, so each op is written as
// the plain loop it documents (GEMMs go to OpenBLAS, other loops are split over OpenMP threads).
//
// The methods are defined across several files, one family each:
//   cpu_memory.cc     empty/scratch arena/copy/cast/zero
//   cpu_rowwise_ops.cc embedding, rms_norm, add_rms_norm, silu_mul, add, gather_rows
//   cpu_linear.cc     linear, linear_fp8, quantize_fp8_rows (cblas_sgemm)
//   cpu_rope.cc       rope (neox and interleaved, partial rotary_dim)
//   cpu_attention.cc  write_kv_cache, paged_attention (incl. the MLA cache form)
//   cpu_head_ops.cc   copy_columns, head_linear (MLA's per-head absorbed projections)
//   cpu_moe.cc        moe_route, fused_moe
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace specula {

// Stack allocator for per-step activations. Within one step, allocations are carved from one
// chunk in order (release(mark) pops what was carved after the mark, for reuse); what does not
// fit gets its own allocation and is remembered, so that the next reset replaces the chunk with
// one large enough for the step's highest point. After one step of a given shape
// the same sequence of requests therefore gets the same addresses (what CUDA-graph replay relies
// on; on the CPU it just avoids malloc in the hot loop). Chunks are reference counted by the
// tensors carved from them, so a tensor kept past reset_scratch() reads stale data, never freed
// memory.
class ScratchArena {
 public:
  Tensor allocate(const Shape& shape, DType dtype);
  void reset();
  size_t capacity() const { return capacity_; }
  // Backend::scratch_mark / scratch_release: the position in the step's (virtual) stack.
  size_t mark() const { return offset_; }
  void release(size_t mark);

 private:
  std::shared_ptr<void> chunk_;
  size_t capacity_ = 0;
  size_t offset_ = 0;  // top of the stack; past capacity_, requests get their own allocation
  size_t peak_ = 0;    // highest top this step: what the chunk must hold from the next reset
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);

  Device device() const override { return Device::kCPU; }
  std::string name() const override;
  DType compute_dtype() const override { return DType::kF32; }
  int threads() const { return threads_; }

  Tensor empty(Shape shape, DType dtype) override;
  Tensor scratch(Shape shape, DType dtype) override;
  void reset_scratch() override;
  size_t scratch_mark() override { return arena_.mark(); }
  void scratch_release(size_t mark) override { arena_.release(mark); }
  void copy(const Tensor& src, Tensor& dst) override;
  void cast(const Tensor& src, Tensor& dst) override;
  void zero(Tensor& t) override;
  void synchronize() override {}

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, float eps) override;
  using Backend::linear;
  void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) override;
  void linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor* bias,
                  Tensor& out) override;
  void quantize_fp8_rows(const Tensor& x, Tensor& out, Tensor& scale) override;
  void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& cos_sin, int rotary_dim,
            bool neox) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void write_kv_cache(const Tensor& k, const Tensor& v, KVCacheLayer& cache,
                      const Tensor& slot_mapping) override;
  void paged_attention(const Tensor& q, const KVCacheLayer& cache, const AttentionMetadata& md,
                       float scale, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) override;
  void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) override;
  void head_linear(const Tensor& x, const Tensor& weight, Tensor& out) override;
  void moe_route(const Tensor& router_logits, const Tensor* bias, const MoeRouting& params, Tensor& topk_ids,
                 Tensor& topk_weights) override;
  void fused_moe(const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_ids,
                 const Tensor& topk_weights, Tensor& out) override;

 private:
  int threads_;
  ScratchArena arena_;
};

// Argument checks shared by the op files; each names the op and the parameter at fault.
namespace cpu_check {
// A CPU tensor of dtype F32.
void f32(const Tensor& t, const char* op, const char* param);
// A CPU tensor of the given integer dtype with ndim 1.
void index_vector(const Tensor& t, DType dtype, const char* op, const char* param);
// Same shape.
void same_shape(const Tensor& a, const Tensor& b, const char* op, const char* pa, const char* pb);
}  // namespace cpu_check

}  // namespace specula
