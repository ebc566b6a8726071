// Launchers of the DeepSeek kernels (MoE routing, fused MoE, MLA attention over the latent
// cache), called by CudaBackend after it has checked its arguments. Same rules as
// cuda_kernels.h: raw device pointers, everything enqueued on `stream`, no allocation, no
// synchronisation and no host read of device memory, so every launcher can be captured into a
// CUDA graph. Device-resident expert ids are not validated on the host (that needs a sync): an id
// outside [0, E) contributes nothing instead of reading out of bounds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace specula::cuda {

// ---- moe_route (see MoeRouting in backend.h for the computation) ----
constexpr int kMaxRouteExperts = 256;  // one warp holds a row's scores: 8 experts per lane
struct MoeRouteParams {
  const float* logits = nullptr;  // [tokens, experts]
  const float* bias = nullptr;    // [experts] or null
  int32_t* ids = nullptr;         // [tokens, columns]
  float* weights = nullptr;       // [tokens, columns]
  int64_t tokens = 0;
  int experts = 0;
  bool sigmoid = false;          // scoring: sigmoid, else softmax
  bool top_two_sum = false;      // group score: sum of the two largest, else the max
  int top_k = 1, num_groups = 1, topk_groups = 1;
  bool renormalize = false;
  float scaling = 1.0f;
  int shared_slots = 0, shared_replicas = 1, shared_first = 0;
};
cudaError_t launch_moe_route(const MoeRouteParams& p, cudaStream_t stream);

// ---- fused_moe (bf16) ----
// Shapes: x [tokens, hidden], w13 [experts, 2 inter, hidden], w2 [experts, hidden, inter],
// ids / weights [tokens, columns]. Every path rounds where a chain of unfused ops would: gate and
// up to bf16, silu(gate) * up to bf16, each expert's output row to bf16; then out[t] = the fp32
// sum over the columns, in column order, of weight * expert output, rounded once to bf16.
struct FusedMoeParams {
  const void* x = nullptr;
  const void* w13 = nullptr;
  const void* w2 = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  void* out = nullptr;
  int64_t tokens = 0;
  int columns = 0, hidden = 0, inter = 0, experts = 0;
};

// Decode path: one pass over (token, column) pairs for gate|up (act [tokens * columns, inter]
// bf16 scratch), then one pass per token for down + the weighted sum. vec16: hidden and inter
// are multiples of 8 and every pointer is 16-byte aligned (16-byte weight loads).
cudaError_t launch_fused_moe_gemv(const FusedMoeParams& p, void* act, bool vec16, cudaStream_t stream);

// Grouped path for large batches. The (token, column) pairs are sorted by expert on the device,
// then each expert's rows run as tensor-core GEMMs. Needs hidden % 8 == 0, inter % 8 == 0, 16-byte
// aligned pointers and experts <= kMaxGroupedExperts. Scratch (all device memory, sized by the
// caller for `pairs` = tokens * columns pairs):
struct GroupedMoeScratch {
  int32_t* offsets = nullptr;       // [experts + 1] first sorted row of each expert
  int32_t* tile_starts = nullptr;   // [experts + 1] first GEMM row tile of each expert
  int32_t* sorted_token = nullptr;  // [pairs] token of each sorted row
  int32_t* pair_row = nullptr;      // [pairs] sorted row of each pair (-1: id out of range)
  void* gate_up = nullptr;          // [pairs, 2 inter] bf16
  void* act = nullptr;              // [pairs, inter] bf16
  void* expert_out = nullptr;       // [pairs, hidden] bf16
};
constexpr int kMaxGroupedExperts = 4096;  // the sort keeps two counters per expert in shared memory
cudaError_t launch_fused_moe_grouped(const FusedMoeParams& p, const GroupedMoeScratch& s, cudaStream_t stream);

