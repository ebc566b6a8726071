// Where an engine is assembled from its command-line config. The engine knows speculative
// decoding only as the Speculator interface; here --speculative-config is parsed (before any
// weight loads, so that a typo fails at once), checked against the target's config.json, and
// turned into the factory LLMEngine::create takes. Model arguments (the target, the tokenizer, a
// draft model) may be Hub ids in the local cache (model_path.h).
#pragma once

#include <memory>

#include "engine/llm_engine.h"

namespace specula {

std::unique_ptr<LLMEngine> create_engine(const EngineConfig& config);

}  // namespace specula
