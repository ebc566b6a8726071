// Launchers of the CUDA kernels: plain functions over raw device pointers, called by CudaBackend
// after it has checked its arguments (so the .cu files stay free of fmt/spdlog and compile fast).
// Every launcher enqueues on `stream` and returns cudaGetLastError() of its launch; none of them
// allocates, synchronises or reads device memory from the host, so all of them can be captured
// into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace specula::cuda {

// dst[i] = convert(src[i]) between F32, F16 and BF16 (round to nearest even).
cudaError_t launch_cast(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t stream);

// dst row i = src row idx[i] - first_index (row_bytes each); an index outside [first_index,
// first_index + src_rows) yields a zero row (the host cannot check device-resident indices without
// a sync; a vocab-parallel embedding relies on it). Used by embedding too.
cudaError_t launch_gather_rows(const void* src, int64_t src_rows, size_t row_bytes, const int32_t* idx, int64_t n,
                               void* dst, cudaStream_t stream, int64_t first_index = 0);

// out[i] = first argmax of row rows[i] (rows null: row i) of x F32 [x_rows, vocab], i < n; a row
// index outside [0, x_rows) gives 0 (as gather_rows, the host cannot check device indices).
// out[r, n] = x[r, columns[n]] or fill where columns[n] < 0 (Backend::gather_columns).
cudaError_t launch_gather_columns(const float* x, int64_t rows, int64_t x_cols, const int32_t* columns, int64_t n,
                                  float fill, float* out, cudaStream_t stream);
// rows x row_bytes from src (rows src_pitch bytes apart) to dst (dst_pitch apart), one kernel
// launched overlapped (Backend::copy_columns at forward sizes); elem_bytes: the element's size.
cudaError_t launch_copy_columns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t rows,
                                int64_t row_bytes, int64_t elem_bytes, cudaStream_t stream);
// Whether a copy of `bytes` between buffers of this GPU runs as launch_copy_columns (forward
// sizes) rather than on the copy engines. SPECULA_DEVICE_COPY_KERNEL=0: never.
bool device_copy_as_kernel(int64_t bytes);
// dst[i][0, bytes[i]) = src[i][0, bytes[i]) for i < count, one kernel (Backend::copy_many): src
// may be pinned host memory that the device addresses directly.
constexpr int kMaxCopyRanges = 16;
struct CopyRanges {
  const void* src[kMaxCopyRanges] = {};
  void* dst[kMaxCopyRanges] = {};
  int64_t bytes[kMaxCopyRanges] = {};
  int count = 0;
};
cudaError_t launch_copy_ranges(const CopyRanges& ranges, cudaStream_t stream);
// token_ids[i] = source[-(token_ids[i] + 1)] where token_ids[i] < 0 (Backend::feed_tokens); an
// index past source_len gives 0 (the host cannot check device-resident ids).
cudaError_t launch_feed_tokens(int32_t* token_ids, int64_t n, const int32_t* source, int64_t source_len,
                               cudaStream_t stream);
cudaError_t launch_argmax_rows(const float* x, int64_t x_rows, int64_t vocab, const int32_t* rows, int64_t n,
                               int32_t* out, cudaStream_t stream);

// Small-M linear layers (cuda_gemv.cu): y[i, r] = scale[r] * (in[i, :] . w[r, :]) (+ bias[r]) for
// i < m, r < n, with in = x, or rms_norm(x, norm_weight, eps) as rms_norm stores it; then
// out = y, out += y rounded to out's dtype, or out = silu_mul(y) ([m, n / 2]): Backend::
// fused_linear. w BF16 or F8_E4M3 [n, k] (scale F32 [n] for F8, null for BF16); x BF16 [m, k];
// bias F32 or BF16 (or null); out F32 or BF16.
enum class GemvEpilogue { kStore, kAccumulate, kSiluMul };
struct GemvArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  DType w_dtype = DType::kBF16;
  const float* scale = nullptr;
  const void* bias = nullptr;
  DType bias_dtype = DType::kF32;
  void* out = nullptr;
  DType out_dtype = DType::kBF16;
  GemvEpilogue epilogue = GemvEpilogue::kStore;
  int64_t m = 0, n = 0, k = 0;
  const void* norm_weight = nullptr;  // BF16 [k], or null: no norm
  float eps = 0.0f;
};
// The most rows without a norm, and with one (whose rows are staged in shared memory: each block
// normalises them all, which at 3-4 rows costs more than the separate norm kernel on the H100).
constexpr int64_t kGemvMaxRows = 16;
constexpr int64_t kGemvMaxNormRows = 2;
constexpr int64_t kGemvMaxGatedRows = 4;  // SwiGLU
// What launch_gemv takes: the dtypes above, k a multiple of the 16-byte chunk (8 bf16 or 16 e4m3
// weights), 16-byte aligned x, w and norm weight, m within the limits (kSiluMul: n even, at most
// 4 rows), a norm's rows within 64 KiB of shared memory.
bool gemv_supports(const GemvArgs& args);
cudaError_t launch_gemv(const GemvArgs& args, cudaStream_t stream);
// The same on the tensor cores (cuda_gemv_mma.cu), for bf16 weights and up to kGemvMmaMaxRows
// rows: verification steps and small batches, where the GEMV's activation loads bound it. Takes
// every epilogue at every row count, and the norm while its rows fit 96 KiB of shared memory.
constexpr int64_t kGemvMmaMaxRows = 16;
// Above this many bytes of weights cuBLASLt streams 5-16 rows faster (Llama-3.1-8B's projections
// at 87-94 % of copy, this kernel's at 36-55 %; Qwen3-0.6B's 4-12 MB ones split); below it a
// projection is a launch's latency, and the norm and SwiGLU folded in are launches saved
// (docs/PERFORMANCE.md, "Verification rows on the tensor cores").
constexpr int64_t kGemvMmaMaxWeightBytes = 2 << 20;
// From this many rows small weights take the tensor-core form ahead of the GEMV: at 2-4 rows of
// the embedded model's projections the GEMV's activation loads (8 of every row per 16-byte weight
// chunk) outlast the mma's few k-steps, ~3.9 against ~3.1 us a call (docs/PERFORMANCE.md, "Small
// weights on the tensor cores from two rows").
constexpr int64_t kGemvMmaMinRows = 2;
bool gemv_mma_supports(const GemvArgs& args);
cudaError_t launch_gemv_mma(const GemvArgs& args, cudaStream_t stream);
// out[i, r] = in[i, r] * x_scale[i] * w_scale[r] (+ bias[r]), or out[i, r] += that rounded to out's
// dtype (accumulate), in and out F32 or BF16 [m, n] (in may be out when not accumulating): the row
// scales of an unscaled FP8 GEMM.
cudaError_t launch_fp8_scale_output(const void* in, void* out, DType out_dtype, const float* x_scale,
                                    const float* w_scale, const void* bias, DType bias_dtype, bool accumulate,
                                    int64_t m, int64_t n, cudaStream_t stream);
