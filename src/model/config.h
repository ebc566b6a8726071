// config.json and generation_config.json, parsed once into typed structs (the one source of
// truth for model facts). Parsing lives in config.cc; every missing or malformed key is an error
// naming the file and the key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula {

// Rotary embedding settings. Real checkpoints write them two ways: `rope_theta` + `rope_scaling`
// (older) or `rope_parameters` (transformers 5); both parse into this.
struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3, kYarn, kDynamic };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                        // linear, llama3, yarn
  double low_freq_factor = 1.0;               // llama3
  double high_freq_factor = 4.0;              // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn
  double beta_fast = 32.0;                    // yarn
  double beta_slow = 1.0;                     // yarn
  double mscale = 1.0;                        // yarn (DeepSeek writes mscale and mscale_all_dim)
  double mscale_all_dim = 0.0;                // yarn
  std::optional<double> attention_factor;     // yarn, when given explicitly
  double partial_rotary_factor = 1.0;         // fraction of head_dim that rotates
};

enum class Architecture {
  kLlama,      // LlamaForCausalLM
  kMistral,    // MistralForCausalLM
  kQwen2,      // Qwen2ForCausalLM (q/k/v bias)
  kQwen3,      // Qwen3ForCausalLM (q/k norm)
  kDeepseekV2, // DeepseekV2ForCausalLM (MLA, MoE)
  kDeepseekV3, // DeepseekV3ForCausalLM (MLA, MoE, sigmoid routing, MTP)
};
std::string architecture_name(Architecture a);  // the HF class name

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string model_type;         // "llama", "qwen3", ...
  std::string torch_dtype = "bfloat16";  // `torch_dtype` or transformers 5's `dtype`

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;      // q/k/v (and o for Llama's attention_bias) biases; Qwen2: q/k/v
  bool o_proj_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;             // Qwen3: RMSNorm over each q and k head before RoPE
  std::string hidden_act = "silu";
  std::optional<int64_t> sliding_window;  // parsed; not used by full-attention models
  RopeConfig rope;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json's eos_token_id (int or list)

  // ---- DeepSeek-V2/V3 (MLA + MoE); zero / empty for dense models ----
  std::optional<int64_t> q_lora_rank;  // null -> plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;         // DeepSeek rotates interleaved pairs unless told otherwise
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  std::string topk_method = "greedy";  // V2: greedy | group_limited_greedy; V3: noaux_tc
  std::string scoring_func = "softmax";  // V2: softmax; V3: sigmoid
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = false;
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored after the main layers

  bool is_deepseek() const { return arch == Architecture::kDeepseekV2 || arch == Architecture::kDeepseekV3; }
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  int64_t rotary_dim() const;  // head_dim * partial_rotary_factor (qk_rope_head_dim for MLA)

  nlohmann::json raw;  // the whole config.json, for the rare key nobody typed
};

// Sampling defaults and stop tokens from generation_config.json (all optional).
struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> max_new_tokens;
};

// Parse config.json from a checkpoint folder (or the file itself). Throws specula::Error naming
// the file and key for a missing/corrupt file, an unknown architecture or rope type, or a key of
// the wrong type.
ModelConfig load_model_config(const std::filesystem::path& path);
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source_name);
// generation_config.json beside config.json; absent file -> empty config.
GenerationConfig load_generation_config(const std::filesystem::path& model_dir);

}  // namespace specula
