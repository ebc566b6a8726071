#include "spec/speculator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace specula {

namespace {

AdaptiveDepthConfig depth_config(const SpeculatorConfig& c) {
  AdaptiveDepthConfig a;
  a.max_depth = c.max_depth;
  a.adaptive = c.adaptive;
  return a;
}

}  // namespace

Speculator::Speculator(std::unique_ptr<Proposer> proposer, const SpeculatorConfig& config,
                       std::unique_ptr<StepCostModel> cost)
    : proposer_(std::move(proposer)), config_(config),
      depth_(depth_config(config),
             cost ? std::move(cost)
                  : std::make_unique<OnlineCostModel>(config.max_depth + 1,
                                                      proposer_ ? proposer_->relative_step_cost() : 0.2)) {
  SPECULA_CHECK(proposer_ != nullptr, "speculator: no proposer");
}

int Speculator::propose(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) {
  int num_decoding = 0;
  for (const ProposerRequest& r : batch.requests) num_decoding += r.sampled ? 1 : 0;
  // Only decoding requests can draft; a step of prompt chunks alone keeps the depth in force, so
  // that the draft mirrors the chunks while speculation is on and stays idle while it is off.
  batch.depth = num_decoding > 0 ? depth_.choose(num_decoding)
                                 : depth_.current(static_cast<int>(batch.requests.size()));
  const auto t0 = std::chrono::steady_clock::now();
  proposer_->propose(batch, drafts);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int drafting = 0, most = 0;
  for (const std::vector<int32_t>& d : drafts) {
    drafting += d.empty() ? 0 : 1;
    most = std::max(most, static_cast<int>(d.size()));
  }
  // A draft step's cost: the proposer's time (its catch-up included) per draft produced.
  if (drafting > 0) depth_.cost().record_draft(drafting, seconds / most);
  return batch.depth;
}

}  // namespace specula
