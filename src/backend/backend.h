// The op set that models are written against. One implementation per device: backend/cpu (fp32,
// OpenBLAS + OpenMP) and backend/cuda (bf16 storage, fp32 accumulation). Every CUDA kernel has
// its CPU twin here and a test that compares the two on random inputs.
//
// Conventions: all tensors passed to an op live on the backend's device; `out` tensors are
// allocated by the caller with the right shape and dtype; ops run in stream order (asynchronously
// on CUDA) and never synchronise unless the name says so.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "backend/accepted_shift.h"
#include "backend/attention_metadata.h"
#include "backend/decoder_chain.h"
#include "backend/decoder_forward.h"
#include "core/error.h"
#include "core/tensor.h"

namespace specula {

class TokenSampler;  // backend/token_sampler.h

// Device memory as the memory plan sees it (bytes). Memory held by the backend's caching allocator
// but free (`cached`) is available to later allocations: the allocator hands it back on demand.
struct DeviceMemoryInfo {
  size_t total = 0;      // the device's memory
  size_t free = 0;       // free according to the driver
  size_t allocated = 0;  // held by live tensors
  size_t cached = 0;     // freed tensors' blocks kept by the allocator for reuse
};

// Recorded device work (a CUDA graph): replay() enqueues the same kernels on the same buffers.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void replay() = 0;
};

// A point in a backend's queue of work (a CUDA event): wait() returns once everything issued before
// it has run, without waiting for what was issued after (as synchronize() would).
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual void wait() = 0;
};

// How Backend::moe_route turns one row of router logits l[0..E) into expert ids and weights. It
// covers DeepSeek-V2 (transformers' DeepseekV2Moe.route_tokens_to_experts) and DeepSeek-V3
// (DeepseekV3MoE.route_tokens_to_experts), in this order, all in fp32:
//   1. scores s = softmax(l) (kSoftmax) or sigmoid(l) element-wise (kSigmoid);
//      choice c = s + bias when a bias is given, else c = s.
//   2. group-limited selection when num_groups > 1: the E experts form num_groups consecutive
//      groups of E / num_groups; a group's score is the max of its c (kMax, V2 group_limited_greedy)
//      or the sum of its two largest c (kTopTwoSum, V3; the one c of a one-expert group); the
//      topk_groups best groups are kept (ties: lower group first) and the experts of the other
//      groups cannot be selected.
//   3. the top_k selectable experts by c are the routed ids; their weights are their s (the
//      unbiased scores).
//   4. renormalize: weights /= (sum of the row's top_k weights + 1e-20).
//   5. weights *= routed_scaling_factor.
//   6. shared-expert fusion (shared_slots > 0): the row also goes, with weight exactly 1 (not
//      scaled), to shared_slots more experts: ids shared_first + r * shared_slots + j for
//      j = 0..shared_slots-1, with replica r = t mod shared_replicas (t = the row index), which
//      balances the rows over the replicas. These fill columns top_k .. top_k + shared_slots - 1.
// Requires E % num_groups == 0, 1 <= topk_groups <= num_groups, and top_k <= the number of
// selectable experts (topk_groups * E / num_groups).
struct MoeRouting {
  enum class Scoring { kSoftmax, kSigmoid };
  enum class GroupScore { kMax, kTopTwoSum };
  Scoring scoring = Scoring::kSoftmax;
  int top_k = 1;
  int num_groups = 1;
  int topk_groups = 1;
  GroupScore group_score = GroupScore::kMax;
  bool renormalize = false;
  float routed_scaling_factor = 1.0f;
  int shared_slots = 0;     // experts each row adds for the fused shared expert (0: no fusion)
  int shared_replicas = 1;  // replicas of those shared_slots experts
  int shared_first = 0;     // id of replica 0's first shared expert (the number of routed experts)
  int columns() const { return top_k + shared_slots; }
};

