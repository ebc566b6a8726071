#include "spec_decode/proposer_registry.h"

#include <map>
#include <mutex>
#include <vector>

#include <fmt/ranges.h>

#include "core/error.h"
#include "spec_decode/draft_model_proposer.h"
#include "spec_decode/eagle_proposer.h"
#include "spec_decode/mtp_proposer.h"
#include "spec_decode/ngram_proposer.h"

namespace specula {

namespace {

std::unique_ptr<Proposer> make_ngram_proposer(const ProposerContext& ctx) {
  return std::make_unique<NgramProposer>(ctx.spec.prompt_lookup_min, ctx.spec.prompt_lookup_max);
}

// The built-in methods. A new proposer adds its line here.
std::map<std::string, ProposerFactory>& registry() {
  static std::map<std::string, ProposerFactory> r = {
      {"draft_model", make_draft_model_proposer},
      {"eagle", make_eagle_proposer},
      {"eagle3", make_eagle_proposer},
      {"mtp", make_mtp_proposer},
      {"ngram", make_ngram_proposer},
  };
  return r;
}

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

void register_proposer(const std::string& method, ProposerFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[method] = std::move(factory);
}

bool has_proposer(const std::string& method) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry().count(method) > 0;
}

std::unique_ptr<Proposer> create_proposer(const ProposerContext& ctx) {
  ProposerFactory factory;
  std::vector<std::string> supported;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(ctx.spec.method);
    if (it != registry().end()) factory = it->second;
    for (const auto& entry : registry()) supported.push_back(entry.first);
  }
  SPECULA_CHECK(factory != nullptr, "--speculative-config: method {} is not yet supported by specula (supported now: {})",
                ctx.spec.method, fmt::join(supported, ", "));
  return factory(ctx);
}

}  // namespace specula
