// A speculator whose depth changes from step to step on a schedule that the synchronous and the
// async engine both follow, as an adaptive depth's does (a probe at k, a plain probe at 0, a fall
// from 3 to 1): the n-th proposal for the m-th request seen gets kDepthSchedule[(n + 7 m) % size].
// A negative entry is that depth without a launch-ahead (the step after a probe waits for its
// verifications). Launched ahead, a step's drafts then come from a verification of another depth
// than theirs, after steps that were not launched ahead: the proposer's cache must be the
// synchronous engine's, or its greedy drafts and their counts differ.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/speculator.h"
#include "model/config.h"
#include "spec_decode/proposer.h"
#include "spec_decode/proposer_registry.h"
#include "spec_decode/speculative_config.h"

namespace specula::testing {

inline const std::vector<int> kDepthSchedule = {3, 3, 5, -3, 3, 1, 1, 4, 0, 3, -5, 2, 0, 0, 3, 3, 5, 5, 2, -1, 4};

class ScheduledSpeculator final : public Speculator {
 public:
  ScheduledSpeculator(std::unique_ptr<Proposer> proposer, int k) : proposer_(std::move(proposer)), k_(k) {}
  int num_speculative_tokens() const override { return k_; }
  bool adaptive() const override { return true; }
  std::string describe() const override { return "scheduled depth"; }
  KVCacheSpec kv_cache_spec() const override { return proposer_->kv_cache_spec(); }
  void allocate_kv_cache(int num_blocks, int block_size) override { proposer_->allocate_kv_cache(num_blocks, block_size); }
  size_t capture_graphs(const std::vector<int>& batch_sizes) override { return proposer_->capture_graphs(batch_sizes); }
  void drop_request(std::string_view req_id) override {
    proposals_.erase(std::string(req_id));
    proposer_->drop_request(req_id);
  }
  const Tensor* draft_probs() const override { return proposer_->draft_probs(); }
  int draft_probs_row(std::string_view req_id) const override { return proposer_->draft_probs_row(req_id); }
  void record_verification(std::string_view, int, int) override {}
  void record_target_step(int, int, double) override {}
  int propose(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override {
    batch.depth = std::abs(scheduled(batch));
    if (!batch.requests.empty()) ++proposal(batch.requests.front().req_id);
    proposer_->propose(batch, drafts);
    return batch.depth;
  }
  bool leaves_drafts_on_device() const override { return proposer_->leaves_drafts_on_device(); }
  const DraftsOnDevice* drafts_on_device() const override { return proposer_->drafts_on_device(); }
  std::vector<std::vector<int32_t>> finish_drafts() override { return proposer_->finish_drafts(); }
  // A verification's drafts launched ahead at a depth > 0; a plain step's catch-up at depth 0.
  int propose_ahead(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override {
    const int depth = scheduled(batch);
    if (depth < 0 || (depth == 0) != (batch.ahead->k == 0) || !proposer_->can_propose_ahead(batch)) return -1;
    return propose(batch, drafts);
  }
  void settle_ahead(std::span<const int> accepted) override { proposer_->settle_ahead(accepted); }

 private:
  int& proposal(std::string_view req_id) {
    auto [it, added] = proposals_.try_emplace(std::string(req_id), 0);
    if (added) it->second = 7 * seen_++;
    return it->second;
  }
  int scheduled(const ProposeBatch& batch) {
    if (batch.requests.empty()) return k_;
    return kDepthSchedule[static_cast<size_t>(proposal(batch.requests.front().req_id)) % kDepthSchedule.size()];
  }
  std::unique_ptr<Proposer> proposer_;
  int k_;
  std::unordered_map<std::string, int> proposals_;
  int seen_ = 0;
};

inline SpeculatorFactory scheduled_speculator(const std::string& spec_json, const std::filesystem::path& target) {
  return [=](const SpeculatorContext& engine) -> std::unique_ptr<Speculator> {
    SpeculativeConfig spec = parse_speculative_config(spec_json);
    resolve_speculative_config(spec, load_model_config(target), target.string());
    return std::make_unique<ScheduledSpeculator>(create_proposer(ProposerContext{spec, engine}), spec.num_speculative_tokens);
  };
}

}  // namespace specula::testing
