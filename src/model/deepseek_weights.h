// Loading DeepSeek-V2/V3 weights by their checkpoint names into the layouts the forward wants:
// row-stacked projections, experts stacked into [E, 2I, H] / [E, H, I] for fused_moe (from the
// checkpoints' per-expert tensors or transformers 5's fused ones), replicas of the shared expert
// appended for shared-expert fusion, MLA's per-head halves of kv_b_proj, and FP8 block-quantised
// weights dequantised on the way in.
#pragma once

#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weight_source.h"

namespace specula {

// Experts as fused_moe takes them: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I].
struct StackedExperts {
  Tensor w13;
  Tensor w2;
};

class DeepseekWeightLoader {
 public:
  DeepseekWeightLoader(const ModelConfig& config, WeightSource& source, Backend& backend);

  bool has(const std::string& name) const { return source_.has(name); }
  const std::string& describe_source() const { return source_description_; }

  // A weight in the backend's compute dtype. A weight that the checkpoint lists with
  // `<name>_scale_inv` beside it is FP8 (E4M3) block-quantised, as DeepSeek-V3 ships: it is
  // dequantised, w[n, k] = fp8(q[n, k]) * scale_inv[n / bn, k / bk] with the [bn, bk] blocks of
  // config.json's quantization_config.weight_block_size (default 128 x 128).
  Tensor load(const std::string& name, const Shape& shape);
  // An F32 tensor whatever the compute dtype (the router, which transformers runs in fp32).
  Tensor load_f32(const std::string& name, const Shape& shape);
  // Tensors concatenated along dim 0 ([n_i, K] -> [sum n_i, K]), each loaded as load() does.
  Tensor load_stacked(const std::vector<std::pair<std::string, Shape>>& parts);

  // The routed experts of the MoE block whose tensors start with `mlp_prefix` ("model.layers.3.mlp."),
  // stacked, followed by `shared_replicas` copies of the shared expert split into
  // n_shared_experts experts of the routed width (see fused_shared_expert_ids in deepseek_layer.h).
  // Per-expert checkpoint names (experts.{e}.gate_proj.weight, ...) are preferred; transformers 5's
  // fused experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I] are read otherwise.
  StackedExperts load_experts(const std::string& mlp_prefix, int shared_replicas);

  // MLA's absorbed halves of kv_b_proj [Hq (dn + dv), C] (rows of head h: dn key rows, then dv
  // value rows): w_uk_t [Hq, C, dn] (each head's key block transposed: maps q_nope to the latent
  // space) and w_uv [Hq, dv, C] (maps an attended latent to the head's value).
  std::pair<Tensor, Tensor> load_absorbed_kv_b(const std::string& name);

 private:
  Tensor load_block_fp8(const std::string& name, const std::string& scale_name, const Shape& shape);
  // Host F32 values -> a new backend tensor in the compute dtype.
  Tensor upload(const std::vector<float>& values, const Shape& shape);
  // A backend tensor -> host F32 values.
  std::vector<float> download(const Tensor& t);

  const ModelConfig& config_;
  WeightSource& source_;
  Backend& backend_;
  std::string source_description_;
  // Names the source lists. A checkpoint lists all it holds; dummy weights list none, so they are
  // never taken for FP8.
  std::unordered_set<std::string> listed_;
  int64_t block_n_ = 128, block_k_ = 128;
};

}  // namespace specula
