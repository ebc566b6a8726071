// The draft_model method: a smaller model with the target's vocabulary proposes k tokens per step,
// autoregressively, on the same backend. The pipeline (catch-up, draft steps, graphs, greedy
// chain, q store) is ModelProposer's; this file says what a draft model does differently.
//
// KV cache: the draft's own paged K/V tensors with the target's num_blocks and block_size, indexed
// by the SAME per-request block table (the one KVCacheManager allocates and frees both, so their
// accounting cannot diverge; KV sizing counts the draft's bytes per token). The draft keeps its own
// count of computed positions per request:
//   - every token the target has accepted is run through the draft before it drafts from it (the
//     "catch-up"; in a speculative step, prompt chunks go through the draft in the step the target
//     runs them, chunked the same way);
//   - drafting k tokens writes K/V for drafts 1..k-1 at their positions; those entries count as
//     computed only where the target accepted the same token (the draft context then matches),
//     the others are simply overwritten later, as the target's rejected entries are;
//   - a new or preempted request starts from position 0: its prefix-cache hit covers the
//     target's entries, not necessarily the draft's (a block may have been cached in a step that
//     did not run the draft), so the draft recomputes them (it is small).
// Steps with depth 0 (adaptive_depth.h) skip the draft entirely; the next drafting step catches up
// on whatever the target accepted meanwhile, in forwards of at most max_num_batched_tokens.
// Drafting needs the logits of the last token, so a drafting request runs it again when the draft
// has it already. Its model reads tokens only, so a short catch-up's graph may re-run earlier
// positions (model_proposer.h). Measured on the H100 (batch 1, specula-tiny +
// specula-tiny-draft): a draft step 229 -> 62 us in a graph, a catch-up 183 -> 63 us.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "spec_decode/model_proposer.h"

namespace specula {

struct DraftModelProposerConfig : ModelProposerConfig {
  DraftModelProposerConfig() { relative_step_cost = 0.2; }
  int draft_max_model_len = 2048;  // no draft input position at or past it
  // Run a greedy chain's drafts 2..k as one fused op where the draft model and backend have one
  // (Model::decoder_chain: one cluster kernel on CUDA); false: a draft step per draft (tests
  // compare the two).
  bool fused_chain = true;
};

class DraftModelProposer : public ModelProposer {
 public:
  DraftModelProposer(std::unique_ptr<Model> draft, Backend& backend, std::unique_ptr<DraftSampler> sampler,
                     const DraftModelProposerConfig& config);
  ~DraftModelProposer() override { release_graphs(); }  // before draft_ (a split draft's NCCL)

  std::string_view method() const override { return "draft_model"; }
  KVCacheSpec kv_cache_spec() const override { return draft_->kv_cache_spec(); }
  double draft_fixed_cost() const override;

  Model& model() { return *draft_; }

 private:
  struct DraftState : RequestState {
    int drafted_from = 0;         // position of drafts[0] at the last proposal
    std::vector<int32_t> drafts;  // the last proposal; K/V written for all but the last
  };

  void plan_catch_up(const ProposeBatch& batch, std::vector<int>& num_drafts, std::vector<Piece>& pieces) override;
  void finish_propose(const ProposeBatch& batch, const std::vector<std::vector<int32_t>>& drafts) override;
  void drafts_arrived(RequestState& st, const std::vector<int32_t>& drafts) override {
    static_cast<DraftState&>(st).drafts = drafts;
  }
  bool ahead_fits(const ProposerRequest& r, int k) const override;
  void shift_state(RequestState& st, int accepted) override;
  DraftForwardOutput draft_forward(DraftForwardInput& in) override;
  int longest_sequence() const override;
  std::unique_ptr<RequestState> new_request_state() const override { return std::make_unique<DraftState>(); }
  DraftChain::FusedChain fused_chain() override;
  std::unique_ptr<DeviceGraph> record_graph(const std::function<void()>& work) override {
    return draft_->capture_graph(backend_, work);
  }

  // The last proposal's drafts whose K/V the target's acceptance made the draft's real K/V.
  void confirm_accepted_drafts(DraftState& st, const ProposerRequest& r) const;

  std::unique_ptr<Model> draft_;
  DraftModelProposerConfig draft_config_;
  std::vector<int> target_;  // this propose's: each request's catch-up goal (positions < this)
};

// Loads the draft checkpoint named by the speculative config (weights on `backend`), after
// checking it against the target (speculative_config.h: validate_draft_model).
struct ProposerContext;
std::unique_ptr<Proposer> make_draft_model_proposer(const ProposerContext& ctx);

}  // namespace specula
