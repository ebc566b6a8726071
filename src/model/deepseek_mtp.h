// DeepSeek-V3's multi-token prediction (MTP) module (arXiv 2412.19437, section 2.2), as the
// speculative proposer `mtp` runs it. The checkpoint stores num_nextn_predict_layers of them after
// the main layers, at model.layers.{num_hidden_layers + i}. For a row at position i:
//
//   h   = the target's final hidden state at i, AFTER model.norm         [T, H]
//         (or, chaining draft steps, the module's own previous output y)
//   e   = embed_tokens(t_{i+1}), zeroed where the position is 0          [T, H]
//   x   = eh_proj(concat(enorm(e), hnorm(h)))                            [T, H]   eh_proj: [H, 2H]
//   y   = one DeepSeek decoder block over x (deepseek_layer.h), the residual included; its MLA
//         attends over the MTP layer's OWN latent KV cache at the same positions
//   logits = shared_head.head(shared_head.norm(y))                      predicts t_{i+2}
//
// embed_tokens and shared_head.head are stored per layer, but DeepSeek-V3 checkpoints store copies
// of the main model's: where a copy equals the target's tensor (compared once at load), or the
// layer has none, the target's own is used, so no memory goes to duplicates.
#pragma once

#include <cstdint>
#include <vector>

#include "model/deepseek_layer.h"
#include "model/model.h"

namespace specula {

struct MtpForwardInput {
  // token_ids: for the row at position i, the NEXT token t_{i+1}. positions: i. attn: the MTP
  // layer's own cache (same block tables as the target's). logits_indices: rows whose logits are
  // wanted (may be empty: a catch-up that drafts nothing skips the head).
  ForwardInput rows;
  Tensor hidden;  // [T, H] in the compute dtype
  // Rows whose position is 0 (host indices): their next-token embedding is zeroed, as DeepSeek's
  // MTP and the training of specula-tiny-moe do. Known to whoever builds the batch; draft steps
  // never have such rows, so a captured step carries none.
  std::vector<int32_t> zero_embedding_rows;
};

struct MtpForwardOutput {
  Tensor y;       // [T, H] the block's output before shared_head.norm (backend scratch)
  Tensor logits;  // F32 [L, V] (backend scratch); undefined when L = 0
};

class DeepseekMtp {
 public:
  // Loads every MTP layer through `weights`. `target` lends its embedding and lm head
  // (Model::shared_weight) where a layer's copy equals it or is missing. With `assume_copies_equal`
  // (dummy weights, which stand in for a real checkpoint whose copies are identical) the target's
  // are used without loading or comparing the copies. Throws specula::Error naming the tensor when
  // one is missing or mis-shaped, or when the config has no MTP layer.
  DeepseekMtp(const ModelConfig& config, WeightSource& weights, Backend& backend, const ModelOptions& options,
              const Model* target, bool assume_copies_equal);

  const ModelConfig& config() const { return config_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // One latent entry (kv_lora_rank + qk_rope_head_dim) per token per MTP layer, no separate V.
  KVCacheSpec kv_cache_spec() const;
  // How many layers use the target's embedding / head rather than a copy of their own.
  int num_shared_embeddings() const { return shared_embeddings_; }
  int num_shared_heads() const { return shared_heads_; }

  // MTP layer `layer` over a flattened varlen batch; writes the rows' latent entries into `cache`
  // (slot -1 skips a row) before attending. Activations come from backend scratch memory; it does
  // not reset the scratch arena (the caller decides, having copied what it still needs).
  MtpForwardOutput forward(int layer, const MtpForwardInput& in, KVCacheLayer& cache);

 private:
  struct Layer {
    Tensor embed_tokens;      // [V, H] (the target's when shared)
    Tensor enorm, hnorm;      // [H]
    Tensor eh_proj;           // [H, 2H]
    DeepseekLayerWeights block;
    Tensor shared_head_norm;  // [H]
    Tensor head;              // [V, H] (the target's when shared)
  };
  // The layer's copy of a tensor the target may lend: the target's when they are equal.
  Tensor load_or_share(WeightSource& weights, const std::string& name, const Tensor& lent, bool assume_equal,
                       int* shared_count);
  void check_input(int layer, const MtpForwardInput& in, const KVCacheLayer& cache) const;

  ModelConfig config_;  // before decoder_, which keeps a reference to it
  Backend& backend_;
  DeepseekDecoder decoder_;
  int64_t hidden_, vocab_;
  float eps_;
  std::vector<Layer> layers_;
  int shared_embeddings_ = 0, shared_heads_ = 0;
};

}  // namespace specula
