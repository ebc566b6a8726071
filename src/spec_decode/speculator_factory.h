// --speculative-config as the engine takes it: a SpeculatorFactory that builds the method's
// proposer (proposer_registry.h) and wraps it in an AdaptiveSpeculator.
#pragma once

#include "engine/speculator.h"
#include "spec_decode/speculative_config.h"

namespace specula {

// `spec` parsed and resolved against the target (resolve_speculative_config).
SpeculatorFactory make_speculator_factory(const SpeculativeConfig& spec);

}  // namespace specula
