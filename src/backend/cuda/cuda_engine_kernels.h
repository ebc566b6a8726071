// Launchers of the kernels behind the engine-facing CUDA pieces: the fused Llama attention
// prologue and the device token sampler. Same rules as cuda_kernels.h: raw device pointers, the
// caller has checked its arguments, each launcher enqueues on `stream` and returns
// cudaGetLastError(), nothing allocates, synchronises or reads device memory on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace specula::cuda {

// ---- fused attention prologue (see Backend::qkv_prologue) ----
struct QkvPrologueParams {
  const void* qkv = nullptr;      // [T, (Hq + 2 Hk) D]
  const void* q_norm = nullptr;   // [D] or null
  const void* k_norm = nullptr;   // [D] or null
  const int32_t* positions = nullptr;
  const float* cos_sin = nullptr;  // [max_pos, rotary_dim]
  const int64_t* slots = nullptr;  // [T]
  void* q_out = nullptr;           // [T, Hq, D]
  void* k_cache = nullptr;         // [num_slots, Hk, D], the compute type or (cache_fp8) e4m3
  void* v_cache = nullptr;
  bool cache_fp8 = false;          // stores K / k_scale and V / v_scale (KVCacheLayer)
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  int64_t tokens = 0;
  int64_t max_pos = 0;
  int64_t num_slots = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // at most 256
  int rotary_dim = 0;
  bool neox = true;
  float eps = 1e-6f;
  // An FP8 GEMM's unscaled product in qkv (x_scale null: qkv is the projection itself): element
  // (t, c) stands for fp8_scaled(qkv[t, c], x_scale[t], w_scale, bias, c) rounded to the compute
  // type, what the scale pass would have stored (CudaBackend::qkv_projection).
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
  const void* bias = nullptr;
  bool bias_f32 = false;
};
constexpr int kMaxPrologueHeadDim = 256;
cudaError_t launch_qkv_prologue(const QkvPrologueParams& p, DType dtype, cudaStream_t stream);

// ---- the qkv projection of one decode row with the prologue above in its epilogue ----
// (Backend::qkv_projection): prologue(rms_norm(x) . w^T (+ bias)), the qkv row rounded to bf16 as
// fused_linear stores it; the compute type is bf16.
struct QkvProjectionParams {
  const void* x = nullptr;            // [1, K] bf16
  const void* norm_weight = nullptr;  // [K] bf16, or null: x as it is
  float norm_eps = 0.0f;
  const void* w = nullptr;  // [(Hq + 2 Hk) D, K], bf16 or e4m3
  bool w_fp8 = false;
  const float* w_scale = nullptr;  // F32 [(Hq + 2 Hk) D] for e4m3
  const void* bias = nullptr;      // [(Hq + 2 Hk) D] or null
  DType bias_dtype = DType::kF32;
  int64_t k = 0;
  QkvPrologueParams prologue;  // its qkv is unused and tokens is 1
};
// SPECULA_FUSED_QKV_PROJECTION=0 runs qkv_projection as its two ops at every row count (A/B runs).
bool fused_qkv_projection_enabled();
// Whether launch_qkv_projection takes these shapes (and SPECULA_FUSED_QKV_PROJECTION is not 0).
bool qkv_projection_supports(const QkvProjectionParams& p);
cudaError_t launch_qkv_projection(const QkvProjectionParams& p, cudaStream_t stream);

}  // namespace specula::cuda

