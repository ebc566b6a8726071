// The CUDA backend: bf16 storage, fp32 accumulation, one stream per backend.
//
// Everything a backend does is enqueued on its own (non-blocking) stream, in program order, so
// ops never need to synchronise with each other and the caching allocator can reuse freed blocks
// in stream order. Nothing inside the forward-pass ops allocates device memory outside the
// scratch arena, synchronises, or reads device memory on the host, so a whole decode step can be
// captured into a CUDA graph.
//
// Host <-> device copies (copy()):
//  - from pageable host memory: the call returns after the bytes have been consumed (it waits for
//    the stream), so the caller may reuse or free the host buffer at once;
//  - from pinned host memory (cudaHostAlloc / cudaHostRegister): truly asynchronous; the caller
//    must not modify the buffer until the stream has passed the copy (synchronize() or an event);
//  - to pageable host memory: the data is there when the call returns;
//  - to pinned host memory: asynchronous; read it after synchronize().
// Pageable copies cannot be captured into a graph (they synchronise); pinned ones can.
//
// Methods are defined across files, one family each:
//   cuda_backend.cc    construction, memory, copies, casts
//   cuda_ops.cc        row-wise ops, rope, KV-cache writes (kernels in cuda_rowwise/norm/rope/kv_cache.cu)
//   cuda_linear.cc     linear, fused_linear: small M by the GEMV kernel (cuda_gemv.cu), larger
//                      through cuBLASLt (cuda_gemm.cc); FP8 quantiser and scales (cuda_fp8_linear.cu)
//   cuda_attention.cc  paged attention dispatch (kernels in cuda_attention_{decode,prefill,mla}.cu)
//   cuda_head_ops.cc   copy_columns, head_linear (cuda_batched_gemm.cc), mla_prologue (cuda_mla_prologue.cu)
//   cuda_moe.cc        moe_route, fused_moe (kernels in cuda_moe_route.cu, cuda_fused_moe_*.cu)
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <set>
#include <tuple>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_scratch_arena.h"

