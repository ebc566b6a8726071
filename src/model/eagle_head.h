// EAGLE draft heads (arXiv 2401.15077, EAGLE-3: arXiv 2503.01840): one Llama decoder layer that
// drafts from the target's own hidden states, in the checkpoint formats vLLM and SGLang load.
// For a row at position p, reading the next token t_{p+1} and predicting t_{p+2}:
//
// EAGLE-3 (LlamaForCausalLMEagle3, Eagle3LlamaForCausalLM; SpecForge's and the EAGLE authors' heads):
//   g   = fc(concat(a_1(p), ..., a_n(p)))   a_i: the target's residual stream entering aux layer i
//         (Model::set_aux_hidden_state_layers); chained draft steps read g = the previous step's
//         `prenorm` instead                                                      fc: [H, n H_t]
//   x   = concat(input_layernorm(embed(t_{p+1})), hidden_norm(g))                [T, 2 H]
//   r   = g + o_proj(Attention(x))      (with norm_before_residual: hidden_norm(g) + ...)
//   prenorm = r + MLP(post_attention_layernorm(r))                               -> the next step's g
//   logits  = lm_head(norm(prenorm))    over the draft vocabulary (draft_vocab_size), placed at the
//             target ids d2t gives (target = draft + d2t[draft]); other target ids get -inf
// EAGLE-1 (a LlamaForCausalLM of one layer):
//   x = fc(concat(embed(t_{p+1}), h_p)) with h_p the target's final hidden state (after its norm),
//   the layer without input_layernorm, prenorm = its output, logits = the target's lm_head(prenorm).
//
// The attention is over the head's own paged cache (one layer) on the target's block tables, at
// the target's positions. Weight names: the layer is "midlayer.", "layers.0." or
// "model.layers.0."; fc, norm and embed_tokens with or without "model."; the embedding is the
// target's where the head stores none.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/llama_layer.h"
#include "model/model.h"

namespace specula {

enum class EagleVersion { kEagle1, kEagle3 };

struct EagleHeadConfig {
  EagleVersion version = EagleVersion::kEagle3;
  ModelConfig layer;                 // the head's config.json read as a Llama config (dims, rope, eps)
  int64_t draft_vocab_size = 0;      // EAGLE-3's reduced vocabulary (= vocab_size when not reduced)
  int64_t target_hidden_size = 0;    // the width of each target feature
  std::vector<int> aux_layers;       // EAGLE-3: the target layers whose inputs are the features
  bool norm_before_residual = false; // EAGLE-3: the residual starts from hidden_norm(g)
  int64_t feature_size() const {     // the width of a target-fed row's hidden input
    return version == EagleVersion::kEagle3 ? target_hidden_size * static_cast<int64_t>(aux_layers.size())
                                            : target_hidden_size;
  }
};

// Reads `dir`/config.json and checks it against the target: the version the method asks for, one
// layer, the same vocabulary, hidden sizes that fit, aux layers the target has. Each mismatch is a
// specula::Error naming the head, the key and both values.
EagleHeadConfig load_eagle_head_config(const std::filesystem::path& dir, EagleVersion version, const ModelConfig& target);

struct EagleForwardInput {
  // token_ids: the NEXT token of each row's position; positions: the target's; attn: the head's
  // own cache; logits_indices: rows whose drafts are wanted (may be empty).
  ForwardInput rows;
  Tensor hidden;             // [T, feature_size()] when from_target, else [T, H]: a previous step's prenorm
  bool from_target = true;
};

struct EagleForwardOutput {
  Tensor prenorm;  // [T, H] (backend scratch): the next draft step's hidden input
  Tensor logits;   // F32 [L, target vocab] (backend scratch); undefined when L = 0
};

class EagleHead {
 public:
  // Loads the weights through `weights`; `target` lends its embedding (and EAGLE-1's lm_head). With
  // `dummy` (random weights standing in for a real head) the maps are the identity on the first
  // draft_vocab_size ids and the target's embedding is used. Throws specula::Error naming the
  // tensor (and the head) when one is missing, mis-shaped or the maps are inconsistent.
  EagleHead(const EagleHeadConfig& config, WeightSource& weights, Backend& backend, const Model& target, bool dummy);

  const EagleHeadConfig& config() const { return config_; }
  int64_t hidden_size() const { return hidden_; }
  KVCacheSpec kv_cache_spec() const;
  // The head over a varlen batch; writes the rows' K/V into `cache` (slot -1 skips a row) first.
  // Does not reset the scratch arena.
  EagleForwardOutput forward(const EagleForwardInput& in, KVCacheLayer& cache);
  // A chain of head steps from chain.first_hidden (each step's prenorm the next one's hidden
  // input, the token it draws the next one's) as one backend op (Backend::decoder_chain:
  // one cluster kernel on CUDA), where the backend takes the head (EAGLE-3 without
  // norm_before_residual); false: the caller runs the steps.
  bool decoder_chain(DecoderChain& chain);

 private:
  void load_maps(WeightSource& weights, bool dummy);
  void check_input(const EagleForwardInput& in, const KVCacheLayer& cache) const;

  EagleHeadConfig config_;  // before layer_, which keeps a reference to config_.layer
  Backend& backend_;
  int64_t hidden_, vocab_, draft_vocab_;
  Tensor cos_sin_;
  LlamaDecoderLayer layer_;
  LlamaLayerWeights w_;
  Tensor hidden_norm_;   // [H] EAGLE-3
  Tensor fc_, fc_bias_;  // [H, feature_size()] (EAGLE-3) or [H, 2 H] (EAGLE-1); bias: EAGLE-1's, if stored
  Tensor norm_;          // [H] EAGLE-3
  Tensor embed_tokens_;  // [V, H]
  Tensor lm_head_;       // [draft V, H]
  Tensor column_of_;     // I32 [V]: the draft id of each target id, -1 outside the draft vocabulary
  Tensor target_of_;     // I32 [draft V]: the target id of each draft id (with column_of_)
};

}  // namespace specula