// SwiGLU after those scales: in [m, 2 * inter] unscaled (gate columns, then up), out[i, c] =
// silu(g) * u of the scaled gate and up columns c and inter + c, each rounded to out's dtype first
// (what fp8_scale_output then silu_mul compute). F32 or BF16.
cudaError_t launch_fp8_scale_silu(const void* in, void* out, DType out_dtype, const float* x_scale,
                                  const float* w_scale, const void* bias, DType bias_dtype, int64_t m, int64_t inter,
                                  cudaStream_t stream);
// Backend::quantize_fp8_rows over x (F32 or BF16) [rows, k].
cudaError_t launch_quantize_fp8_rows(const void* x, DType dtype, int64_t rows, int64_t k, uint8_t* out, float* scale,
                                     cudaStream_t stream);
// rms_norm (bf16 x [rows, k], weight w [k]) then quantize_fp8_rows of its bf16 result, in one
// kernel: codes [rows, k] and row scales. Needs k % 8 == 0, x and w 16-byte aligned, out 8.
bool rms_norm_quantize_fp8_supports(const void* x, const void* w, int64_t k, const uint8_t* out);
cudaError_t launch_rms_norm_quantize_fp8(const void* x, const void* w, int64_t rows, int64_t k, float eps,
                                         uint8_t* out, float* scale, cudaStream_t stream);

// out = a + b over n elements of dtype (F32 or BF16).
cudaError_t launch_add(const void* a, const void* b, void* out, int64_t n, DType dtype, cudaStream_t stream);

// out[r, :] += bias[:] for r < rows; out and bias each F32 or BF16.
cudaError_t launch_add_bias(void* out, DType out_dtype, const void* bias, DType bias_dtype, int64_t rows, int64_t n,
                            cudaStream_t stream);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i].
cudaError_t launch_silu_mul(const void* gate_up, void* out, int64_t rows, int64_t inter, DType dtype,
                            cudaStream_t stream);

// out = x * rsqrt(mean(x^2) + eps) * w per row of h elements; out may alias x.
cudaError_t launch_rms_norm(const void* x, const void* w, void* out, int64_t rows, int64_t h, float eps, DType dtype,
                            cudaStream_t stream);
// residual += x (rounded to the storage type); x = rms_norm(residual) * w.
cudaError_t launch_add_rms_norm(void* x, void* residual, const void* w, int64_t rows, int64_t h, float eps,
                                DType dtype, cudaStream_t stream);

// Backend::eagle3_layer_input for bf16 rows of h (cuda_eagle3_layer_input.cu), the same bits as
// its ops one by one; an id outside [0, vocab) embeds as a zero row, as gather_rows writes it.
// Launched normally (not overlapped): it stands where the head's forward gathered its embedding.
bool eagle3_layer_input_supports(const void* table, const void* g, const void* input_norm, const void* hidden_norm,
                                 const void* x, const void* residual, int64_t h);
cudaError_t launch_eagle3_layer_input(const int32_t* token_ids, const void* table, int64_t vocab, const void* g,
                                      const void* input_norm, const void* hidden_norm, int64_t rows, int64_t h,
                                      float eps, bool norm_before_residual, void* x, void* residual,
                                      cudaStream_t stream);