// A linear layer's weight [N, K] (HF's [out_features, in_features]): in the compute dtype, or FP8
// (e4m3) with one F32 scale per output row, W = weight * scale[:, None] (per-tensor scales of a
// checkpoint are spread over the rows at load).
struct LinearWeight {
  Tensor weight;
  Tensor scale;  // F32 [N] when weight is F8_E4M3; undefined otherwise
  bool fp8() const { return weight.defined() && weight.dtype() == DType::kF8E4M3; }
};

// The decoder's element-wise neighbours of a linear layer (Backend::fused_linear): before it, an
// optional RMSNorm of its input; after it, where its product y goes.
struct LinearPrologue {
  const Tensor* norm_weight = nullptr;  // null: the input as it is; else rms_norm(x, *norm_weight, eps)
  float eps = 0.0f;

  static LinearPrologue none() { return {}; }
  static LinearPrologue rms_norm(const Tensor& weight, float eps) { return {&weight, eps}; }
};
enum class LinearEpilogue {
  kStore,       // out = y
  kAccumulate,  // out += y, y rounded to out's dtype first (the residual stream: linear + add)
  kSiluMul,     // out = silu_mul(y): y [M, 2I] (gate rows, then up rows of the weight), out [M, I]
};

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
  // Stack discipline within a step: scratch_release(scratch_mark()) hands back everything
  // allocated after the mark, for the next requests to reuse (those tensors must not be used
  // again). A model releases each block's temporaries, so that a step's scratch peak is one
  // block's rather than the sum over its layers. Same requests, marks and releases in the same
  // order still give the same addresses. The defaults reuse nothing.
  virtual size_t scratch_mark() { return 0; }
  virtual void scratch_release(size_t mark) {}
  // Copies between any two devices (host<->device included); same dtype and element count.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // copy() of each pair, in order, possibly as one operation: a proposer stages ~9 small inputs a
  // step, and on CUDA each copy of its own costs the stream ~1 us plus a gap before the next.
  // The default copies them one by one.
  struct CopyPair {
    Tensor src;
    Tensor dst;
  };
  virtual void copy_many(std::span<const CopyPair> pairs);
  // Converts src into dst's dtype (F32/F16/BF16), same device and element count.
  virtual void cast(const Tensor& src, Tensor& dst) = 0;
  // Fills with zero bytes.
  virtual void zero(Tensor& t) = 0;
  // Waits until every op issued so far has finished.
  virtual void synchronize() = 0;

  // ---- the forward pass ----
  // out[t, :] = table[ids[t], :].  ids I32 [T], table [V, H], out [T, H].
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor& out) = 0;
  // A tensor-parallel rank's share of the embedding (rows first_id .. first_id + V' - 1 of the whole
  // table): out[t, :] = table[ids[t] - first_id, :] for ids in that range, zeros for the others,
  // which the other ranks' shares fill when the ranks' outputs are summed. table [V', H]. The
  // default throws: only backends that run tensor-parallel ranks have it.
  virtual void vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out) {
    throw Error(fmt::format("{}: no vocab-parallel embedding", name()));
  }
  // out = x / sqrt(mean(x^2) + eps) * weight, row by row over the last dim (computed in fp32).
  // x and out are [rows, H] (any leading shape), weight [H].
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // Fused residual add + norm, in place: residual += x; x = rms_norm(residual) * weight.
  virtual void add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, float eps) = 0;
  // out[M, N] = x[M, K] @ weight[N, K]^T (+ bias[N]); weight in HF's [out_features, in_features].
  // x and weight share the dtype, but for F32 weights (a MoE router, kept in full precision) over
  // compute-dtype rows into an F32 out: the rows are widened exactly and the math is fp32.
  virtual void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) = 0;
  // The same over a LinearWeight: FP8 weights go to linear_fp8.
  void linear(const Tensor& x, const LinearWeight& weight, const Tensor* bias, Tensor& out);
  // The row count that stands for `rows` in the choice of a matmul's library kernels: calls of M
  // rows with the same class run the same kernels (CUDA: cuBLASLt's plans per M bucket). A step
  // whose classes have all run loads no library kernel (tensor_parallel_rehearsals.h).
  virtual int64_t matmul_rows_class(int64_t rows) const { return rows; }
  // A decoder's linear layer with its neighbours folded in: y = prologue(x) @ weight^T (+ bias),
  // then the epilogue (LinearEpilogue) into out. Exactly the separate ops rms_norm, linear and
  // add / silu_mul, each rounding to the compute dtype, which the default runs; CUDA fuses them
  // into one kernel at decode batch sizes. x [M, K], out [M, N] ([M, N / 2] for kSiluMul).
  virtual void fused_linear(const Tensor& x, const LinearPrologue& prologue, const LinearWeight& weight,
                            const Tensor* bias, Tensor& out, LinearEpilogue epilogue);
  // out[m, n] = scale[n] * (x[m, :] . weight[n, :]) (+ bias[n]) with weight F8_E4M3 [N, K] and
  // scale F32 [N]; x, bias and out as for linear(). The default throws (no FP8 support).
  virtual void linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor* bias, Tensor& out);
  // Quantises each row of x [R, K] (compute dtype) to e4m3: scale[r] = max|x[r, :]| / 448 (1 for
  // an all-zero row) and out[r, :] = round_to_nearest_even(x[r, :] / scale[r]). out F8_E4M3 [R, K],
  // scale F32 [R]. The default throws.
  virtual void quantize_fp8_rows(const Tensor& x, Tensor& out, Tensor& scale);
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
  // MLA form (cache.v undefined or with no elements, i.e. KVCacheSpec::v_head_dim == 0): only k is
  // written and v is ignored (it may be undefined).
  virtual void write_kv_cache(const Tensor& k, const Tensor& v, KVCacheLayer& cache,
                              const Tensor& slot_mapping) = 0;
  // Causal attention of q [T, Hq, D] over the paged cache (see AttentionMetadata), GQA with
  // Hq / Hk query heads per kv head, softmax(q k^T * scale) v -> out [T, Hq, Dv]. Padding rows of q
  // (past the last sequence) are left untouched.
  // MLA form (cache.v undefined or with no elements): there is no separate V; the value of a key
  // is the FIRST Dv dims of its K entry, Dv = out.size(-1) <= D. DeepSeek's MLA caches one "head"
  // per token, [compressed latent (kv_lora_rank) | roped key (qk_rope_head_dim)], and attends with
  // Hk = 1 (multi-query) and Dv = kv_lora_rank.
  virtual void paged_attention(const Tensor& q, const KVCacheLayer& cache, const AttentionMetadata& md,
                               float scale, Tensor& out) = 0;
  // out[i, :] = x[indices[i], :]; indices I32 [L].
  virtual void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) = 0;
  // out[i] = the first index of the largest value of row rows[i] of x (rows == nullptr: row i):
  // x F32 [R, V], rows I32 [n], out I32 [n]. Greedy drafting chains draft steps with it on the
  // device (draft_model_proposer.h). Ties go to the lower index and a row of -inf gives 0, as the
  // host sampler's argmax does (rows holding NaN: unspecified). The default runs on the host over
  // CPU tensors.
  virtual void argmax_rows(const Tensor& x, const Tensor* rows, Tensor& out);
  // out[r, n] = x[r, columns[n]], or `fill` where columns[n] < 0: x F32 [R, C], columns I32 [N],
  // out F32 [R, N]. An EAGLE-3 head's logits over its reduced draft vocabulary become logits over
  // the target's (fill -inf: tokens it cannot draft). The default runs on the host over CPU tensors.
  virtual void gather_columns(const Tensor& x, const Tensor& columns, float fill, Tensor& out);
  // token_ids[i] = source[-(token_ids[i] + 1)] where token_ids[i] < 0: token_ids and source I32.
  // Async scheduling's draft feed: a step's inputs name the drafts the previous step left on the
  // device by their index there, so that the host stages the step before they are copied back
  // (engine/README.md). The default runs on the host over CPU tensors.
  virtual void feed_tokens(Tensor& token_ids, const Tensor& source);
  // Speculative decoding's launch-ahead: moves rows staged as if no draft had been accepted by
  // the drafts each request accepted (backend/accepted_shift.h), in stream order, so that the
  // proposer's next forwards run behind the verification without a host round trip. The default
  // runs on the host over CPU tensors.
  virtual void shift_by_accepted(const AcceptedShift& shift);

  // ---- MLA and MoE (DeepSeek-V2/V3). Default implementations throw specula::Error naming the op
  // and the backend, so that a backend without them fails loudly, not silently. ----

  // A strided column copy between two row-major matrices with the same number of rows R (any
  // leading shape; the last dim is the row width): dst[r, dst_col + i] = src[r, src_col + i] for
  // i < width. Columns of dst outside [dst_col, dst_col + width) are untouched. src and dst must
  // not overlap. Same dtype. (On CUDA this is one cudaMemcpy2DAsync.)
  virtual void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width);
  // A separate linear map per head: out[t, h, :N] = weight[h] @ x[t, h, :K], i.e.
  // out[t, h, n] = sum_{k < K} x[t, h, k] * weight[h, n, k]. weight [Hh, N, K], x [T, Hh, Kx] with
  // Kx >= K, out [T, Hh, No] with No >= N: each head reads the first K columns of its Kx and writes
  // the first N of its No, the rest untouched, so that MLA reads its query's no-rope part and
  // writes the absorbed query in place. All in the compute dtype (accumulation in fp32). A batched
  // GEMM with batch = head: x's head h is a [T, K] matrix with leading dimension Hh * Kx, out's a
  // [T, N] one with leading dimension Hh * No. MLA uses it to absorb kv_b_proj into the query
  // (q_nope -> latent) and to expand the attended latent into values.
  virtual void head_linear(const Tensor& x, const Tensor& weight, Tensor& out);
  // head_linear's sizes, checked as every backend checks them (an Error names what does not fit).
  struct HeadLinearShape {
    int64_t tokens, heads, kx, k, n, no;
  };
  static HeadLinearShape head_linear_shape(const Tensor& x, const Tensor& weight, const Tensor& out);
  // MoE routing: router logits F32 [T, E] -> topk_ids I32 [T, C] and topk_weights F32 [T, C],
  // C = params.top_k + params.shared_slots. `bias` (F32 [E], may be null) is DeepSeek-V3's
  // e_score_correction_bias. See MoeRouting below for the exact computation. Row t's routed
  // columns are ordered by decreasing selection score (ties: lower expert id first).
  virtual void moe_route(const Tensor& router_logits, const Tensor* bias, const MoeRouting& params,
                         Tensor& topk_ids, Tensor& topk_weights);
  // Mixture of SwiGLU experts: out[t] = sum_c topk_weights[t, c] * expert_e(x[t]), e = topk_ids[t, c],
  // expert_e(v) = w2[e] @ (silu(w13[e][:I] @ v) * (w13[e][I:] @ v)). x [T, H] and out [T, H] in the
  // compute dtype; w13 [E, 2I, H] (each expert's gate_proj rows, then its up_proj rows: HF's
  // [out, in] layout), w2 [E, H, I] (down_proj); topk_ids I32 [T, C] with every id in [0, E);
  // topk_weights F32 [T, C]. Products in the compute dtype, the weighted sum in fp32. The intended
  // shape of the computation (and of the CUDA grouped GEMM): permute the (token, slot) pairs by
  // expert, one GEMM per expert over its tokens, then the weighted un-permute. out may not alias x.
  virtual void fused_moe(const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_ids,
                         const Tensor& topk_weights, Tensor& out);

  // ---- MLA attention prologue (DeepSeek) ----
  // From the query projection q [T, Hq (dn + dr)] (each head's no-rope part, then its rope part)
  // and the compressed-KV projection kv_a [T, C + dr] (the latent, then the rope key all heads
  // share) to what attention reads: the cache entry [rms_norm(latent) * kv_norm | rope(k_pe)] at
  // slot_mapping[t] (I64; -1 skips the row) and rope(q_pe) into columns [C, C + dr) of each head
  // of q_mla [T, Hq, C + dr] (its first C columns are the absorbed query, which head_linear
  // writes). Exactly copy_columns + rms_norm + rope + copy_columns + write_kv_cache as separate
  // ops, each rounding to the compute dtype, which the default runs; CUDA runs it as one kernel.
  struct MlaPrologue {
    int64_t num_heads = 0;  // Hq
    int64_t nope_dim = 0;   // dn
    int64_t rope_dim = 0;   // dr (the rotary dim: all of it rotates)
    const Tensor* kv_norm = nullptr;  // [C]
    float eps = 1e-6f;
    const Tensor* positions = nullptr;  // I32 [T]
    const Tensor* cos_sin = nullptr;    // F32 [max_positions, dr] (see rope)
    bool neox = false;
  };
  virtual void mla_prologue(const Tensor& q, const Tensor& kv_a, const MlaPrologue& params, KVCacheLayer& cache,
                            const Tensor& slot_mapping, Tensor& q_mla);
  // mla_prologue's sizes (T and the latent's C), checked as every backend checks them.
  struct MlaPrologueShape {
    int64_t tokens, latent;
  };
  static MlaPrologueShape mla_prologue_shape(const Tensor& q, const Tensor& kv_a, const MlaPrologue& params,
                                             const Tensor& q_mla);

  // ---- fused attention prologue (Llama family) ----
  // From the fused projection qkv [T, (Hq + 2 Hk) D] (each token's q heads, then k heads, then v
  // heads) to attention's inputs in one op: q_out [T, Hq, D] gets the q heads, optionally RMS-
  // normalised per head (q_norm [D], Qwen3) and then roped; the k heads (k_norm, rope likewise)
  // and the v heads go straight into the paged cache at slot_mapping[t] (I64; -1 skips the row).
  // Exactly what gather_rows (split) + rms_norm (q_norm, k_norm) + rope + write_kv_cache compute,
  // including the rounding to the compute dtype after the norm; the default implementation is
  // that sequence of ops.
  struct QkvPrologue {
    int64_t num_q_heads = 0;
    int64_t num_kv_heads = 0;
    const Tensor* q_norm = nullptr;  // [D] or null
    const Tensor* k_norm = nullptr;  // [D] or null
    float eps = 1e-6f;
    const Tensor* positions = nullptr;  // I32 [T]
    const Tensor* cos_sin = nullptr;    // F32 [max_positions, rotary_dim] (see rope)
    int rotary_dim = 0;
    bool neox = true;
  };
  virtual void qkv_prologue(const Tensor& qkv, const QkvPrologue& params, KVCacheLayer& cache,
                            const Tensor& slot_mapping, Tensor& q_out);
  // The attention's input projection and its prologue as one op: qkv = fused_linear(x, input_norm,
  // weight, bias) then qkv_prologue(qkv, ...), which the default runs; CUDA fuses the two for one
  // decode row, so that the qkv rows never reach memory and the prologue is not a launch of its own.
  virtual void qkv_projection(const Tensor& x, const LinearPrologue& input_norm, const LinearWeight& weight,
                              const Tensor* bias, const QkvPrologue& params, KVCacheLayer& cache,
                              const Tensor& slot_mapping, Tensor& q_out);

  // ---- EAGLE-3 head's layer input ----
  // The input of an EAGLE-3 head's decoder layer from the tokens and the hidden stream g [T, H]
  // (the fc of the target's features, or the head's own previous output): e = embedding(token_ids,
  // embed_tokens); x [T, 2H] = [rms_norm(e, input_norm) | rms_norm(g, hidden_norm)], side by side;
  // residual [T, H] = g, or rms_norm(g, hidden_norm) when norm_before_residual. The default runs
  // those ops one by one; CUDA runs them as one kernel with the same bits.
  struct Eagle3LayerInput {
    const Tensor* embed_tokens = nullptr;  // [V, H]
    const Tensor* input_norm = nullptr;    // [H]
    const Tensor* hidden_norm = nullptr;   // [H]
    float eps = 1e-6f;
    bool norm_before_residual = false;
  };
  virtual void eagle3_layer_input(const Tensor& token_ids, const Tensor& g, const Eagle3LayerInput& params, Tensor& x,
                                  Tensor& residual);

  // ---- fused decode chain (Llama family) ----
  // Runs `chain` (backend/decoder_chain.h) as one op and returns true, or returns false without
  // touching anything when this backend has no fused form for its shapes or dtypes; the caller
  // then runs the chain layer by layer. The default returns false.
  virtual bool decoder_chain(const DecoderChain& chain) { return false; }
  // Runs `forward` (backend/decoder_forward.h) as one op, writing its logits, hidden states and
  // K/V, and returns true; or returns false without touching anything when this backend has no
  // fused form for its shapes or dtypes (the caller then runs the layers one by one). The
  // default returns false.
  virtual bool decoder_forward(DecoderForward& forward) { return false; }

  // ---- device-level services for the engine (defaults: not available) ----
  // Host memory for staging copies to and from the device: pinned on CUDA, so that copy() of it
  // is asynchronous (see the CUDA backend's copy rules) and can run beside graph replays; plain
  // host memory elsewhere.
  virtual Tensor empty_host(Shape shape, DType dtype) { return Tensor::empty(std::move(shape), dtype, Device::kCPU); }
  // Memory of the backend's device; nullopt on the CPU (host memory is not planned).
  virtual std::optional<DeviceMemoryInfo> memory_info() { return std::nullopt; }
  // Records the device work `work` enqueues into a graph without running it, for replay with
  // the same buffers (CUDA graphs). nullptr where the backend has no graphs. Throws
  // specula::Error when the work cannot be recorded (it allocated, synchronised or read the
  // device from the host).
  virtual std::unique_ptr<DeviceGraph> capture_graph(const std::function<void()>& work) { return nullptr; }
  // The engine has started (the profile run, the graphs' warm-up runs and captures are done):
  // from now on no step may stall on one-off tuning. CUDA: a GEMM shape first met later keeps
  // cuBLASLt's heuristic algorithm instead of timing candidates (cuda_gemm.h), which speculation's
  // catch-ups of ever new lengths met mid-run (~11 ms a shape). The default does nothing.
  virtual void start_serving() {}
  // A sampler that turns logits rows into tokens on the device (backend/token_sampler.h), sized
  // for up to max_rows rows of vocab logits; nullptr where the backend has none (the engine then
  // samples on the host).
  virtual std::unique_ptr<TokenSampler> make_token_sampler(int max_rows, int64_t vocab);

  // ---- several backends in one process (tensor parallelism) ----
  // Makes this backend's device the calling thread's current one (CUDA: cudaSetDevice), which a
  // thread must do before it drives a backend of another device. The default does nothing.
  virtual void bind_thread() {}
  // This backend's later work waits for all the work issued so far on `other`, without blocking
  // the host (CUDA: an event recorded on other's stream that this stream waits for). The default
  // waits on the host.
  virtual void wait_for(Backend& other) { other.synchronize(); }
  // Marks the work issued so far (DeviceEvent). The default's wait() synchronises the backend.
  virtual std::unique_ptr<DeviceEvent> record_event();
  // copy() of device memory into pinned host memory, behind the work issued so far, without
  // holding back the work issued after it; the event marks the copy, and src must not be written
  // again before it has passed. The default: copy() then record_event().
  virtual std::unique_ptr<DeviceEvent> copy_to_host_async(const Tensor& src, Tensor& dst);
  // Whether everything issued so far has run, without waiting (CUDA: cudaStreamQuery); any thread
  // may ask. A host backend runs its work as it is issued.
  virtual bool idle() { return true; }
};

// fp32 CPU backend; threads = 0 means all cores.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

// True when specula was built with CUDA and a GPU is visible.
bool cuda_available();
// Throws specula::Error when CUDA is unavailable.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0);
// GPUs visible to CUDA (0 without CUDA).
int cuda_device_count();

}  // namespace specula
