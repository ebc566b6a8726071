// The Llama family's split over tensor-parallel ranks; see tensor_parallel_plan.h.
#include "model/tensor_parallel_plan.h"

#include <algorithm>
#include <string_view>

#include "core/error.h"

namespace specula {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

WeightShard sliced(int dim, int64_t begin, int64_t count, int64_t full) {
  return WeightShard{WeightShard::Kind::kSliced, TensorSlice{dim, begin, count}, full};
}

}  // namespace

void check_tensor_parallel(const ModelConfig& config, int size) {
  SPECULA_CHECK(size >= 1, "--tensor-parallel-size must be positive, got {}", size);
  if (size == 1) return;
  SPECULA_CHECK(!config.is_deepseek(),
                "--tensor-parallel-size {}: {} (MLA attention, MoE experts) cannot be split across ranks yet; only "
                "Llama, Mistral, Qwen2 and Qwen3 models can",
                size, architecture_name(config.arch));
  const std::string arch = architecture_name(config.arch);
  auto divides = [&](int64_t n, const char* what) {
    SPECULA_CHECK(n % size == 0, "--tensor-parallel-size {}: {}'s {} ({}) is not divisible by {}", size, arch, what,
                  n, size);
  };
  divides(config.num_attention_heads, "num_attention_heads");
  const int64_t hk = config.num_key_value_heads;
  SPECULA_CHECK(hk % size == 0 || size % hk == 0,
                "--tensor-parallel-size {}: {}'s num_key_value_heads ({}) must divide or be divisible by {}", size,
                arch, hk, size);
  divides(config.intermediate_size, "intermediate_size");
  divides(config.vocab_size, "vocab_size");
}

ModelConfig rank_config(const ModelConfig& config, int size) {
  ModelConfig c = config;
  c.num_attention_heads = config.num_attention_heads / size;
  c.num_key_value_heads = std::max<int64_t>(1, config.num_key_value_heads / size);
  c.intermediate_size = config.intermediate_size / size;
  return c;
}

WeightShard llama_weight_shard(const std::string& name, const ModelConfig& config, int rank, int size) {
  if (size == 1) return {};
  const int64_t d = config.head_dim, hq = config.num_attention_heads, hk = config.num_key_value_heads;
  const int64_t inter = config.intermediate_size, vocab = config.vocab_size;
  const int64_t q_heads = hq / size, kv_heads = std::max<int64_t>(1, hk / size), first_kv = rank * hk / size;
  const bool weight = ends_with(name, ".weight"), bias = ends_with(name, ".bias");
  if (!weight && !bias) return {};
  const std::string_view module = std::string_view(name).substr(0, name.rfind('.'));
  if (ends_with(module, "self_attn.q_proj")) return sliced(0, rank * q_heads * d, q_heads * d, hq * d);
  if (ends_with(module, "self_attn.k_proj") || ends_with(module, "self_attn.v_proj"))
    return sliced(0, first_kv * d, kv_heads * d, hk * d);
  if (ends_with(module, "mlp.gate_proj") || ends_with(module, "mlp.up_proj"))
    return sliced(0, rank * (inter / size), inter / size, inter);
  if (ends_with(module, "self_attn.o_proj"))
    return weight ? sliced(1, rank * q_heads * d, q_heads * d, hq * d) : WeightShard{WeightShard::Kind::kRankZeroOnly};
  if (ends_with(module, "mlp.down_proj"))
    return weight ? sliced(1, rank * (inter / size), inter / size, inter)
                  : WeightShard{WeightShard::Kind::kRankZeroOnly};
  if (name == "lm_head.weight") return sliced(0, rank * (vocab / size), vocab / size, vocab);
  return {};
}

}  // namespace specula
