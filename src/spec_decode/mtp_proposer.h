// The mtp method (alias deepseek_mtp): DeepSeek-V3's MTP layer(s) (model/deepseek_mtp.h) draft
// from the target's own final hidden states.
//
// The MTP layer at position i reads h_i (the target's hidden state) and t_{i+1}; draft 1 of a
// request with tokens t_0..t_{L-1} is its prediction at i = L - 2. Draft j > 1 chains: the layer
// min(j - 1, layers - 1) runs at position L - 3 + j on its own previous output y (in place of h)
// and draft j - 1, as vLLM does; with one layer (DeepSeek-V3, specula-tiny-moe) only the first
// draft is what it was trained for.
//
// KV cache: each MTP layer has its own latent cache on the target's blocks and block tables (the
// one KVCacheManager allocates and frees both). Its entries must come from real hidden states, and
// those exist only in the step that computed them, so propose() consumes every step, prefill
// chunks included (no logits then, only the cache), except decode steps of depth 0 (load
// shedding: the adaptive depth turned speculation off because the batch is large; the positions
// skipped then are "inherited" like a prefix-cache hit's, below):
//   - after each step the MTP cache is valid for exactly the positions whose target K/V is valid
//     (< num_target_computed): the rows of the step whose inputs the target accepted, each with
//     its next token (for a prefill chunk, the next prompt token; for the last accepted position,
//     the token just sampled);
//   - draft steps 2..k write entries at positions L - 1 .. L + k - 3 from y, not from h: they
//     never count as computed, and the next step overwrites them with the real ones (whatever was
//     accepted), so rejection needs no bookkeeping;
//   - a prefix-cache hit (also a preempted request coming back) starts at the first position the
//     target computes: the earlier hidden states were never produced for this request. The MTP
//     entries of those positions are then the ones already in the shared blocks, written by the
//     request that computed the blocks (the MTP consumed its every step). They equal this
//     request's own except at the last cached position, whose entry read the token after it in
//     THAT request. Acceptance may move by a hair there; the output cannot (verification is
//     lossless for any draft and q).
// Drafts 2..k run from static device buffers at a padded batch size (run_step), as draft_model's.
//
// CUDA graphs (capture_graphs, unless --enforce-eager): the chained steps replay a graph per MTP
// layer and padded size; so does the catch-up when it is short (steady-state decode: every piece
// spans 1..1+k positions, none at position 0), as r rows per request (r: the smallest captured
// count >= the longest piece). A piece of n < r positions runs its n real rows followed by r - n
// rows that write no K/V (slot -1) and that no real row attends to (they come after it); an MTP
// row reads h of its own position, which exists only in this step's target rows, so re-running
// earlier positions, as draft_model's catch-up graphs do, is not possible here. The graph reads the
// target's hidden rows from the static d_hidden_, gathered there from the scratch arena BEFORE the
// replay (the target's rows live at an address that differs between its eager steps and its
// graphs; the replay writes the arena from offset 0, over them). Other catch-ups (prefill chunks,
// position 0, after depth-0 steps, pieces of more than 1+k positions) run eagerly. With
// pad_batch set and no graphs (the CPU tests), short catch-ups run the same padded layout eagerly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/padded_graphs.h"
#include "model/deepseek_mtp.h"
#include "spec_decode/draft_catch_up_buffers.h"
#include "sampling/draft_sampler.h"
#include "spec_decode/draft_step_buffers.h"
#include "spec_decode/draft_step_helpers.h"
#include "spec_decode/greedy_draft_chain.h"
#include "spec_decode/proposer.h"

