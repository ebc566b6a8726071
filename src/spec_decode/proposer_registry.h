// Which speculative methods can run: method name -> factory. draft_model and ngram are built in;
// MTP and EAGLE proposers join by adding their factory to the built-in table in
// proposer_registry.cc (or, from a test or plugin, through register_proposer). A method that
// parses (speculative_config.h) but has no factory is answered with a clear "not yet supported".
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "engine/speculator.h"
#include "model/config.h"
#include "model/model.h"
#include "spec_decode/proposer.h"
#include "spec_decode/speculative_config.h"

namespace specula {

// Everything a factory may need: the method's config and what the engine hands a speculator (the
// target is loaded, the KV cache is not sized yet: a proposer with a cache reports its
// kv_cache_spec and gets allocate_kv_cache later).
struct ProposerContext {
  const SpeculativeConfig& spec;
  const SpeculatorContext& engine;
};

using ProposerFactory = std::function<std::unique_ptr<Proposer>(const ProposerContext&)>;

// Adds or replaces the factory for `method` (a canonical name, see SpeculativeConfig::method).
void register_proposer(const std::string& method, ProposerFactory factory);
bool has_proposer(const std::string& method);
// Throws specula::Error "not yet supported" for a method without a factory.
std::unique_ptr<Proposer> create_proposer(const ProposerContext& ctx);

}  // namespace specula
