#include "spec_decode/speculator_factory.h"

#include "core/error.h"
#include "spec_decode/adaptive_speculator.h"
#include "spec_decode/proposer_registry.h"

namespace specula {

SpeculatorFactory make_speculator_factory(const SpeculativeConfig& spec) {
  return [spec](const SpeculatorContext& engine) -> std::unique_ptr<Speculator> {
    std::unique_ptr<Proposer> proposer = create_proposer(ProposerContext{spec, engine});
    SPECULA_CHECK(spec.num_speculative_tokens >= 1, "--speculative-config: num_speculative_tokens is required for {}",
                  spec.method);
    AdaptiveSpeculatorConfig config;
    config.num_speculative_tokens = spec.num_speculative_tokens;
    config.adaptive = spec.adaptive;
    config.description = "method " + spec.method + (spec.model.empty() ? "" : " (" + spec.model + ")");
    return std::make_unique<AdaptiveSpeculator>(std::move(proposer), config);
  };
}

}  // namespace specula
