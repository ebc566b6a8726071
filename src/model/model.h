// The model interface the engine drives: one forward over a flattened varlen batch, reading and
// writing a paged KV cache, returning logits only for the rows that need them.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/backend.h"
#include "core/error.h"
#include "model/config.h"
#include "model/weight_source.h"

namespace specula {

// Shape of the KV cache a model wants, per layer: K and V of [num_blocks, block_size,
// num_kv_heads, head_dim] (v_head_dim for V). MLA models store one latent "head" (kv_lora_rank +
// qk_rope_head_dim) and no separate V (v_head_dim = 0).
struct KVCacheSpec {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t v_head_dim = 0;
  size_t bytes_per_token(DType dtype) const {
    return static_cast<size_t>(num_layers * num_kv_heads * (head_dim + v_head_dim)) * dtype_size(dtype);
  }
};

// One layer's scales for an fp8 KV cache (KVCacheLayer::k_scale / v_scale), as a checkpoint
// calibrated them.
struct KVCacheScales {
  float k = 1.0f;
  float v = 1.0f;
};

struct ForwardInput {
  Tensor token_ids;       // I32 [T] on the backend's device
  Tensor positions;       // I32 [T]
  AttentionMetadata attn;
  Tensor logits_indices;  // I32 [L]: rows of the batch whose next-token logits are wanted
  // false: a step whose features nobody reads (an EAGLE-3 head at adaptive depth 0) leaves
  // ForwardOutput::aux_hidden_states undefined and skips their copies.
  bool with_aux_hidden_states = true;
};

struct ForwardOutput {
  Tensor logits;          // F32 [L, vocab_size] on the backend's device
  Tensor hidden_states;   // [T, hidden] after the final norm (for MTP / EAGLE proposers); scratch
  // [T, n hidden]: the residual stream entering each layer set_aux_hidden_state_layers chose, side
  // by side in that order (EAGLE-3's low/mid/high features); scratch. Undefined when none.
  Tensor aux_hidden_states;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KVCacheSpec kv_cache_spec() const = 0;
  // Per layer, the scales the checkpoint holds for an fp8 KV cache (llm-compressor's and vLLM's
  // `self_attn.k_scale` / `v_scale`); empty when it holds none (the cache then uses 1.0).
  virtual std::vector<KVCacheScales> kv_cache_scales() const { return {}; }
  // Runs every layer over the batch, writing the new tokens' K/V into `kv` (one entry per layer)
  // first, then attending. Activations come from backend scratch memory.
  virtual ForwardOutput forward(const ForwardInput& input, std::vector<KVCacheLayer>& kv) = 0;
  // A weight the model holds, by its checkpoint name, lent to a proposer that would otherwise load
  // an identical copy (DeepSeek MTP: "model.embed_tokens.weight", "lm_head.weight" — the
  // embedding itself when tied). Undefined when the model lends nothing by that name. A
  // tensor-parallel rank lends its rows of a split weight; the tensor-parallel model lends them
  // put together.
  virtual Tensor shared_weight(const std::string& name) const { return Tensor(); }
  // From now on every forward also returns ForwardOutput::aux_hidden_states for these layers (an
  // EAGLE-3 head's features; layer i's entry is the input of decoder layer i, i.e. transformers'
  // output_hidden_states[i]). Throws specula::Error for a layer the model lacks or a model that
  // cannot return them.
  virtual void set_aux_hidden_state_layers(const std::vector<int>& layers) {
    throw Error(fmt::format("{}: this architecture cannot return auxiliary hidden states (EAGLE-3 features)",
                            architecture_name(config().arch)));
  }
  // A decode chain (argmax or sampled drafts) as one backend op (backend/decoder_chain.h): the caller fills the
  // chain's inputs (rows, steps, tokens, positions, slots, block tables, kv, block_size, out), the
  // model its weights and dims. False when the model or its backend has no fused form for it (the
  // caller then runs forward() step by step); nothing has run then.
  virtual bool decoder_chain(DecoderChain& chain) { return false; }
  // Records the device work `work` enqueues on `backend` (this model's forwards among it) as one
  // graph for replay (Backend::capture_graph, whose rules apply). A model spread over several
  // devices records each device's share and replays them together. nullptr where the backend has
  // no graphs.
  virtual std::unique_ptr<DeviceGraph> capture_graph(Backend& backend, const std::function<void()>& work) {
    return backend.capture_graph(work);
  }
  // Where the model's devices stand, for the log line of a step that does not finish (any thread
  // may call it while a forward runs): "" for one device; per rank of a split model.
  virtual std::string progress() const { return {}; }
};

// Load-time choices that are not facts of the checkpoint.
struct ModelOptions {
  // DeepSeek MoE layers: append this many replicas of the shared expert to the routed experts and
  // route every token to one of them (weight 1), so that one fused_moe call computes routed and
  // shared experts together. 0 = off. Lossless (equal logits up to rounding); models without
  // shared experts ignore it.
  int shared_expert_fusion = 0;
  // --quantization: "" (what the checkpoint's config says) or "fp8" (quantise bf16 weights at
  // load); see model/weight_quantization.h.
  std::string quantization{};
  // --tensor-parallel-size: ranks the model is split over (model/tensor_parallel_model.h), each
  // beyond rank 0 on the backend this gives it. 1: the whole model on the one backend.
  int tensor_parallel_size = 1;
  std::function<std::unique_ptr<Backend>(int rank)> make_rank_backend{};
  // Small all-reduces of CUDA ranks as one peer-to-peer kernel (make_communicators).
  bool custom_all_reduce = true;
};

// Builds the model for config.arch, loading every weight through `weights` onto `backend`.
// Throws specula::Error for an unsupported architecture or a missing/mis-shaped tensor.
std::unique_ptr<Model> create_model(const ModelConfig& config, WeightSource& weights, Backend& backend);
std::unique_ptr<Model> create_model(const ModelConfig& config, WeightSource& weights, Backend& backend,
                                    const ModelOptions& options);

}  // namespace specula
