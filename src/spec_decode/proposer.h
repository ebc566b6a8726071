// The Proposer interface: what drafts the next step's tokens. AdaptiveSpeculator calls propose()
// once per step with the depth it chose, after the target's forward and verification, for every
// request that step ran (ProposeBatch, engine/speculator.h); the drafts are verified by the next
// step's target forward (sampling/rejection_sampler.h).
//
// Methods: draft_model (a smaller model with its own paged KV cache), ngram (prompt lookup); MTP
// and EAGLE join through proposer_registry.h. Those read the target's final hidden states: every
// request says which rows of ProposeBatch::target_hidden_states are its own.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "engine/speculator.h"
#include "model/model.h"

namespace specula {

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view method() const = 0;

  // The paged KV cache the proposer keeps next to the target's (a draft model's layers), per
  // block of tokens; empty when it keeps none. It shares the target's block ids: the one
  // KVCacheManager allocates and frees both, so their accounting cannot diverge.
  virtual KVCacheSpec kv_cache_spec() const { return {}; }
  // Called once the engine knows how many blocks the cache has (before the first propose).
  virtual void allocate_kv_cache(int num_blocks, int block_size) {}
  // CUDA graphs of the proposer's own fixed-shape work (a draft model's decode steps), one per
  // padded batch size; called once after allocate_kv_cache and the target's graph capture, never
  // with --enforce-eager. Returns the number of graphs captured (0: none, e.g. on the CPU).
  virtual size_t capture_graphs(const std::vector<int>& batch_sizes) { return 0; }

  // drafts is resized to batch.requests.size(); drafts[i] gets at most min(depth, max_drafts)
  // tokens for requests[i] (none for requests that did not sample).
  virtual void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) = 0;
  // Where batch.may_leave_drafts_on_device let propose() leave drafts on the device
  // (kPlaceholderToken in `drafts`): where they are, and their values once they are on the host
  // (Speculator::drafts_on_device, finish_drafts). The defaults: nothing is ever left there.
  virtual bool leaves_drafts_on_device() const { return false; }
  virtual const DraftsOnDevice* drafts_on_device() const { return nullptr; }
  virtual std::vector<std::vector<int32_t>> finish_drafts() { return {}; }
  // Launch-ahead (engine/speculator.h, ProposeBatch::ahead): whether propose() can take this
  // batch before its verification reaches the host, every request drafting; then
  // settle_ahead() moves the proposer's state by what each request accepted. Default: never.
  virtual bool can_propose_ahead(const ProposeBatch& batch) const { return false; }
  virtual void settle_ahead(std::span<const int> accepted) {}
  // The request finished or was preempted: forget its state (a preempted one comes back new).
  virtual void drop_request(std::string_view req_id) {}

  // The draft distributions q the drafts were sampled from: F32 [rows, vocab] on the backend's
  // device, row draft_probs_row(id) + j for the request's draft j (kept until its next propose).
  // nullptr / -1: the drafts are deterministic (q is one-hot at the draft), as for ngram.
  virtual const Tensor* draft_probs() const { return nullptr; }
  virtual int draft_probs_row(std::string_view req_id) const { return -1; }

  // A prior for the adaptive depth's cost model before anything is measured: the cost of one
  // draft step relative to one target decode step at the same batch size.
  virtual double relative_step_cost() const = 0;
  // A prior for how the proposer's cost grows with depth: what it pays once per step whatever the
  // depth (catch-up, staging, the drafts' copy to the host), in units of one further draft; the
  // cost model's prior is draft(d) ~ d + this.
  virtual double draft_fixed_cost() const { return 0.5; }
  // True when the proposer's state can only be built from every step as it happens (MTP reads
  // the target's hidden states, which exist only in their step): a step skipped leaves it stale
  // (lower acceptance later), where a draft model simply catches up from the tokens.
  virtual bool needs_every_step() const { return false; }
  // For such a proposer: the fed steps after a stretch it did not see that bring its drafts back
  // to what feeding every step gives (the adaptive depth feeds it this long before a probe).
  // Measured (docs/PERFORMANCE.md, HiddenStateShedding): the first embedded EAGLE-3 head needed
  // 16-32 on the H100, the whole-vocabulary head ~64 (the adaptive depth feeds at most its
  // probe_interval, 32).
  virtual int steps_to_recover() const { return 32; }
  // True while request req_id's drafts come from a cache that lacks its own entries for some of
  // the last steps_to_recover() positions (steps it was not fed): their acceptance is not what
  // this proposer gives.
  virtual bool recovering(std::string_view req_id) const { return false; }
  // Positions the last propose() ran through the proposer's own catch-up (0 for proposers without
  // one). The adaptive depth learns a draft step's cost only from steps whose catch-up is the
  // steady 1 + k positions per request at most, not from ones that also ran a prompt or a
  // depth-0 stretch through the draft.
  virtual int64_t last_catch_up_tokens() const { return 0; }
};

}  // namespace specula
