// DeepSeek weight loading; see deepseek_weights.h. Everything that reshapes a checkpoint tensor
// (transposes, block dequantisation) is done once on the host in fp32 and uploaded in the compute
// dtype; plain tensors and stacking go straight through the weight source and backend copies.
#include "model/deepseek_weights.h"

#include "core/logging.h"
#include "model/config_json.h"
#include "model/weight_upload.h"

namespace specula {

DeepseekWeightLoader::DeepseekWeightLoader(const ModelConfig& config, WeightSource& source, Backend& backend)
    : config_(config), source_(source), backend_(backend), source_description_(source.describe()) {
  for (const std::string& n : source.names()) listed_.insert(n);
  if (config.raw.is_object()) {
    JsonKeys keys(config.raw, "config.json");
    if (auto q = keys.get_object("quantization_config")) {
      if (q->has_value("weight_block_size")) {
        const nlohmann::json& b = q->json().at("weight_block_size");
        if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
            b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
          q->fail("weight_block_size", "expected two positive integers, got " + describe_json_value(b));
        }
        block_n_ = b[0].get<int64_t>();
        block_k_ = b[1].get<int64_t>();
      }
    }
  }
}

Tensor DeepseekWeightLoader::load(const std::string& name, const Shape& shape) {
  const std::string scale = name + "_scale_inv";
  if (listed_.count(scale) != 0) return load_block_fp8(name, scale, shape);
  return source_.load(name, shape, backend_.compute_dtype(), backend_);
}

Tensor DeepseekWeightLoader::load_f32(const std::string& name, const Shape& shape) {
  SPECULA_CHECK(listed_.count(name + "_scale_inv") == 0, "{}: tensor '{}' is FP8-quantised, which is not supported "
                "for it (routers stay in full precision)", source_description_, name);
  return source_.load(name, shape, DType::kF32, backend_);
}

Tensor DeepseekWeightLoader::load_stacked(const std::vector<std::pair<std::string, Shape>>& parts) {
  return stack_rows(backend_, backend_.compute_dtype(), parts,
                    [this](const std::string& name, const Shape& shape) { return load(name, shape); });
}

StackedExperts DeepseekWeightLoader::load_experts(const std::string& p, int shared_replicas) {
  const int64_t e = config_.n_routed_experts, inter = config_.moe_intermediate_size, h = config_.hidden_size;
  const int64_t parts = shared_replicas > 0 ? config_.n_shared_experts : 0;
  const int64_t total = e + shared_replicas * parts;
  const DType dt = backend_.compute_dtype();
  StackedExperts out{backend_.empty({total, 2 * inter, h}, dt), backend_.empty({total, h, inter}, dt)};
  Tensor w13_rows = out.w13.reshape({total * 2 * inter, h});  // expert x: rows [2I x, 2I x + 2I)
  Tensor w2_rows = out.w2.reshape({total * h, inter});        // expert x: rows [H x, H x + H)
  auto put = [&](const Tensor& src, Tensor& all_rows, int64_t first_row) {
    Tensor dst = all_rows.slice(first_row, first_row + src.size(0));
    backend_.copy(src, dst);
  };

  const bool per_expert = has(p + "experts.0.gate_proj.weight");
  SPECULA_CHECK(per_expert || has(p + "experts.gate_up_proj"),
                "{}: the experts of '{}' are missing: neither '{}experts.0.gate_proj.weight' (checkpoint naming) nor "
                "'{}experts.gate_up_proj' (transformers 5 naming) is present", source_description_, p, p, p);
  if (per_expert) {
    // The checkpoints' own naming: one MLP per expert.
    for (int64_t x = 0; x < e; ++x) {
      const std::string ep = p + "experts." + std::to_string(x) + ".";
      put(load(ep + "gate_proj.weight", {inter, h}), w13_rows, x * 2 * inter);
      put(load(ep + "up_proj.weight", {inter, h}), w13_rows, x * 2 * inter + inter);
      put(load(ep + "down_proj.weight", {h, inter}), w2_rows, x * h);
    }
  } else {
    // transformers 5's in-memory naming, already stacked (gate rows first, as ours).
    for (const char* fused : {"experts.gate_up_proj", "experts.down_proj"}) {
      SPECULA_CHECK(listed_.count(p + fused + std::string("_scale_inv")) == 0,
                    "{}: tensor '{}{}' is FP8-quantised; quantised fused expert tensors are not supported",
                    source_description_, p, fused);
    }
    Tensor w13 = source_.load(p + "experts.gate_up_proj", {e, 2 * inter, h}, dt, backend_);
    Tensor w2 = source_.load(p + "experts.down_proj", {e, h, inter}, dt, backend_);
    Tensor dst13 = out.w13.slice(0, e), dst2 = out.w2.slice(0, e);
    backend_.copy(w13, dst13);
    backend_.copy(w2, dst2);
  }

  if (shared_replicas > 0 && parts > 0) {
    // The shared expert is one MLP of width S * I. Its intermediate units are independent
    // (SiLU-and-multiply is element-wise) and down_proj sums over them, so cutting it into S MLPs
    // of width I along the intermediate dim, each taking weight 1, computes exactly the same sum.
    // Each cut is copied into `shared_replicas` expert slots; scale tensors, if any, were applied
    // by load() before the copy, so every replica carries the dequantised values.
    const std::string sp = p + "shared_experts.";
    Tensor gate = load(sp + "gate_proj.weight", {parts * inter, h});
    Tensor up = load(sp + "up_proj.weight", {parts * inter, h});
    Tensor down = load(sp + "down_proj.weight", {h, parts * inter});
    for (int r = 0; r < shared_replicas; ++r) {
      for (int64_t j = 0; j < parts; ++j) {
        const int64_t x = e + r * parts + j;
        put(gate.slice(j * inter, (j + 1) * inter), w13_rows, x * 2 * inter);
        put(up.slice(j * inter, (j + 1) * inter), w13_rows, x * 2 * inter + inter);
        Tensor dst = w2_rows.slice(x * h, (x + 1) * h);
        backend_.copy_columns(down, j * inter, dst, 0, inter);
      }
    }
  }
  return out;
}