// Rotary embedding in place (see Backend::rope). Rows whose position is outside [0, max_pos) are
// left unchanged.
cudaError_t launch_rope(void* q, void* k, const int32_t* positions, const float* cos_sin, int64_t max_pos,
                        int64_t tokens, int hq, int hk, int head_dim, int rotary_dim, bool neox, DType dtype,
                        cudaStream_t stream);

// cache row slots[t] = row t of k (and of v), for t < tokens; slot -1 (or outside [0, num_slots))
// skips the row.
cudaError_t launch_write_kv_cache(const void* k, const void* v, void* k_cache, void* v_cache, const int64_t* slots,
                                  int64_t tokens, size_t k_row_bytes, size_t v_row_bytes, int64_t num_slots,
                                  cudaStream_t stream);
// The same into an fp8 (e4m3) cache: k [tokens, k_row] and v [tokens, v_row] of type `from` (BF16
// or F32), stored as x / k_scale and x / v_scale (v null: the MLA form, k only).
cudaError_t launch_write_kv_cache_fp8(const void* k, const void* v, DType from, void* k_cache, void* v_cache,
                                      const int64_t* slots, int64_t tokens, int64_t k_row, int64_t v_row,
                                      int64_t num_slots, float k_scale, float v_scale, cudaStream_t stream);

// ---- paged attention (bf16 q / cache / out, fp32 softmax) ----
struct PagedAttentionParams {
  const void* q = nullptr;        // [T, Hq, D]
  const void* k_cache = nullptr;  // [num_blocks, block_size, Hk, D], bf16 or (cache_fp8) e4m3
  const void* v_cache = nullptr;  // [num_blocks, block_size, Hk, Dv], the same type
  void* out = nullptr;            // [T, Hq, Dv]
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]
  const int32_t* seq_lens = nullptr;         // [num_seqs]
  const int32_t* block_tables = nullptr;     // [num_seqs, max_blocks_per_seq]
  int num_seqs = 0;
  int max_blocks_per_seq = 0;
  int block_size = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;    // D, a multiple of 8, at most 256
  int v_head_dim = 0;  // Dv, a multiple of 8, at most 256
  float scale = 1.0f;
  // An fp8 cache stores K / k_scale and V / v_scale (KVCacheLayer); MLA caches are bf16 only.
  bool cache_fp8 = false;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  int max_query_len = 0;  // host-side maxima over the batch; they size the grids
  int max_seq_len = 0;
  int num_query_rows = 0;  // query_start_loc[num_seqs]: rows of q that belong to sequences
  int sm_count = 0;        // the GPU's: how a decode batch fills it picks the kernel's shape
  // query_start_loc, seq_lens, block_tables and the cache rows before each sequence's first query
  // row were written before the forward's first launch that is not overlapped (cuda_launch.cuh):
  // the split-KV decode kernel then reads them before it waits for the previous kernel.
  bool metadata_before_wait = false;
};

// Largest head dim the attention kernels take; head dims must be multiples of this granule.
constexpr int kMaxAttentionHeadDim = 256;
constexpr int kAttentionHeadDimGranule = 8;

// Split-KV decode, for batches where every sequence has at most kMaxDecodeQueryLen query rows
// (decode, and verification of up to kMaxDecodeQueryLen - 1 draft tokens). How many splits of
// each sequence's keys to run in parallel for this batch on a GPU with `sm_count` SMs; 1 means no
// partial buffers are needed.
constexpr int kMaxDecodeQueryLen = 8;
int decode_num_splits(const PagedAttentionParams& p, int sm_count);
// Up to kMaxClusterSplits splits can merge inside the launch (one thread-block cluster per
// sequence and kv head; sm_90+): pass null partials. Otherwise partial_out F32 [num_query_rows,
// Hq, num_splits, Dv] and partial_stats F32 [num_query_rows, Hq, num_splits, 2] are scratch for
// num_splits > 1 and a merge kernel follows.
constexpr int kMaxClusterSplits = 16;
cudaError_t launch_decode_attention(const PagedAttentionParams& p, int num_splits, float* partial_out,
                                    float* partial_stats, cudaStream_t stream);
// The same on the tensor cores, one block a (sequence, kv head) and no split, for a bf16 or fp8
// cache with head dims of 64 or 128 (K and V alike), decode steps (one query row a sequence) of
// at most 16 query heads a kv head, and batches with (sequence, kv head) pairs for at least half
// the SMs (H200, Llama heads: batch 16 x 1024 keys 30.4 against 37.7 us split). Verification
// batches that large take the varlen kernel (cuda_attention.cc). launch_decode_attention and
// decode_num_splits take it where it applies (SPECULA_DECODE_ATTENTION_MMA=0: never).
bool decode_attention_mma_applies(const PagedAttentionParams& p);
cudaError_t launch_decode_attention_mma(const PagedAttentionParams& p, cudaStream_t stream);

// Varlen causal flash attention over the paged cache for any query lengths (prefill, chunked
// prefill, verification, mixed batches), on the tensor cores.
cudaError_t launch_prefill_attention(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace specula::cuda