// ---- a MoE router's logits at decode batch sizes (linear with bf16 rows and fp32 weights):
// out F32 [m, n] = x BF16 [m, k] . w F32 [n, k]^T, fp32 math; k a multiple of 4, x 8-byte and w
// 16-byte aligned. ----
constexpr int kRouterGemvMaxRows = 8;
bool router_gemv_supports(const void* x, const void* w, int64_t m, int64_t n, int64_t k);
cudaError_t launch_router_gemv(const void* x, const float* w, float* out, int64_t m, int64_t n, int64_t k,
                               cudaStream_t stream);

// ---- head_linear at decode batch sizes (bf16): out[t, h, n] (row stride heads * no) = the sum
// over k < K of x[t, h, k] (row stride heads * kx) * w[h, n, k]. n a multiple of 4, k and kx of
// 8, x and w 16-byte aligned; SPECULA_HEAD_GEMV=0 leaves every call to cuBLAS (A/B runs). ----
constexpr int kHeadGemvMaxRows = 4;
struct HeadGemvParams {
  const void* x = nullptr;
  const void* w = nullptr;
  void* out = nullptr;
  int tokens = 0, heads = 0, n = 0, k = 0, kx = 0, no = 0;
};
bool head_gemv_enabled();
bool head_gemv_supports(const HeadGemvParams& p);
cudaError_t launch_head_gemv(const HeadGemvParams& p, cudaStream_t stream);

// ---- mla_prologue (Backend::mla_prologue): the latent's norm, both ropes and the cache write of
// a token in one block. latent a multiple of the 16-byte vector's elements and at most 1024 of
// them; rows and pointers 16-byte aligned; the compute type (bf16 or f32) everywhere. ----
struct MlaPrologueParams {
  const void* q = nullptr;         // [tokens, heads (nope_dim + rope_dim)]
  const void* kv_a = nullptr;      // [tokens, latent + rope_dim]
  const void* kv_norm = nullptr;   // [latent]
  const int32_t* positions = nullptr;
  const float* cos_sin = nullptr;  // [max_pos, rope_dim]
  const int64_t* slots = nullptr;  // [tokens]; -1 (or past num_slots): the entry is not written
  void* q_mla = nullptr;           // [tokens, heads, latent + rope_dim]: columns [latent, +rope_dim)
  void* cache = nullptr;           // [num_slots, latent + rope_dim]
  int64_t tokens = 0, max_pos = 0, num_slots = 0;
  int heads = 0, nope_dim = 0, rope_dim = 0, latent = 0;
  bool neox = false;
  float eps = 1e-6f;
};
// Whether launch_mla_prologue takes these shapes (else the separate ops run).
bool mla_prologue_supported(const MlaPrologueParams& p, DType dtype);
cudaError_t launch_mla_prologue(const MlaPrologueParams& p, DType dtype, cudaStream_t stream);

// ---- MLA attention: paged attention over a cache with no separate V (the value of a key is the
// first v_head_dim dims of its K entry; v_cache is ignored). Tensor cores; any head_dim that is a
// multiple of 8 up to kMlaMaxHeadDim and v_head_dim (multiple of 8) up to kMlaMaxVHeadDim; any
// query lengths (decode, verification, prefill, chunked and mixed batches) and GQA ratio.
constexpr int kMlaMaxHeadDim = 576;   // DeepSeek: kv_lora_rank 512 + qk_rope_head_dim 64
constexpr int kMlaMaxVHeadDim = 512;  // DeepSeek: kv_lora_rank
// How many key splits to run (1 = no partial buffers); splits only batches of short query rows.
int mla_num_splits(const PagedAttentionParams& p, int sm_count);
// partial_out F32 [num_query_rows, Hq, num_splits, Dv] and partial_stats F32 [num_query_rows, Hq,
// num_splits, 2] when num_splits > 1 (null otherwise).
cudaError_t launch_mla_attention(const PagedAttentionParams& p, int num_splits, float* partial_out,
                                 float* partial_stats, cudaStream_t stream);

}  // namespace specula::cuda
