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
  const std::string arch = architecture_name(config.arch);
  auto divides = [&](int64_t n, const char* what) {
    SPECULA_CHECK(n % size == 0, "--tensor-parallel-size {}: {}'s {} ({}) is not divisible by {}", size, arch, what,
                  n, size);
  };
  divides(config.num_attention_heads, "num_attention_heads");
  if (config.is_deepseek()) {  // MLA: heads split, the latent cache replicated; MoE: each expert split
    divides(config.intermediate_size, "intermediate_size");
    divides(config.moe_intermediate_size, "moe_intermediate_size");
    divides(config.vocab_size, "vocab_size");
    return;
  }
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
  c.moe_intermediate_size = config.moe_intermediate_size / size;
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
  if (name == "lm_head.weight" || name == "model.embed_tokens.weight")
    return sliced(0, rank * (vocab / size), vocab / size, vocab);
  return {};
}

WeightShard deepseek_weight_shard(const std::string& name, const ModelConfig& config, int rank, int size) {
  if (size == 1) return {};
  // DeepSeek-V3's FP8 block scales: one per [bn, bk] block of their weight, sliced with it.
  constexpr std::string_view kScaleInv = "_scale_inv";
  if (ends_with(name, kScaleInv)) {
    const std::string of = name.substr(0, name.size() - kScaleInv.size());
    WeightShard w = deepseek_weight_shard(of, config, rank, size);
    if (w.kind != WeightShard::Kind::kSliced) return {};
    int64_t block = 128;
    if (config.raw.is_object() && config.raw.contains("quantization_config")) {
      const auto& q = config.raw["quantization_config"];
      if (q.is_object() && q.contains("weight_block_size") && q["weight_block_size"].is_array() &&
          q["weight_block_size"].size() == 2)
        block = q["weight_block_size"][static_cast<size_t>(w.slice.dim)].get<int64_t>();
    }
    SPECULA_CHECK(block > 0 && w.slice.begin % block == 0 && w.slice.count % block == 0,
                  "--tensor-parallel-size {}: rank {}'s part of '{}' ({} from {} along dim {}) does not fall on its FP8 "
                  "blocks of {}", size, rank, of, w.slice.count, w.slice.begin, w.slice.dim, block);
    return sliced(w.slice.dim, w.slice.begin / block, w.slice.count / block, (w.full_extent + block - 1) / block);
  }
  const int64_t heads = config.num_attention_heads, mine = heads / size;
  const int64_t qk = config.qk_nope_head_dim + config.qk_rope_head_dim, kv_b = config.qk_nope_head_dim + config.v_head_dim;
  const int64_t v = config.v_head_dim;
  const bool weight = ends_with(name, ".weight"), bias = ends_with(name, ".bias");
  if (!weight && !bias) return {};
  const std::string_view module = std::string_view(name).substr(0, name.rfind('.'));
  // Attention by heads: a head's query rows (q_proj or q_b_proj), kv_b_proj rows and o_proj
  // columns; q_a / kv_a (the latent, shared by every head) replicated.
  if (ends_with(module, "self_attn.q_proj") || ends_with(module, "self_attn.q_b_proj"))
    return weight ? sliced(0, rank * mine * qk, mine * qk, heads * qk) : WeightShard{};
  if (ends_with(module, "self_attn.kv_b_proj")) return sliced(0, rank * mine * kv_b, mine * kv_b, heads * kv_b);
  if (ends_with(module, "self_attn.o_proj"))
    return weight ? sliced(1, rank * mine * v, mine * v, heads * v) : WeightShard{WeightShard::Kind::kRankZeroOnly};
  // MLPs by intermediate channels: the dense MLP's, each routed expert's and the shared experts'
  // (all S of them as one MLP of width S * I; its own rows for each rank).
  int64_t width = 0;
  if (module.find(".experts.") != std::string_view::npos) {
    width = config.moe_intermediate_size;
  } else if (module.find(".shared_experts.") != std::string_view::npos) {
    width = config.n_shared_experts * config.moe_intermediate_size;
  } else if (module.find(".mlp.") != std::string_view::npos && !ends_with(module, "mlp.gate")) {
    width = config.intermediate_size;
  }
  if (width > 0) {
    const int64_t part = width / size;
    if (ends_with(module, "gate_proj") || ends_with(module, "up_proj")) return sliced(0, rank * part, part, width);
    if (ends_with(module, "down_proj")) return sliced(1, rank * part, part, width);
  }
  if (name == "lm_head.weight" || name == "model.embed_tokens.weight") {
    const int64_t rows = config.vocab_size / size;
    return sliced(0, rank * rows, rows, config.vocab_size);
  }
  return {};
}

}  // namespace specula