namespace specula::cuda {

// ---- token sampling (see backend/token_sampler.h for the math) ----
// Per-token flags in the counts buffer ([rows, V] uint32, one row per sampling row that has
// penalties, masked ids or a logit bias): the output count in the low 29 bits, "has a logit
// bias" (look it up in the row's bias pairs), "in the prompt" and "masked".
constexpr uint32_t kCountMask = (1u << 29) - 1;
constexpr uint32_t kBiasBit = 1u << 29;
constexpr uint32_t kPromptSeenBit = 1u << 30;
constexpr uint32_t kMaskedBit = 1u << 31;

struct SamplingRowDesc {
  int32_t logits_row = 0;
  int32_t greedy = 1;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t counts_row = -1;  // row of the counts buffer, -1: no penalties, masks or bias
  // logit_bias: bias_count (id, float bits) pairs from ids[bias_begin], sorted by id.
  int32_t bias_begin = 0;
  int32_t bias_count = 0;
  int32_t top_n = -1;       // logprobs: -1 none, else the top N (<= the sampler's max) besides the target
  int32_t target = -1;      // >= 0: do not sample, report logprobs of this token (prompt logprobs)
  int32_t draft_token = -1; // >= 0: verify this draft token against q = row q_row of the draft probabilities
  int32_t q_row = -1;
  int32_t probs_out_row = -1;  // >= 0: sampling rows write their final distribution to this row of probs_out
  // >= 0: structured outputs' allowed-token bitmask, ceil(V / 32) words from ids[allowed_begin];
  // a clear bit makes the token -inf.
  int32_t allowed_begin = -1;
  double uniform = 0.0;
  double uniform_accept = 0.0;    // verification: the min(1, p/q) test
  double uniform_residual = 0.0;  // verification: the draw from max(0, p - q)
};

// Where a counts row's ids lie in the ids array: [prompt_begin, output_begin) prompt ids (seen
// bit), [output_begin, masked_begin) output ids (counted), [masked_begin, bias_begin) masked ids,
// [bias_begin, end) logit-bias (id, float bits) pairs (bias bit).
struct CountsDesc {
  int32_t prompt_begin = 0, output_begin = 0, masked_begin = 0, bias_begin = 0, end = 0;
};

struct SamplingRowResult {
  int32_t token = 0;     // -1: the row had no finite logit to sample from
  int32_t rank = 0;
  float logprob = 0.0f;
  int32_t num_top = 0;   // entries written to the row's top list (unsorted; the host sorts)
  double lse = 0.0;      // log-sum-exp of the raw row: logprob of a top entry = logit - lse
  int32_t accepted = 0;  // verification: the draft token was accepted (token == draft_token)
};

// A top-logprob candidate with its raw logit (the host orders by logit, as its own sampler does,
// before rounding logit - lse to float can create ties).
struct TopLogprob {
  int32_t token = 0;
  float logit = 0.0f;
};

// counts[r, :] for r < num_rows from the id lists (the rows must have been zeroed).
cudaError_t launch_build_token_counts(const CountsDesc* descs, const int32_t* ids, int num_rows, uint32_t* counts,
                                      int64_t vocab, cudaStream_t stream);

// Async scheduling's token feed: token_ids[i] = results[-(token_ids[i] + 1)].token where
// token_ids[i] < 0 (0 for a row that sampled nothing: its step fails when the host reads it).
cudaError_t launch_feed_sampled_tokens(int32_t* token_ids, int64_t n, const SamplingRowResult* results,
                                       cudaStream_t stream);

// Chained drafts: out[i] = results[i].token (0 for a row that sampled nothing).
cudaError_t launch_copy_sampled_tokens(const SamplingRowResult* results, int n, int32_t* out, cudaStream_t stream);

// A row that only draws (greedy or at a temperature; no top-k / top-p / min-p, penalties, masks,
// bias, logprobs or verification; it may keep its distribution in probs_out):
// launch_sample_plain_rows samples batches of them with a cluster of 16 blocks per row (sm_90), to
// the same tokens and probs_out rows as launch_sample_rows. Up to 64 rows measured faster than a
// block a row (H200, 128k vocabulary, 64 rows: 67 against 195 us).
constexpr int kMaxPlainClusterRows = 64;
bool sampling_row_is_plain(const SamplingRowDesc& d, int64_t vocab);
cudaError_t launch_sample_plain_rows(const float* logits, int64_t vocab, const SamplingRowDesc* rows, int num_rows,
                                     float* probs_out, SamplingRowResult* results, cudaStream_t stream);

// One block per row: penalties, greedy argmax, the filtered draw or the verification of a draft
// token (draft_probs: F32 [R, V], may be null when no row verifies), logprobs of the raw logits.
// probs_out: F32 [R', V], may be null when no row has probs_out_row >= 0. top: [num_rows,
// max_top] entries.
// ids: the array the counts were built from (rows' logit-bias pairs are read from it).
cudaError_t launch_sample_rows(const float* logits, int64_t vocab, const SamplingRowDesc* rows, int num_rows,
                               const uint32_t* counts, const int32_t* ids, const float* draft_probs,
                               float* probs_out, SamplingRowResult* results, TopLogprob* top, int max_top,
                               cudaStream_t stream);

// Speculative decoding's launch-ahead (Backend::shift_by_accepted, backend/accepted_shift.h):
// pointers and strides as there; tokens may be null.
struct AcceptedShiftParams {
  const int32_t* inputs = nullptr;
  const int32_t* sampled = nullptr;
  int num_requests = 0, k = 0;
  int32_t* positions = nullptr;
  int64_t* slots = nullptr;
  int entries = 0, request_stride = 0, entry_stride = 0;
  int32_t* seq_lens = nullptr;
  int seq_lens_request_stride = 0, seq_lens_entry_stride = 0;
  const int32_t* block_tables = nullptr;
  int64_t width = 0;
  int block_size = 0;
  int32_t* tokens = nullptr;
};
cudaError_t launch_shift_by_accepted(const AcceptedShiftParams& p, cudaStream_t stream);

}  // namespace specula::cuda
