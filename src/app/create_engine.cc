#include "app/create_engine.h"

#include "core/error.h"
#include "model/config.h"
#include "spec_decode/speculative_config.h"
#include "spec_decode/speculator_factory.h"

namespace specula {

std::unique_ptr<LLMEngine> create_engine(const EngineConfig& config) {
  if (config.speculative_config.empty()) return LLMEngine::create(config);
  SpeculativeConfig spec = parse_speculative_config(config.speculative_config);
  SPECULA_CHECK(!config.model.empty(), "no model given");
  // e.g. mtp on a model without MTP layers, or its num_speculative_tokens defaulted from them
  resolve_speculative_config(spec, load_model_config(config.model), config.model);
  return LLMEngine::create(config, make_speculator_factory(spec));
}

}  // namespace specula
