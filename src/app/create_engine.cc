#include "app/create_engine.h"

#include "app/model_path.h"
#include "core/error.h"
#include "model/config.h"
#include "spec_decode/speculative_config.h"
#include "spec_decode/speculator_factory.h"

namespace specula {

std::unique_ptr<LLMEngine> create_engine(const EngineConfig& given) {
  EngineConfig config = given;
  config.model = resolve_model_path(given.model);
  config.tokenizer = resolve_model_path(given.tokenizer);
  if (config.speculative_config.empty()) return LLMEngine::create(config);
  SpeculativeConfig spec = parse_speculative_config(config.speculative_config);
  SPECULA_CHECK(!config.model.empty(), "no model given");
  spec.model = resolve_model_path(spec.model);
  // e.g. mtp on a model without MTP layers, or its num_speculative_tokens defaulted from them
  resolve_speculative_config(spec, load_model_config(config.model), config.model);
  return LLMEngine::create(config, make_speculator_factory(spec));
}

}  // namespace specula
