// resolve_weight_quantization: config.json's quantization_config and --quantization; see
// weight_quantization.h.
#include "model/weight_quantization.h"

#include <regex>

#include "core/error.h"
#include "model/config_json.h"

namespace specula {
namespace {

std::vector<std::string> string_list(const JsonKeys& q, const std::string& key) {
  std::vector<std::string> out;
  if (!q.has_value(key)) return out;
  const nlohmann::json& v = q.json().at(key);
  if (!v.is_array()) q.fail(key, "expected a list of module names, got " + describe_json_value(v));
  for (const auto& e : v) {
    if (!e.is_string()) q.fail(key, "expected module names, got " + describe_json_value(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

// llm-compressor: every config group's weights must be 8-bit floats, one scale per tensor or per
// output channel.
void check_compressed_tensors(const JsonKeys& q) {
  const std::string format = q.get_string("format").value_or("");
  if (format != "float-quantized" && format != "naive-quantized") {
    q.fail("format", fmt::format("'{}' is not supported (supported: float-quantized FP8 weights)", format));
  }
  auto groups = q.get_object("config_groups");
  if (!groups) q.fail("config_groups", "missing: no quantisation scheme is given");
  for (auto it = groups->json().begin(); it != groups->json().end(); ++it) {
    auto group = groups->get_object(it.key());
    if (!group) groups->fail(it.key(), "expected an object");
    auto weights = group->get_object("weights");
    if (!weights) group->fail("weights", "missing: only weight quantisation is supported");
    const int64_t bits = weights->get_int("num_bits").value_or(0);
    const std::string type = weights->get_string("type").value_or("");
    const std::string strategy = weights->get_string("strategy").value_or("");
    if (bits != 8 || type != "float") {
      weights->fail("type", fmt::format("{}-bit {} weights are not supported (supported: 8-bit float, FP8 e4m3)", bits,
                                        type.empty() ? "int" : type));
    }
    if (strategy != "tensor" && strategy != "channel") {
      weights->fail("strategy", fmt::format("'{}' scales are not supported (supported: tensor, channel)", strategy));
    }
  }
}

}  // namespace

bool WeightQuantization::quantizes(const std::string& module) const {
  if (!fp8()) return false;
  for (const std::string& ignored : ignored_modules) {
    if (ignored.rfind("re:", 0) == 0) {
      if (std::regex_match(module, std::regex(ignored.substr(3)))) return false;
    } else if (ignored == module) {
      return false;
    }
  }
  return true;
}

std::string WeightQuantization::describe() const {
  if (!fp8()) return "none";
  return from_checkpoint ? "fp8 (e4m3 weights from the checkpoint, a scale per output row)"
                         : "fp8 (e4m3 weights quantised at load, a scale per output row)";
}

WeightQuantization resolve_weight_quantization(const ModelConfig& config, const std::string& requested) {
  const std::string model = architecture_name(config.arch);
  if (!requested.empty() && requested != "none" && requested != "fp8") {
    throw Error(fmt::format("--quantization {} is not supported (supported: fp8)", requested));
  }
  WeightQuantization q;
  std::optional<JsonKeys> qc;
  if (config.raw.is_object()) qc = JsonKeys(config.raw, "config.json").get_object("quantization_config");
  if (qc) {
    const std::string method = qc->get_string("quant_method").value_or("");
    if (method == "fp8") {
      if (qc->has_value("weight_block_size")) {
        // DeepSeek's loader dequantises block-wise FP8 at load; nobody else reads it.
        SPECULA_CHECK(config.is_deepseek(),
                      "config.json: quantization_config: block-wise FP8 (weight_block_size) is supported for "
                      "DeepSeek checkpoints only, not {}",
                      model);
        SPECULA_CHECK(requested != "fp8",
                      "--quantization fp8: {} is a block-wise FP8 checkpoint, which is dequantised at load",
                      model);
        return q;
      }
      q.ignored_modules = string_list(*qc, "ignored_layers");
      for (const std::string& m : string_list(*qc, "modules_to_not_convert")) q.ignored_modules.push_back(m);
    } else if (method == "compressed-tensors") {
      check_compressed_tensors(*qc);
      q.ignored_modules = string_list(*qc, "ignore");
    } else {
      qc->fail("quant_method", fmt::format("'{}' is not supported (supported: fp8, compressed-tensors FP8)", method));
    }
    q.method = WeightQuantization::Method::kFp8;
    q.from_checkpoint = true;
  } else if (requested == "fp8") {
    q.method = WeightQuantization::Method::kFp8;
  }
  SPECULA_CHECK(!q.fp8() || !config.is_deepseek(),
                "FP8 weights with per-tensor or per-channel scales are supported for Llama / Qwen dense models, not "
                "{}",
                model);
  return q;
}

}  // namespace specula
