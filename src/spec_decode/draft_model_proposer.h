// The draft_model method: a smaller model with the target's vocabulary proposes k tokens per step,
// autoregressively, on the same backend.
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
//
// Per step: one varlen forward (catch-up + the first draft, chunked if needed), then k-1 decode
// steps over the drafting requests. Those run from static device buffers at a padded batch size (draft_step_buffers.h;
// run_step reads nothing else), which is what a CUDA graph needs.
// Greedy chain (greedy_draft_chain.h): when every drafting request drafts the plain argmax, the
// first drafts and drafts 2..k are argmax'd on the device and come to the host in one copy at the
// end; other batches take the per-step path through the draft sampler.
// CUDA graphs (capture_graphs, unless --enforce-eager): the draft steps replay a graph per padded
// size; so does the catch-up forward when every piece is short (steady state: 1 or 2 tokens per
// request, run as r rows each by re-running earlier positions, see run_catch_up_graph); other
// catch-ups (prefill, after depth-0 steps) run eagerly. Measured on the H100 (batch 1,
// specula-tiny + specula-tiny-draft): a draft step 229 -> 62 us, a catch-up 183 -> 63 us.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/padded_graphs.h"
#include "model/model.h"
#include "spec_decode/draft_catch_up_buffers.h"
#include "sampling/draft_sampler.h"
#include "spec_decode/draft_step_buffers.h"
#include "spec_decode/draft_step_helpers.h"
#include "spec_decode/greedy_draft_chain.h"
#include "spec_decode/proposer.h"

namespace specula {

struct DraftModelProposerConfig {
  int num_speculative_tokens = 1;               // k: drafts per request per step at most
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;  // the largest catch-up forward
  int max_model_len = 2048;        // the target's (sizes the block table rows)
  int draft_max_model_len = 2048;  // no draft input position at or past it
  double relative_step_cost = 0.2; // a draft step vs a target decode step (the cost model's prior)
  // The padded batch size a draft step of n rows runs at (n <= max_num_seqs): a CUDA graph's
  // capture sizes. Identity when unset.
  std::function<int(int)> pad_batch;
  // Chain greedy drafts on the device (see the header comment); false: every draft through the
  // draft sampler (tests compare the two).
  bool greedy_chain = true;
  // Run a greedy chain's drafts 2..k as one fused op where the draft model and backend have one
  // (Model::greedy_chain: one cluster kernel on CUDA); false: a draft step per draft (tests
  // compare the two).
  bool fused_chain = true;
};

class DraftModelProposer : public Proposer {
 public:
  DraftModelProposer(std::unique_ptr<Model> draft, Backend& backend, std::unique_ptr<DraftSampler> sampler,
                     const DraftModelProposerConfig& config);

  std::string_view method() const override { return "draft_model"; }
  KVCacheSpec kv_cache_spec() const override { return draft_->kv_cache_spec(); }
  void allocate_kv_cache(int num_blocks, int block_size) override;
  void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override;
  void drop_request(std::string_view req_id) override;
  const Tensor* draft_probs() const override { return &q_store_; }
  int draft_probs_row(std::string_view req_id) const override;
  double relative_step_cost() const override { return config_.relative_step_cost; }
  double draft_fixed_cost() const override;
  int64_t last_catch_up_tokens() const override { return last_catch_up_tokens_; }

  Model& model() { return *draft_; }
  std::vector<KVCacheLayer>& kv_cache() { return kv_; }
  // Positions of the request whose draft K/V is known to be valid (tests); -1 when untracked.
  int num_computed(std::string_view req_id) const;
  // Forwards run so far (catch-up forwards and draft steps), for tests and the cost model.
  int64_t num_forwards() const { return num_forwards_; }

  // One autoregressive draft step over the first `padded` rows of the static step buffers, which
  // propose filled (rows past the real ones are padding: slot -1, attending to position 0):
  // the replay of its captured graph when there is one for `padded`, else an eager forward.
  // Returns logits F32 [padded, vocab] (backend scratch).
  Tensor run_step(int padded);