namespace specula {

struct MtpProposerConfig {
  int num_speculative_tokens = 1;                   // k
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;   // the largest target step (so the largest catch-up)
  int max_model_len = 2048;            // the target's (sizes the block table rows)
  double relative_step_cost = 0.1;     // an MTP step vs a target decode step (cost model prior)
  std::function<int(int)> pad_batch;   // the padded size of a draft step of n rows; identity when unset
  bool greedy_chain = true;            // chain greedy drafts on the device (greedy_draft_chain.h)
};

class MtpProposer : public Proposer {
 public:
  MtpProposer(std::unique_ptr<DeepseekMtp> mtp, Backend& backend, std::unique_ptr<DraftSampler> sampler,
              const MtpProposerConfig& config);

  std::string_view method() const override { return "mtp"; }
  bool needs_every_step() const override { return true; }
  int64_t last_catch_up_tokens() const override { return last_catch_up_tokens_; }
  KVCacheSpec kv_cache_spec() const override { return mtp_->kv_cache_spec(); }
  void allocate_kv_cache(int num_blocks, int block_size) override;
  void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override;
  void drop_request(std::string_view req_id) override;
  const Tensor* draft_probs() const override { return &q_store_; }
  int draft_probs_row(std::string_view req_id) const override;
  double relative_step_cost() const override { return config_.relative_step_cost; }

  DeepseekMtp& mtp() { return *mtp_; }
  std::vector<KVCacheLayer>& kv_cache() { return kv_; }
  // Positions whose MTP entries this request computed or took over (tests); -1 when untracked.
  int num_computed(std::string_view req_id) const;
  // Positions the request took from shared blocks without computing them (prefix-cache hits).
  int num_inherited(std::string_view req_id) const;
  int64_t num_forwards() const { return num_forwards_; }

  // One chained draft step of MTP layer `layer` over the first `padded` rows of the static step
  // buffers (propose filled them; rows past the real ones are padding: slot -1, position 0).
  // Its y replaces the step's hidden input in place, ready for the next step. Returns logits F32
  // [padded, vocab] (backend scratch).
  Tensor run_step(int padded, int layer);

  // CUDA graphs of the short catch-up (r = 1..1+k rows per request, per batch size up to
  // kMaxCatchUpGraphBatch) and of the chained draft step (run_step) per MTP layer the steps use
  // and batch size; after allocate_kv_cache.
  size_t capture_graphs(const std::vector<int>& batch_sizes) override;
  size_t num_step_graphs() const;
  int64_t num_step_graph_replays() const { return step_graph_replays_; }
  // Catch-up graphs: r = 1..1+k rows per request, batch sizes up to kMaxCatchUpGraphBatch.
  size_t num_catch_up_graphs() const;
  int64_t num_catch_up_graph_replays() const { return catch_up_graph_replays_; }
  // Catch-ups that ran the padded r-rows-per-request layout (replayed or, without graphs, eagerly).
  int64_t num_uniform_catch_ups() const { return uniform_catch_ups_; }
  // Proposals whose drafts were chained on the device (greedy chain), for tests.
  int64_t num_greedy_chains() const { return chain_.num_chains(); }
  // As the verification graphs (ModelRunner::kMaxVerifyGraphBatch) and the draft model's
  // catch-up graphs: an eager catch-up of 129..256 requests costs as much as several draft steps.
  static constexpr int kMaxCatchUpGraphBatch = 256;

 private:
  struct State {
    int slot = 0;           // its rows of q_store_
    int num_computed = 0;   // MTP entries valid for positions < this
    int num_inherited = 0;
  };
  // A request's positions [from, to) in the catch-up forward; a drafting piece's last row
  // (position L - 2) samples draft 1.
  using Piece = CatchUpPiece;

