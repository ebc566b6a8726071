// A Proposer that hands everything to the registered one it wraps: the base of the tests' wrappers
// (recording proposals, shedding steps), which override propose() alone.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "spec_decode/proposer.h"

namespace specula::testing {

class ForwardingProposer : public Proposer {
 public:
  explicit ForwardingProposer(std::unique_ptr<Proposer> inner) : inner_(std::move(inner)) {}
  std::string_view method() const override { return inner_->method(); }
  KVCacheSpec kv_cache_spec() const override { return inner_->kv_cache_spec(); }
  void allocate_kv_cache(int num_blocks, int block_size) override { inner_->allocate_kv_cache(num_blocks, block_size); }
  size_t capture_graphs(const std::vector<int>& batch_sizes) override { return inner_->capture_graphs(batch_sizes); }
  void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override {
    inner_->propose(batch, drafts);
  }
  void drop_request(std::string_view id) override { inner_->drop_request(id); }
  const Tensor* draft_probs() const override { return inner_->draft_probs(); }
  int draft_probs_row(std::string_view id) const override { return inner_->draft_probs_row(id); }
  double relative_step_cost() const override { return inner_->relative_step_cost(); }
  double draft_fixed_cost() const override { return inner_->draft_fixed_cost(); }
  bool needs_every_step() const override { return inner_->needs_every_step(); }
  int64_t last_catch_up_tokens() const override { return inner_->last_catch_up_tokens(); }
  int steps_to_recover() const override { return inner_->steps_to_recover(); }
  bool recovering(std::string_view id) const override { return inner_->recovering(id); }

 protected:
  Proposer& inner() { return *inner_; }

 private:
  std::unique_ptr<Proposer> inner_;
};

}  // namespace specula::testing
