// config.json -> ModelConfig with the defaults transformers applies for each architecture (the
// values its config classes give a key that config.json leaves out), so that a checkpoint means
// here exactly what it means to transformers.
#include "model/config.h"

#include <string>

#include "core/error.h"
#include "model/config_json.h"
#include "model/config_rope.h"

namespace specula {
namespace {

// What transformers' config class for each architecture does with a key config.json omits.
struct ArchInfo {
  Architecture arch;
  const char* class_name;
  const char* model_type;
  int64_t max_position_embeddings;
  int64_t kv_heads_when_absent;  // 0: num_attention_heads (an explicit null always means that)
  int64_t head_dim_when_absent;  // 0: hidden_size / num_attention_heads
  std::optional<int64_t> bos, eos;
};

constexpr int64_t kHeads = 0;
const ArchInfo kArchs[] = {
    // LlamaConfig: num_key_value_heads=None, head_dim=None, bos 1, eos 2, max_position 2048.
    {Architecture::kLlama, "LlamaForCausalLM", "llama", 2048, kHeads, 0, 1, 2},
    // MistralConfig: num_key_value_heads=8, max_position 4096*32, bos 1, eos 2.
    {Architecture::kMistral, "MistralForCausalLM", "mistral", 4096 * 32, 8, 0, 1, 2},
    // Qwen2Config: num_key_value_heads=32, no head_dim (modeling falls back to hidden/heads).
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2", 32768, 32, 0, std::nullopt, std::nullopt},
    // Qwen3Config: num_key_value_heads=32, head_dim=128.
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3", 32768, 32, 128, std::nullopt, std::nullopt},
    // DeepseekV2Config: num_key_value_heads=None; head_dim is forced to qk_rope_head_dim.
    {Architecture::kDeepseekV2, "DeepseekV2ForCausalLM", "deepseek_v2", 2048, kHeads, 0, 1, 2},
    // DeepseekV3Config: num_key_value_heads=128; head_dim is forced to qk_rope_head_dim.
    {Architecture::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3", 4096, 128, 0, 0, 1},
};

std::string supported_list() {
  std::string s;
  for (const auto& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.class_name);
  return s;
}

const ArchInfo& find_arch(const JsonKeys& keys) {
  if (keys.has_value("architectures")) {
    const auto& list = keys.json().at("architectures");
    if (!list.is_array() || list.empty() || !list[0].is_string())
      keys.fail("architectures", "expected a non-empty list of class names, got " + describe_json_value(list));
    std::string name = list[0].get<std::string>();
    for (const auto& a : kArchs)
      if (name == a.class_name) return a;
    keys.fail("architectures", fmt::format("unsupported architecture '{}' (supported: {})", name, supported_list()));
  }
  // No architectures list: transformers' AutoConfig goes by model_type.
  auto model_type = keys.get_string("model_type");
  if (!model_type) keys.fail("architectures", "missing required key (and no model_type to infer it from)");
  for (const auto& a : kArchs)
    if (*model_type == a.model_type) return a;
  keys.fail("model_type", fmt::format("unsupported model type '{}' (supported: {})", *model_type, supported_list()));
}

int64_t positive(const JsonKeys& keys, const std::string& key, int64_t v) {
  if (v <= 0) keys.fail(key, fmt::format("must be positive, got {}", v));
  return v;
}

int64_t require_positive(const JsonKeys& keys, const std::string& key) {
  return positive(keys, key, keys.require_int(key));
}

int64_t int_or(const JsonKeys& keys, const std::string& key, int64_t fallback) {
  return keys.get_int(key).value_or(fallback);
}

// bos/eos: an explicit null means "none"; an absent key takes the class default.
std::optional<int64_t> token_or(const JsonKeys& keys, const std::string& key, std::optional<int64_t> fallback) {
  if (!keys.has(key)) return fallback;
  return keys.get_int(key);
}

std::string one_of(const JsonKeys& keys, const std::string& key, const std::string& fallback,
                   std::initializer_list<const char*> allowed) {
  std::string v = keys.get_string(key).value_or(fallback);
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return v;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  keys.fail(key, fmt::format("unsupported value '{}' (supported: {})", v, list));
}

void parse_deepseek(const JsonKeys& k, ModelConfig& c) {
  const bool v3 = c.arch == Architecture::kDeepseekV3;
  // q_lora_rank: absent -> the class default 1536; null -> no LoRA on q (plain q_proj).
  c.q_lora_rank = k.has("q_lora_rank") ? k.get_int("q_lora_rank") : std::optional<int64_t>(1536);
  if (c.q_lora_rank) positive(k, "q_lora_rank", *c.q_lora_rank);
  c.kv_lora_rank = positive(k, "kv_lora_rank", int_or(k, "kv_lora_rank", 512));
  c.qk_nope_head_dim = positive(k, "qk_nope_head_dim", int_or(k, "qk_nope_head_dim", 128));
  c.qk_rope_head_dim = positive(k, "qk_rope_head_dim", int_or(k, "qk_rope_head_dim", 64));
  c.v_head_dim = positive(k, "v_head_dim", int_or(k, "v_head_dim", 128));
  if (c.qk_rope_head_dim % 2 != 0) k.fail("qk_rope_head_dim", fmt::format("must be even, got {}", c.qk_rope_head_dim));
  // transformers sets head_dim = qk_rope_head_dim for MLA (it is the rotary dimension).
  c.head_dim = c.qk_rope_head_dim;
  // V2 always rotates interleaved pairs; V3 reads rope_interleave (default true).
  c.rope_interleave = v3 ? k.get_bool("rope_interleave").value_or(true) : true;

  c.n_routed_experts = positive(k, "n_routed_experts", int_or(k, "n_routed_experts", v3 ? 256 : 64));
  c.n_shared_experts = int_or(k, "n_shared_experts", v3 ? 1 : 2);
  if (c.n_shared_experts < 0) k.fail("n_shared_experts", fmt::format("must not be negative, got {}", c.n_shared_experts));
  // DeepseekV2Config defaults num_experts_per_tok to None, which its MoE cannot run with.
  c.num_experts_per_tok = v3 ? int_or(k, "num_experts_per_tok", 8) : k.require_int("num_experts_per_tok");
  positive(k, "num_experts_per_tok", c.num_experts_per_tok);
  if (c.num_experts_per_tok > c.n_routed_experts) {
    k.fail("num_experts_per_tok", fmt::format("{} exceeds n_routed_experts ({})", c.num_experts_per_tok,
                                              c.n_routed_experts));
  }
  c.moe_intermediate_size = positive(k, "moe_intermediate_size", int_or(k, "moe_intermediate_size", v3 ? 2048 : 1407));
  c.first_k_dense_replace = int_or(k, "first_k_dense_replace", v3 ? 3 : 0);
  if (c.first_k_dense_replace < 0)
    k.fail("first_k_dense_replace", fmt::format("must not be negative, got {}", c.first_k_dense_replace));
  c.moe_layer_freq = positive(k, "moe_layer_freq", int_or(k, "moe_layer_freq", 1));
  // n_group / topk_group: V2's default None means one group.
  c.n_group = positive(k, "n_group", int_or(k, "n_group", v3 ? 8 : 1));
  c.topk_group = positive(k, "topk_group", int_or(k, "topk_group", v3 ? 4 : 1));
  if (c.n_routed_experts % c.n_group != 0)
    k.fail("n_group", fmt::format("{} does not divide n_routed_experts ({})", c.n_group, c.n_routed_experts));
  if (c.topk_group > c.n_group)
    k.fail("topk_group", fmt::format("{} exceeds n_group ({})", c.topk_group, c.n_group));
  c.topk_method = one_of(k, "topk_method", v3 ? "noaux_tc" : "greedy", {"greedy", "group_limited_greedy", "noaux_tc"});
  c.scoring_func = one_of(k, "scoring_func", v3 ? "sigmoid" : "softmax", {"softmax", "sigmoid"});
  c.routed_scaling_factor = k.get_number("routed_scaling_factor").value_or(v3 ? 2.5 : 1.0);
  c.norm_topk_prob = k.get_bool("norm_topk_prob").value_or(v3);
  c.num_nextn_predict_layers = int_or(k, "num_nextn_predict_layers", 0);
  if (c.num_nextn_predict_layers < 0)
    k.fail("num_nextn_predict_layers", fmt::format("must not be negative, got {}", c.num_nextn_predict_layers));
}

}  // namespace

std::string architecture_name(Architecture a) {
  for (const auto& e : kArchs)
    if (e.arch == a) return e.class_name;
  return "?";
}

int64_t ModelConfig::rotary_dim() const {
  if (is_deepseek()) return qk_rope_head_dim;
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source_name) {
  JsonKeys k(j, source_name);
  const ArchInfo& info = find_arch(k);
  ModelConfig c;
  c.arch = info.arch;
  c.raw = j;
  c.model_type = k.get_string("model_type").value_or(info.model_type);
  // transformers 5 writes `dtype`, older versions `torch_dtype`.
  if (auto d = k.get_string("torch_dtype")) c.torch_dtype = *d;
  else if (auto d2 = k.get_string("dtype")) c.torch_dtype = *d2;

  // Sizes every real checkpoint states; silently falling back to the class defaults (Llama-2-7B's
  // shapes) would build a model that matches no checkpoint.
  c.vocab_size = require_positive(k, "vocab_size");
  c.hidden_size = require_positive(k, "hidden_size");
  c.intermediate_size = require_positive(k, "intermediate_size");
  c.num_hidden_layers = require_positive(k, "num_hidden_layers");
  c.num_attention_heads = require_positive(k, "num_attention_heads");

  if (!k.has("num_key_value_heads")) {
    c.num_key_value_heads = info.kv_heads_when_absent == kHeads ? c.num_attention_heads : info.kv_heads_when_absent;
  } else {
    c.num_key_value_heads = k.get_int("num_key_value_heads").value_or(c.num_attention_heads);
  }
  positive(k, "num_key_value_heads", c.num_key_value_heads);
  if (!c.is_deepseek() && c.num_attention_heads % c.num_key_value_heads != 0) {
    k.fail("num_key_value_heads", fmt::format("{} does not divide num_attention_heads ({})", c.num_key_value_heads,
                                              c.num_attention_heads));
  }

  if (!c.is_deepseek()) {
    std::optional<int64_t> hd = k.get_int("head_dim");
    if (!hd && !k.has("head_dim") && info.head_dim_when_absent > 0) hd = info.head_dim_when_absent;
    if (!hd) {
      if (c.hidden_size % c.num_attention_heads != 0) {
        k.fail("hidden_size", fmt::format("{} is not a multiple of num_attention_heads ({}) and no head_dim is given",
                                          c.hidden_size, c.num_attention_heads));
      }
      hd = c.hidden_size / c.num_attention_heads;
    }
    c.head_dim = positive(k, "head_dim", *hd);
  }

  c.rms_norm_eps = k.get_number("rms_norm_eps").value_or(1e-6);
  if (!(c.rms_norm_eps > 0.0)) k.fail("rms_norm_eps", fmt::format("must be positive, got {}", c.rms_norm_eps));
  c.max_position_embeddings = positive(k, "max_position_embeddings",
                                       int_or(k, "max_position_embeddings", info.max_position_embeddings));
  c.tie_word_embeddings = k.get_bool("tie_word_embeddings").value_or(false);
  c.hidden_act = k.get_string("hidden_act").value_or("silu");

  switch (c.arch) {
    case Architecture::kLlama:
      // LlamaAttention puts config.attention_bias on q, k, v and o; LlamaMLP config.mlp_bias on all three.
      c.attention_bias = c.o_proj_bias = k.get_bool("attention_bias").value_or(false);
      c.mlp_bias = k.get_bool("mlp_bias").value_or(false);
      break;
    case Architecture::kMistral:
      // MistralAttention has no bias whatever config.json says; sliding_window defaults to 4096.
      c.sliding_window = k.has("sliding_window") ? k.get_int("sliding_window") : std::optional<int64_t>(4096);
      break;
    case Architecture::kQwen2:
    case Architecture::kQwen3: {
      if (c.arch == Architecture::kQwen2) {
        c.attention_bias = true;  // Qwen2Attention: q/k/v always biased, o never.
      } else {
        c.qk_norm = true;
        c.attention_bias = c.o_proj_bias = k.get_bool("attention_bias").value_or(false);
      }
      // The window applies only with use_sliding_window (false in every released Qwen2/3 model).
      if (k.get_bool("use_sliding_window").value_or(false))
        c.sliding_window = k.has("sliding_window") ? k.get_int("sliding_window") : std::optional<int64_t>(4096);
      break;
    }
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3:
      // attention_bias covers q_a_proj, kv_a_proj_with_mqa and o_proj.
      c.attention_bias = c.o_proj_bias = k.get_bool("attention_bias").value_or(false);
      parse_deepseek(k, c);
      break;
  }

  c.rope = parse_rope_config(k, c.max_position_embeddings);
  if (c.rotary_dim() <= 0 || c.rotary_dim() % 2 != 0 || c.rotary_dim() > c.head_dim) {
    k.fail(k.has("partial_rotary_factor") ? "partial_rotary_factor" : "head_dim",
           fmt::format("rotary dimension {} must be even, positive and at most head_dim ({})", c.rotary_dim(),
                       c.head_dim));
  }

  c.bos_token_id = token_or(k, "bos_token_id", info.bos);
  if (!k.has("eos_token_id")) {
    if (info.eos) c.eos_token_ids = {*info.eos};
  } else {
    c.eos_token_ids = k.get_int_or_int_list("eos_token_id");
  }
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  return parse_model_config(read_json_file(file), file.string());
}

GenerationConfig load_generation_config(const std::filesystem::path& model_dir) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::is_directory(model_dir, ec) ? model_dir : model_dir.parent_path();
  std::filesystem::path file = dir / "generation_config.json";
  GenerationConfig g;
  if (!std::filesystem::exists(file, ec)) return g;
  nlohmann::json j = read_json_file(file);
  JsonKeys k(j, file.string());
  g.eos_token_ids = k.get_int_or_int_list("eos_token_id");
  g.bos_token_id = k.get_int("bos_token_id");
  g.temperature = k.get_number("temperature");
  g.top_p = k.get_number("top_p");
  g.top_k = k.get_int("top_k");
  g.min_p = k.get_number("min_p");
  g.repetition_penalty = k.get_number("repetition_penalty");
  g.max_new_tokens = k.get_int("max_new_tokens");
  if (g.temperature && *g.temperature < 0) k.fail("temperature", fmt::format("must not be negative, got {}", *g.temperature));
  if (g.top_p && !(*g.top_p > 0 && *g.top_p <= 1)) k.fail("top_p", fmt::format("must be in (0, 1], got {}", *g.top_p));
  if (g.min_p && !(*g.min_p >= 0 && *g.min_p <= 1)) k.fail("min_p", fmt::format("must be in [0, 1], got {}", *g.min_p));
  if (g.repetition_penalty && !(*g.repetition_penalty > 0))
    k.fail("repetition_penalty", fmt::format("must be positive, got {}", *g.repetition_penalty));
  if (g.max_new_tokens && *g.max_new_tokens <= 0)
    k.fail("max_new_tokens", fmt::format("must be positive, got {}", *g.max_new_tokens));
  return g;
}

}  // namespace specula
