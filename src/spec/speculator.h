// The speculative-decoding side of one engine: a proposer, the adaptive depth and its cost model.
// The model runner drives it each step:
//   1. verification results (record_verification, per request with drafts) and the wall time of
//      the target forward with its sampling (record_target_step);
//   2. propose(): picks this step's depth and runs the proposer, timing it for the cost model.
// The drafts go back through ModelRunnerOutput to Scheduler::set_draft_tokens.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "spec/adaptive_depth.h"
#include "spec/proposer.h"
#include "spec/step_cost_model.h"

namespace specula {

struct SpeculatorConfig {
  int max_depth = 1;      // k (num_speculative_tokens)
  bool adaptive = true;   // false: always k
};

class Speculator {
 public:
  // cost: the cost model (an OnlineCostModel seeded with the proposer's relative cost when null).
  Speculator(std::unique_ptr<Proposer> proposer, const SpeculatorConfig& config,
             std::unique_ptr<StepCostModel> cost = nullptr);
  // With SPECULA_PROFILE=1, prints what the adaptive depth learned (step costs, acceptance, the
  // depth it would choose) for a few batch sizes to stderr.
  ~Speculator();

  Proposer& proposer() { return *proposer_; }
  AdaptiveDepth& depth() { return depth_; }
  int max_depth() const { return config_.max_depth; }
  bool adaptive() const { return config_.adaptive; }

  void drop_request(std::string_view req_id) { proposer_->drop_request(req_id); }
  const Tensor* draft_probs() const { return proposer_->draft_probs(); }
  int draft_probs_row(std::string_view req_id) const { return proposer_->draft_probs_row(req_id); }

  void record_verification(int num_drafts, int num_accepted) { depth_.record_verification(num_drafts, num_accepted); }
  // A step in which every scheduled request decoded with `rows` query rows (1 + drafts).
  void record_target_step(int num_seqs, int rows, double seconds) { depth_.cost().record_target(num_seqs, rows, seconds); }

  // Chooses the depth for the requests of `batch` (setting batch.depth), runs the proposer and
  // returns the depth; drafts[i] are the drafts of batch.requests[i].
  int propose(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts);

  static constexpr int kProbeRequests = 4;  // requests that draft in a probe from depth 0

 private:
  std::unique_ptr<Proposer> proposer_;
  SpeculatorConfig config_;
  AdaptiveDepth depth_;
};

}  // namespace specula