  // CUDA graphs of the draft step (run_step) for each batch size; after allocate_kv_cache.
  size_t capture_graphs(const std::vector<int>& batch_sizes) override;
  size_t num_step_graphs() const { return step_graphs_ ? step_graphs_->size() : 0; }
  int64_t num_step_graph_replays() const { return step_graph_replays_; }
  // Proposals whose drafts were chained on the device (greedy chain), for tests.
  int64_t num_greedy_chains() const { return chain_.num_chains(); }
  int64_t num_fused_chains() const { return chain_.num_fused_chains(); }
  int64_t num_multi_step_chains() const { return chain_.num_multi_step_chains(); }
  size_t num_catch_up_graphs() const;
  int64_t num_catch_up_graph_replays() const { return catch_up_graph_replays_; }
  // Catch-up graphs are captured for forwards of 1..kCatchUpGraphRows rows per request: in steady
  // state a drafting request catches up one token (some drafts rejected) or two (all accepted:
  // the last draft and the bonus token).
  static constexpr int kCatchUpGraphRows = 2;
  // As the verification graphs (ModelRunner::kMaxVerifyGraphBatch): an eager catch-up of 256
  // requests cost the embedded draft ~1.4 ms on the H100, ten times a draft step, so drafting
  // never paid there.
  static constexpr int kMaxCatchUpGraphBatch = 256;

 private:
  struct State {
    int slot = 0;              // row block of q_store_ and of nothing else
    int num_computed = 0;      // draft K/V valid for positions < this
    int drafted_from = 0;      // position of drafts[0] at the last proposal
    std::vector<int32_t> drafts;  // the last proposal; K/V written for all but the last
  };
  using Piece = CatchUpPiece;

  void confirm_accepted_drafts(State& st, const ProposerRequest& r) const;
  // Runs pieces through one varlen forward and samples the first draft of those that draft.
  void run_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces, std::vector<std::vector<int32_t>>& drafts);
  int64_t slot_of(const ProposerRequest& r, int pos) const { return draft_kv_slot(r, pos, block_size_, "draft K/V"); }

  std::unique_ptr<Model> draft_;
  Backend& backend_;
  std::unique_ptr<DraftSampler> sampler_;
  DraftModelProposerConfig config_;
  int block_size_ = 0;
  int max_blocks_per_seq_ = 0;
  std::vector<KVCacheLayer> kv_;
  Tensor q_store_;  // F32 [max_num_seqs * num_speculative_tokens, vocab]: q of each slot's drafts
  DraftRequestStates<State> states_;
  int64_t num_forwards_ = 0;
  // Scratch for drafting rows' context (prompt, output + drafts so far) during one propose.
  std::vector<std::vector<int32_t>> contexts_;

  DraftCatchUpBuffers catch_up_;  // catch-up forward inputs, sized for max_num_batched_tokens
  DraftStepBuffers step_;          // static draft-step inputs, [max_num_seqs] rows
  // The padded size a draft step of n rows runs at: a captured graph's, else pad_batch's.
  int step_batch_size(int n) const;
  // The draft step's forward over the static buffers; at capture every row claims the longest
  // length the draft allows.
  Tensor step_forward(int padded, bool for_capture);
  // Catch-up forwards as graphs: when every piece is short, each runs the last r positions of
  // its range (run_catch_up_graph); false when the forward must run eagerly.
  bool run_catch_up_graph(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                          std::vector<std::vector<int32_t>>& drafts);
  ForwardInput catch_up_graph_input(int size, int rows);
  GreedyDraftChain chain_;  // this propose's, when on
  int64_t last_catch_up_tokens_ = 0;
  // Samples the first draft of every drafting piece; piece s's row of `logits` is row_of(s).
  // In a greedy chain: their argmax, into the chain's first-draft row, on the device.
  void sample_first_drafts(const ProposeBatch& batch, const std::vector<Piece>& pieces, const Tensor& logits,
                           const std::function<int(int)>& row_of, std::vector<std::vector<int32_t>>& drafts);
  std::map<int, std::unique_ptr<PaddedGraphs>> catch_up_graphs_;  // by rows per request
  std::map<std::pair<int, int>, Tensor> catch_up_graph_logits_;   // by (rows, size)
  Tensor dc_logits_idx_;  // I32 0, 1, 2, ...: every row of a catch-up graph is a logits row
  int64_t catch_up_graph_replays_ = 0;
  std::unique_ptr<PaddedGraphs> step_graphs_;
  std::map<int, Tensor> step_graph_logits_;  // the captured outputs (keep their arena chunk alive)
  int64_t step_graph_replays_ = 0;
};

// Loads the draft checkpoint named by the speculative config (weights on `backend`), after
// checking it against the target (speculative_config.h: validate_draft_model).
struct ProposerContext;
std::unique_ptr<Proposer> make_draft_model_proposer(const ProposerContext& ctx);

}  // namespace specula