std::pair<Tensor, Tensor> DeepseekWeightLoader::load_absorbed_kv_b(const std::string& name) {
  const int64_t heads = config_.num_attention_heads, dn = config_.qk_nope_head_dim, dv = config_.v_head_dim,
                c = config_.kv_lora_rank;
  const std::vector<float> w = download(load(name, {heads * (dn + dv), c}));
  std::vector<float> uk_t(heads * c * dn), uv(heads * dv * c);
  for (int64_t h = 0; h < heads; ++h) {
    const float* block = w.data() + h * (dn + dv) * c;  // [dn + dv, C]
    for (int64_t i = 0; i < dn; ++i)
      for (int64_t j = 0; j < c; ++j) uk_t[(h * c + j) * dn + i] = block[i * c + j];
    std::copy(block + dn * c, block + (dn + dv) * c, uv.begin() + h * dv * c);
  }
  return {upload(uk_t, {heads, c, dn}), upload(uv, {heads, dv, c})};
}

Tensor DeepseekWeightLoader::load_block_fp8(const std::string& name, const std::string& scale_name,
                                            const Shape& shape) {
  SPECULA_CHECK(shape.size() == 2, "{}: tensor '{}' has FP8 scales but is not a matrix ({})", source_description_,
                name, shape_str(shape));
  const int64_t n = shape[0], k = shape[1];
  const int64_t sn = (n + block_n_ - 1) / block_n_, sk = (k + block_k_ - 1) / block_k_;
  Tensor q;
  try {
    q = source_.load(name, shape, DType::kF8E4M3, backend_);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: tensor '{}' has '{}' beside it, so it must be stored as F8_E4M3: {}",
                            source_description_, name, scale_name, e.what()));
  }
  const std::vector<float> scales = download(source_.load(scale_name, {sn, sk}, DType::kF32, backend_));
  const std::vector<float> values = download(q);  // F8 -> F32, exact
  std::vector<float> w(values.size());
  for (int64_t r = 0; r < n; ++r) {
    const float* s = scales.data() + (r / block_n_) * sk;
    for (int64_t col = 0; col < k; ++col) w[r * k + col] = values[r * k + col] * s[col / block_k_];
  }
  return upload(w, shape);
}

Tensor DeepseekWeightLoader::upload(const std::vector<float>& values, const Shape& shape) {
  const DType dt = backend_.compute_dtype();
  Tensor host = Tensor::empty(shape, dt, Device::kCPU);
  convert_elements(values.data(), DType::kF32, host.data(), dt, values.size());
  Tensor dst = backend_.empty(shape, dt);
  backend_.copy(host, dst);
  return dst;
}

std::vector<float> DeepseekWeightLoader::download(const Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::kCPU);
  backend_.copy(t, host);
  backend_.synchronize();
  return host.to_f32_vector();
}

}  // namespace specula