  void run_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces, const std::vector<int>& num_drafts,
                    std::vector<std::vector<int32_t>>& drafts);
  // The catch-up as r rows per request (a graph's layout, see the header); false when it must
  // run eagerly as a varlen forward.
  bool run_uniform_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                            const std::vector<int>& num_drafts, std::vector<std::vector<int32_t>>& drafts);
  // The MTP layer over the static catch-up buffers at `size` requests of `rows` rows (the graph's
  // work): logits of one row per request (catch_up_.logits_idx), and with k >= 2 the chained
  // steps' y gathered into ds_hidden_ (step_rows_). At capture every request claims the longest length.
  Tensor uniform_catch_up_forward(int size, int rows, bool for_capture);
  // The target's hidden rows target_rows_[0, t) into d_hidden_ (a cast where the dtypes differ).
  void gather_target_rows(const Tensor& target_hidden, int t);
  // Samples draft 1 of every drafting piece from row row_of(s) of `logits` (s: the piece's index).
  void sample_first_drafts(const ProposeBatch& batch, const std::vector<Piece>& pieces, const Tensor& logits,
                           const std::function<int(int)>& row_of, std::vector<std::vector<int32_t>>& drafts);
  int64_t slot_of(const ProposerRequest& r, int pos) const { return draft_kv_slot(r, pos, block_size_, "MTP K/V"); }
  int layer_for_draft(int j) const { return std::min(j - 1, mtp_->num_layers() - 1); }

  std::unique_ptr<DeepseekMtp> mtp_;
  Backend& backend_;
  std::unique_ptr<DraftSampler> sampler_;
  MtpProposerConfig config_;
  int64_t hidden_ = 0;
  int block_size_ = 0;
  int max_blocks_per_seq_ = 0;
  std::vector<KVCacheLayer> kv_;  // one per MTP layer
  Tensor q_store_;                // F32 [max_num_seqs * k, vocab]
  DraftRequestStates<State> states_;
  int64_t num_forwards_ = 0;
  std::vector<std::vector<int32_t>> contexts_;  // per request of a propose: tokens + drafts so far

  // Catch-up inputs, [max_num_batched_tokens] rows; also the static inputs of the catch-up graphs
  // (tables at full width max_blocks_per_seq_ then, logits and step rows one per request).
  DraftCatchUpBuffers catch_up_;
  StagedTensor target_rows_;  // [max_num_batched_tokens]: each catch-up row's row of the target's
  StagedTensor step_rows_;    // [max_num_seqs]: the catch-up rows whose y start the chained steps
  Tensor d_hidden_;  // [max_num_batched_tokens, H]: the target's hidden rows the catch-up reads
  DraftStepBuffers step_;  // static draft-step inputs, [max_num_seqs] rows
  Tensor ds_hidden_;  // [max_num_seqs, H]: y of the previous step (zeroed once: padding stays finite)
  // The padded size a draft step of n rows runs at: a captured graph's, else pad_batch's.
  int step_batch_size(int n) const;
  // The chained step's forward over the static buffers (y copied into ds_hidden_ inside it); at
  // capture every row claims the longest length the block table allows.
  Tensor step_forward(int padded, int layer, bool for_capture);
  std::map<int, std::unique_ptr<PaddedGraphs>> step_graphs_;  // by MTP layer
  std::map<std::pair<int, int>, Tensor> step_graph_logits_;   // by (layer, size): captured outputs
  int64_t step_graph_replays_ = 0;
  std::map<int, std::unique_ptr<PaddedGraphs>> catch_up_graphs_;  // by rows per request
  std::map<std::pair<int, int>, Tensor> catch_up_graph_logits_;   // by (rows, size): captured outputs
  int64_t catch_up_graph_replays_ = 0;
  int64_t uniform_catch_ups_ = 0;
  GreedyDraftChain chain_;  // this propose's, when on
  // Drafting requests with at least this many drafts start a chained step from their catch-up y
  // (ds_hidden_ rows, in batch order): 2, or 1 in a greedy chain, whose rows are every drafting
  // request.
  int step_row_min_drafts_ = 2;
  int64_t last_catch_up_tokens_ = 0;
};

struct ProposerContext;
// Loads the target checkpoint's MTP layers (speculative_config.h: the target must have some).
std::unique_ptr<Proposer> make_mtp_proposer(const ProposerContext& ctx);

}  // namespace specula