namespace specula {

class CublasLtGemm;
class CublasLtBatchedGemm;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::kCUDA; }
  std::string name() const override;
  DType compute_dtype() const override { return DType::kBF16; }

  Tensor empty(Shape shape, DType dtype) override;
  Tensor scratch(Shape shape, DType dtype) override;
  void reset_scratch() override;
  size_t scratch_mark() override { return arena_.mark(); }
  void scratch_release(size_t mark) override { arena_.release(mark); }
  void copy(const Tensor& src, Tensor& dst) override;
  void copy_many(std::span<const CopyPair> pairs) override;
  void cast(const Tensor& src, Tensor& dst) override;
  void zero(Tensor& t) override;
  void synchronize() override;

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, float eps) override;
  using Backend::linear;
  void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) override;
  void fused_linear(const Tensor& x, const LinearPrologue& prologue, const LinearWeight& weight, const Tensor* bias,
                    Tensor& out, LinearEpilogue epilogue) override;
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
  void argmax_rows(const Tensor& x, const Tensor* rows, Tensor& out) override;
  void gather_columns(const Tensor& x, const Tensor& columns, float fill, Tensor& out) override;
  void feed_tokens(Tensor& token_ids, const Tensor& source) override;
  void shift_by_accepted(const AcceptedShift& shift) override;
  void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) override;
  void head_linear(const Tensor& x, const Tensor& weight, Tensor& out) override;
  void mla_prologue(const Tensor& q, const Tensor& kv_a, const MlaPrologue& params, KVCacheLayer& cache,
                    const Tensor& slot_mapping, Tensor& q_mla) override;
  void moe_route(const Tensor& router_logits, const Tensor* bias, const MoeRouting& params, Tensor& topk_ids,
                 Tensor& topk_weights) override;
  void fused_moe(const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_ids,
                 const Tensor& topk_weights, Tensor& out) override;
  // Fused Llama attention prologue (cuda_qkv_prologue.cc; with its projection:
  // cuda_qkv_projection.cc) and the engine's device services
  // (cuda_engine_services.cc: memory query, CUDA-graph capture, the device token sampler).
  void qkv_prologue(const Tensor& qkv, const QkvPrologue& params, KVCacheLayer& cache, const Tensor& slot_mapping,
                    Tensor& q_out) override;
  void qkv_projection(const Tensor& x, const LinearPrologue& input_norm, const LinearWeight& weight, const Tensor* bias,
                      const QkvPrologue& params, KVCacheLayer& cache, const Tensor& slot_mapping,
                      Tensor& q_out) override;
  // The EAGLE-3 head's layer input as one kernel (cuda_ops.cc; cuda_eagle3_layer_input.cu).
  void eagle3_layer_input(const Tensor& token_ids, const Tensor& g, const Eagle3LayerInput& params, Tensor& x,
                          Tensor& residual) override;
  // One persistent kernel for a small decoder's greedy chain (cuda_decoder_chain.cc).
  bool decoder_chain(const DecoderChain& chain) override;
  // One persistent kernel for a small decoder's whole forward (cuda_decoder_forward.cc).
  bool decoder_forward(DecoderForward& forward) override;
  Tensor empty_host(Shape shape, DType dtype) override;
  std::optional<DeviceMemoryInfo> memory_info() override;
  bool idle() override;
  int64_t matmul_rows_class(int64_t rows) const override;
  std::unique_ptr<DeviceGraph> capture_graph(const std::function<void()>& work) override;
  void start_serving() override { serving_ = true; }
  std::unique_ptr<TokenSampler> make_token_sampler(int max_rows, int64_t vocab) override;
  void bind_thread() override;
  void wait_for(Backend& other) override;
  std::unique_ptr<DeviceEvent> record_event() override;
  // On the copy stream (copy_stream_after_work).
  std::unique_ptr<DeviceEvent> copy_to_host_async(const Tensor& src, Tensor& dst) override;

  // ---- CUDA specifics (for the engine's CUDA graphs, benchmarks and tests) ----
  cudaStream_t stream() const { return stream_; }
  // A second stream for the small copies around a step's kernels (results read back, the token
  // sampler's rows uploaded): on the H200 a copy on the compute stream holds the next kernel
  // ~5 us past its end (the copy engine's completion), a few times a decode step.
  // copy_stream_after_work() orders it after the work issued so far on the compute stream and
  // returns it; copy_stream() returns it as it is. With SPECULA_COPY_STREAM=0, or while a graph
  // is captured, both are the compute stream itself.
  cudaStream_t copy_stream();
  cudaStream_t copy_stream_after_work();
  int device_index() const { return device_index_; }
  // Whether p is device memory of this backend's GPU.
  bool on_this_device(const void* p) const;
  int sm_count() const { return sm_count_; }
  // GEMM plans whose algorithm came from timing cuBLASLt's candidates (tests).
  int tuned_gemm_plans() const;
  size_t scratch_capacity() const { return arena_.capacity(); }
  // The most rows the GEMV kernel (cuda_gemv.cu) takes for weights of this dtype (BF16 or
  // F8_E4M3; at most kGemvMaxRows); more go to cuBLASLt's tensor-core GEMMs. Benchmarks and tests
  // move it to measure and check both paths.
  int64_t gemv_max_rows(DType weight) const;
  void set_gemv_max_rows(DType weight, int64_t rows);
  // The tensor-core GEMV (bf16 weights): up to max_rows rows (0: never) for weights of at most
  // max_weight_bytes, and at the GEMV's rows for a norm or SwiGLU the GEMV does not fold in; else
  // cuBLASLt with separate norm / SwiGLU kernels. SPECULA_GEMV_MMA=0 sets max_rows to 0 at
  // construction.
  int64_t gemv_mma_max_rows() const { return gemv_mma_max_rows_; }
  void set_gemv_mma_limits(int64_t max_rows, int64_t max_weight_bytes);
  // The most key splits of a decode attention that merge inside its launch (a thread-block
  // cluster, cuda_attention_decode.cu); more splits use the merge kernel, and 0 or 1 keep it for
  // every split count (benchmarks and tests compare the two).
  int decode_cluster_splits() const { return decode_cluster_splits_; }
  void set_decode_cluster_splits(int splits);
  // Whether linear_fp8 found cuBLASLt without an FP8 algorithm for this weight shape and out dtype
  // (it then runs the GEMV kernel for every M).
  bool fp8_gemm_unsupported(int64_t n, int64_t k, DType out) const {
    return fp8_gemm_unsupported_.count({n, k, out}) != 0;
  }

 private:
  int device_index_;
  int sm_count_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t handoff_ = nullptr;  // recorded when another backend's stream waits for this one (wait_for)
  cudaStream_t copy_stream_ = nullptr;  // null: SPECULA_COPY_STREAM=0
  cudaEvent_t copy_fork_ = nullptr;     // recorded on stream_ for copy_stream_after_work
  CudaScratchArena arena_;
  std::unique_ptr<CublasLtGemm> gemm_;
  bool serving_ = false;  // start_serving() was called: GEMM candidates are no longer timed
  std::unique_ptr<CublasLtBatchedGemm> batched_gemm_;  // head_linear
  // decoder_chain: whether a cluster of (size, shared-memory bytes) fits the GPU, asked
  // once per shape (the launch is on every draft chain).
  std::map<std::pair<int, int64_t>, bool> chain_cluster_fits_;
  int64_t smem_budget_ = 0;  // dynamic shared memory a block may ask for, less the kernel's static share
  bool chain_logged_ = false;
  // decoder_forward: the blocks of (kernel rows, shared-memory bytes) the GPU holds at once.
  std::map<std::pair<int, int64_t>, int> forward_blocks_fit_;
  bool forward_logged_ = false;
  // SPECULA_FUSED_FORWARD_TRACE=1: the last fused forward's per-block event times, summarised in
  // the log when the backend goes (report_forward_trace).
  unsigned long long* forward_trace_ = nullptr;
  int traced_blocks_ = 0, traced_layers_ = 0;
  void report_forward_trace();
  // out (+)= x . weight^T (+ bias) for FP8 weights (accumulate: out +=, see fused_linear).
  void fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor* bias, Tensor& out,
                  bool accumulate);
  // fused_linear for FP8 weights through cuBLASLt's FP8 GEMM (x BF16 [m, k], m above the GEMV's
  // rows): the norm with the activations' quantiser, the scales with the epilogue. False, with
  // nothing written, where cuBLASLt has no algorithm for the shape or the norm's operands are
  // unaligned (the caller then takes the GEMV or the separate ops).
  // fp8_gemm_linear's first half: x's rows quantised (after the prologue's norm) into x_scale
  // ([M] F32) and codes, then the unscaled FP8 GEMM into product ([M, N], its dtype the
  // output's); false where fp8_gemm_linear would return false.
  bool fp8_gemm_product(const Tensor& x, const LinearPrologue& prologue, const LinearWeight& weight, Tensor& product,
                        Tensor& x_scale);
  // qkv_projection for FP8 weights above the GEMV's rows: the prologue reads the GEMM's unscaled
  // product and applies its scales (no scale pass). False where the shape takes another path
  // (the caller then runs the two ops).
  bool fp8_qkv_projection(const Tensor& x, const LinearPrologue& input_norm, const LinearWeight& weight,
                          const Tensor* bias, const QkvPrologue& params, KVCacheLayer& cache,
                          const Tensor& slot_mapping, Tensor& q_out);
  bool fp8_gemm_linear(const Tensor& x, const LinearPrologue& prologue, const LinearWeight& weight,
                       const Tensor* bias, Tensor& out, LinearEpilogue epilogue);
  int64_t bf16_gemv_max_rows_ = 4;
  int64_t gemv_mma_max_rows_ = default_gemv_mma_max_rows();
  int64_t gemv_mma_max_weight_bytes_ = default_gemv_mma_max_weight_bytes();
  int64_t gemv_mma_min_rows_ = default_gemv_mma_min_rows();
  static int64_t default_gemv_mma_max_rows();
  static int64_t default_gemv_mma_max_weight_bytes();
  static int64_t default_gemv_mma_min_rows();
  // From gemv_mma_min_rows_ rows (cuda::kGemvMmaMinRows; SPECULA_GEMV_MMA_MIN_ROWS at
  // construction) small weights take the tensor-core form before the GEMV.
  bool gemv_mma_first(int64_t m, int64_t weight_bytes) const;
  // Whether the tensor-core GEMV takes m rows of bf16 weights of weight_bytes (see
  // set_gemv_mma_limits); `unfolded`: at m rows the GEMV would leave its norm or SwiGLU to a
  // kernel of its own.
  bool gemv_mma_takes(int64_t m, int64_t weight_bytes, bool unfolded) const;
  int decode_cluster_splits_ = 0;  // set in the constructor (sm_90+: cuda::kMaxClusterSplits)
  // Above fp8_gemv_max_rows_: cuBLASLt's FP8 GEMM, except for the (N, K, out dtype) it has no
  // algorithm for on this GPU, which run the GEMV kernel over slices of rows.
  // 2: at 3-4 rows the FP8 GEMV converts and multiplies more than it streams (Llama-3.1-8B's
  // layer 112 us against 81 through cuBLASLt on the H200; 1-2 rows: 84 against 82).
  int64_t fp8_gemv_max_rows_ = 2;
  std::set<std::tuple<int64_t, int64_t, DType>> fp8_gemm_unsupported_;
};

// Throws specula::Error "<what>: <CUDA error string>" unless err is cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

// Argument checks shared by the op files; each names the op and the parameter at fault.
namespace cuda_check {
// A defined tensor on the GPU.
void on_gpu(const Tensor& t, const char* op, const char* param);
// On the GPU with dtype F32 or BF16.
void float_tensor(const Tensor& t, const char* op, const char* param);
// On the GPU with exactly this dtype.
void dtype(const Tensor& t, DType dtype, const char* op, const char* param);
// A 1-d tensor of the given integer dtype on the GPU.
void index_vector(const Tensor& t, DType dtype, const char* op, const char* param);
void same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* pa, const char* pb);
void same_shape(const Tensor& a, const Tensor& b, const char* op, const char* pa, const char* pb);
}  // namespace cuda_check

}  // namespace specula
