// How a model's linear layers store their weights: as the checkpoint says (config.json's
// quantization_config) and as `--quantization` asks. FP8 here means e4m3 weights with one fp32
// scale per output row, the layout of HF / AutoFP8 checkpoints (quant_method "fp8", per-tensor
// weight_scale) and of llm-compressor's (quant_method "compressed-tensors", float 8-bit weights,
// "tensor" or "channel" strategy). DeepSeek's block-wise FP8 (weight_block_size) is dequantised
// by its own loader and is not this.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace specula {

struct WeightQuantization {
  enum class Method { kNone, kFp8 };
  Method method = Method::kNone;
  // kFp8: the checkpoint holds F8_E4M3 weights with `weight_scale` beside them (false: bf16
  // weights quantised at load time).
  bool from_checkpoint = false;
  // Modules left in full precision ("model.layers.0.mlp.down_proj"; "re:<regex>" entries as
  // llm-compressor writes them).
  std::vector<std::string> ignored_modules;

  bool fp8() const { return method == Method::kFp8; }
  // Whether the module (a weight's name without ".weight") is quantised.
  bool quantizes(const std::string& module) const;
  // "fp8 (checkpoint)", "fp8 (quantised at load)" or "none".
  std::string describe() const;
};

// Resolves `requested` (--quantization: "" or "none" for what the checkpoint says, or "fp8")
// against the config. Throws specula::Error naming what is unsupported: another quant_method or
// requested method, a scheme other than 8-bit float weights per tensor or channel, block-wise FP8
// outside DeepSeek, a request that contradicts the checkpoint, FP8 for DeepSeek.
WeightQuantization resolve_weight_quantization(const ModelConfig& config, const std::string& requested);

}  // namespace specula
