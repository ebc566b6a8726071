// create_model: the one place that maps a config's architecture to its forward implementation.
#include "model/deepseek.h"
#include "model/llama.h"
#include "model/model.h"
#include "model/tensor_parallel_model.h"
#include "model/tensor_parallel_plan.h"
#include "model/weight_quantization.h"

namespace specula {

std::unique_ptr<Model> create_model(const ModelConfig& config, WeightSource& weights, Backend& backend) {
  return create_model(config, weights, backend, ModelOptions{});
}

std::unique_ptr<Model> create_model(const ModelConfig& config, WeightSource& weights, Backend& backend,
                                    const ModelOptions& options) {
  check_tensor_parallel(config, options.tensor_parallel_size);
  if (options.tensor_parallel_size > 1) {
    if (config.is_deepseek()) resolve_weight_quantization(config, options.quantization);  // what DeepSeek cannot load
    return create_tensor_parallel_model(config, weights, backend, options);
  }
  switch (config.arch) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      return create_llama_model(config, weights, backend, resolve_weight_quantization(config, options.quantization));
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3:
      resolve_weight_quantization(config, options.quantization);  // throws for what DeepSeek cannot load
      return create_deepseek_model(config, weights, backend, options);
  }
  throw Error(fmt::format("{}: this architecture's forward is not implemented yet", architecture_name(config.arch)));
}

}  // namespace specula
