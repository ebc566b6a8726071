// ModelProposer: what every proposer that runs a model of its own to draft shares, so that each
// method's file says only what differs. draft_model (a smaller LM over its own positions) and mtp
// (DeepSeek's MTP layers over the target's hidden states) derive from it; an EAGLE head (one
// layer over the target's hidden states) fits the second shape.
//
// Per step (propose):
//   1. plan_catch_up (the method's): per request, the positions to run through the proposer's own
//      cache ("catch-up" pieces) and the drafts wanted; a drafting piece's last row reads the last
//      known token, and its logits give draft 1;
//   2. catch-up forwards, chunked to max_num_batched_tokens and max_num_seqs: varlen, or, when
//      every piece is short, in the uniform layout of a catch-up CUDA graph (below);
//   3. drafts 2..k: one decode row per drafting request per draft, from static buffers at a padded
//      batch size (draft_step_buffers.h), replayed as a CUDA graph per padded size and step
//      variant (MTP: per layer). In a greedy chain (draft_chain.h) every draft stays on
//      the device until the end; otherwise each step's logits go through the DraftSampler, which
//      keeps q per request slot in the q store (draft_probs) for lossless verification. A request
//      with a grammar (structured outputs) drafts this way, each draft under the grammar's mask
//      after the drafts before it, so that it proposes what the masked target may accept.
//
// What a row reads is fixed by target_hidden_size at construction:
//   - 0, tokens only (draft_model): the row of position p reads token p. A short catch-up's graph
//     runs r rows per request that END at its last position, re-running earlier ones (their K/V
//     is rewritten with the same tokens at the same positions), so every row is real; r is
//     1..kCatchUpGraphRows, and every row is a logits row;
//   - > 0, the target's hidden states (MTP, EAGLE): the row of position p reads the target's final
//     hidden state of p and token p + 1. Those states exist only in the step that computed them,
//     so such a proposer consumes every step (needs_every_step), copies the rows it needs out of
//     the target's scratch before running (target_hidden_), and a short catch-up runs r rows per
//     request that START at its first new position, the rows past its last one writing no K/V
//     (no real row attends to them), r = 1..1+k. Draft steps read the previous step's output
//     hidden state instead (chained_hidden_); the catch-up gathers the rows that start them.
//     With pad_batch and no graphs (the CPU tests) this padded layout also runs eagerly.
//
// Graph safety: a replay reads only static buffers (the catch-up and step inputs, target_hidden_,
// chained_hidden_, the q store) and the proposer's cache, and writes its logits at scratch-arena
// addresses fixed at capture. Nothing else in the arena is read after a replay: the target's
// logits were verified before propose, its hidden rows are gathered into target_hidden_ before
// the catch-up, and each forward's logits are sampled (into the q store and host tokens, or the
// chain's persistent buffer) before the next forward is prepared.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/padded_graphs.h"
#include "core/string_view_hash.h"
#include "model/model.h"
#include "sampling/draft_sampler.h"
#include "spec_decode/draft_step_buffers.h"
#include "spec_decode/draft_chain.h"
#include "spec_decode/proposer.h"
#include "spec_decode/staged_tensor.h"

namespace specula {

struct ModelProposerConfig {
  int num_speculative_tokens = 1;     // k: drafts per request per step at most
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;  // the largest catch-up forward
  int max_model_len = 2048;           // the target's (sizes the block table rows)
  double relative_step_cost = 0.2;    // a draft step vs a target decode step (the cost model's prior)
  // The padded batch size a draft step of n rows runs at (n <= max_num_seqs): a CUDA graph's
  // capture sizes. Identity when unset.
  std::function<int(int)> pad_batch;
  // Chain drafts on the device (draft_chain.h); false: every draft through the draft sampler
  // step by step (tests compare the two).
  bool chain_drafts = true;
  // Chain sampled drafts too (DraftChain::Kind::kSampled); false: only argmax ones
  // (SPECULA_SAMPLED_DRAFT_CHAIN=0 or =1 sets it, for A/B runs). On at pinned and adaptive depths:
  // the step-by-step path made a speculative step dearer than a pinned one, so that at 64 requests
  // and temperature 1 the adaptive depth stayed off where pinned k = 3 paid (docs/PERFORMANCE.md).
  bool chain_sampled_drafts = true;
  // Every request drafts the argmax of the proposer's logits, also when it samples (vLLM's way):
  // its drafts are then deterministic (q one-hot: accepted with probability p(draft)) and chain
  // on the device as greedy ones do; false: a sampling request's drafts are drawn from its own
  // distribution q (higher acceptance, a host round trip per draft).
  bool argmax_drafts = false;
};

class ModelProposer : public Proposer {
 public:
  void allocate_kv_cache(int num_blocks, int block_size) override;
  // Catch-up graphs (r rows per request, batch sizes up to kMaxCatchUpGraphBatch) and draft-step
  // graphs (per step variant and batch size); after allocate_kv_cache.
  size_t capture_graphs(const std::vector<int>& batch_sizes) override;
  // A chain leaves its drafts on the device where batch.may_leave_drafts_on_device.
  void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override;
  bool leaves_drafts_on_device() const override { return config_.chain_drafts; }
  const DraftsOnDevice* drafts_on_device() const override { return chain_.pending() ? &on_device_ : nullptr; }
  std::vector<std::vector<int32_t>> finish_drafts() override;
  // Launch-ahead (README.md): a proposer whose every request drafts a greedy chain from a steady
  // state (its cache one position short of the verification's first; a hidden-state proposer's
  // two short, since its row p reads token p + 1).
  bool can_propose_ahead(const ProposeBatch& batch) const override;
  void settle_ahead(std::span<const int> accepted) override;
  void drop_request(std::string_view req_id) override;
  const Tensor* draft_probs() const override { return &q_store_; }
  int draft_probs_row(std::string_view req_id) const override;
  double relative_step_cost() const override { return config_.relative_step_cost; }
  bool needs_every_step() const override { return reads_target_hidden(); }
  int64_t last_catch_up_tokens() const override { return last_catch_up_tokens_; }
  // A hidden-state proposer's request whose last shed positions (RequestState::stale) end fewer
  // than steps_to_recover() positions before what its cache holds.
  bool recovering(std::string_view req_id) const override;

  std::vector<KVCacheLayer>& kv_cache() { return kv_; }
  // Positions whose entries in the proposer's cache the request computed or took over (tests);
  // -1 when untracked.
  int num_computed(std::string_view req_id) const;
  // Positions a hidden-state proposer's request inherited (RequestState::num_inherited); -1 when untracked.
  int num_inherited(std::string_view req_id) const;
  // Forwards run so far (catch-up forwards and draft steps), for tests and the cost model.
  int64_t num_forwards() const { return num_forwards_; }
  size_t num_step_graphs() const;
  int64_t num_step_graph_replays() const { return step_graph_replays_; }
  size_t num_catch_up_graphs() const;
  int64_t num_catch_up_graph_replays() const { return catch_up_graph_replays_; }
  // Catch-ups that ran the uniform r-rows-per-request layout (replayed or, without graphs, eagerly).
  int64_t num_uniform_catch_ups() const { return uniform_catch_ups_; }
  // Proposals whose drafts were chained on the device (argmax, sampled chains), for tests.
  int64_t num_greedy_chains() const { return chain_.num_chains() - chain_.num_sampled_chains(); }
  int64_t num_sampled_chains() const { return chain_.num_sampled_chains(); }
  int64_t num_fused_chains() const { return chain_.num_fused_chains(); }
  int64_t num_multi_step_chains() const { return chain_.num_multi_step_chains(); }

  // Rows per request of a tokens-only proposer's catch-up graphs, 1..this: in steady state a
  // drafting request catches up one token (some drafts rejected) or two (all accepted: the last
  // draft and the bonus token).
  static constexpr int kCatchUpGraphRows = 2;
  // As the verification graphs (ModelRunner::kMaxVerifyGraphBatch): an eager catch-up of 256
  // requests cost the embedded draft ~1.4 ms on the H100, ten times a draft step.
  static constexpr int kMaxCatchUpGraphBatch = 256;

 protected:
  // target_hidden_size: the width of the target's hidden states each row reads (MTP, EAGLE), 0
  // for a model that drafts from tokens alone (see the header); chained_hidden_size: the width of
  // the proposer's own output hidden state that chained draft steps read (0: target_hidden_size;
  // an EAGLE-3 head reads 3 target layers' features but chains its own hidden state). A null
  // sampler is the CPU one.
  ModelProposer(Backend& backend, std::unique_ptr<DraftSampler> sampler, const ModelProposerConfig& config,
                int64_t vocab_size, int64_t target_hidden_size, int64_t chained_hidden_size = 0);

  // What the proposer keeps per request; a method extends it (new_request_state).
  struct RequestState {
    virtual ~RequestState() = default;
    int slot = 0;          // its k rows of the q store
    int num_computed = 0;  // the proposer's cache is valid for positions < this
    // Hidden-state proposers: positions the request took from shared blocks without computing them
    // (prefix-cache hits, depth-0 steps shed under load).
    int num_inherited = 0;
    // The shed ones, as position ranges (ascending, disjoint): their entries are another request's,
    // so its rows do not attend to the blocks wholly inside them (AttendedBlocks).
    std::vector<std::pair<int, int>> stale;
    bool deterministic_drafts = false;  // its last drafts were argmax'd (no q rows to verify against)
  };
  // A run of one request's positions [from, to) through a catch-up forward.
  struct Piece {
    size_t req = 0;       // index into the batch
    int from = 0, to = 0;
    bool drafts = false;  // its last row samples draft 1
  };
  // One forward of the proposer's model: catch-up rows or a draft step.
  struct DraftForwardInput {
    ForwardInput rows;
    Tensor hidden;   // the rows read: [rows, target_hidden_size] for catch-ups, [rows, chained_hidden_size]
                     // for draft steps (undefined for tokens only)
    bool from_target = true;  // catch-up rows (the target's hidden states); false: a chained draft step
    int variant = 0; // a draft step's step_variant; 0 for catch-ups
    std::vector<int32_t> position_zero_rows;  // rows at position 0 (varlen catch-ups only)
  };
  struct DraftForwardOutput {
    Tensor logits;  // F32 [logits rows, vocab]
    Tensor hidden;  // the rows' output hidden states, for the chained steps (hidden-state proposers)
  };

  // --- What a method says (the hooks) ---
  // Per request of the batch: the catch-up pieces (at most one per request, in batch order) and
  // num_drafts[i] (0..min(depth, max_drafts)). A drafting request's piece ends at the position
  // whose row reads its last token. Called with depth 0 only where needs_every_step(). The
  // default is the hidden-state proposers' (MTP, EAGLE): every position the target computed in the
  // step whose next token is known, each exactly once; earlier positions the request never ran
  // are inherited: a prefix-cache hit's from the request that computed the same tokens; a shed
  // step's entries are some other request's (RequestState::stale), which its rows then do not
  // attend to where they fill whole blocks. Either way only acceptance can differ, never the output.
  virtual void plan_catch_up(const ProposeBatch& batch, std::vector<int>& num_drafts, std::vector<Piece>& pieces);
  // The target's rows a hidden-state proposer reads (ProposeBatch::target_hidden_states, or the
  // aux layers' features for EAGLE-3).
  virtual const Tensor& target_features(const ProposeBatch& batch) const { return batch.target_hidden_states; }
  // After the drafts are made (bookkeeping that needs them; a draft left on the device is
  // kPlaceholderToken here, and its value reaches drafts_arrived).
  virtual void finish_propose(const ProposeBatch& batch, const std::vector<std::vector<int32_t>>& drafts) {}
  // The values of a request's drafts that propose() left on the device, once on the host (never
  // for a request dropped meanwhile).
  virtual void drafts_arrived(RequestState& st, const std::vector<int32_t>& drafts) {}
  // Launch-ahead: whether the method can draft for `r` whatever it accepts of its k drafts, and
  // its state moved on by the `accepted` drafts once known (propose() set it as if none were).
  virtual bool ahead_fits(const ProposerRequest& r, int k) const { return true; }
  virtual void shift_state(RequestState& st, int accepted) { st.num_computed += accepted; }
  // The model's forward over `in` (also run under graph capture: device work only).
  virtual DraftForwardOutput draft_forward(DraftForwardInput& in) = 0;
  // The weights draft j's step runs (graphs are kept per variant); MTP: its layer.
  virtual int step_variant(int draft) const { return 0; }
  // The longest sequence a forward can see (launch shapes of graph captures).
  virtual int longest_sequence() const { return max_blocks_per_seq_ * block_size_; }
  virtual std::unique_ptr<RequestState> new_request_state() const { return std::make_unique<RequestState>(); }
  // Drafts 2..k of a chain (argmax, or sampled rows that draw from a temperature alone) as one op,
  // where the model has one (Model::decoder_chain); empty when none.
  virtual DraftChain::FusedChain fused_chain() { return nullptr; }
  // Records one catch-up or draft step (`work`) as a graph; a proposer whose model spans several
  // devices records through it (Model::capture_graph). Default: the backend's capture.
  virtual std::unique_ptr<DeviceGraph> record_graph(const std::function<void()>& work) {
    return backend_.capture_graph(work);
  }
  // Drops every graph: a subclass whose model goes before this base calls it first (NCCL waits
  // in ncclCommDestroy for the graphs that captured its collectives, for ever).
  void release_graphs() {
    catch_up_graphs_.clear();
    catch_up_graph_logits_.clear();
    step_graphs_.clear();
    step_graph_logits_.clear();
  }

  // --- For the methods ---
  bool reads_target_hidden() const { return target_hidden_size_ > 0; }
  // A catch-up row at position p reads token p + this (the next token for a hidden-state head).
  int token_offset() const { return reads_target_hidden() ? 1 : 0; }
  // The request's state, added (with a free q-store slot) when new.
  RequestState& state(std::string_view req_id);
  template <class State>
  State& state_as(std::string_view req_id) {
    return static_cast<State&>(state(req_id));
  }
  const RequestState* find_state(std::string_view req_id) const;
  // A hidden-state proposer's chained hidden input of a chain's `rows` rows (the catch-up's
  // drafting rows' outputs once it ran): what draft 2's step reads.
  Tensor chained_hidden(int rows) const { return chained_hidden_.slice(0, rows); }

  Backend& backend_;
  ModelProposerConfig config_;
  int block_size_ = 0;
  int max_blocks_per_seq_ = 0;
  std::vector<KVCacheLayer> kv_;  // the proposer's cache on the target's blocks (one per spec layer)

 private:
  // The catch-up forward's inputs: [max_num_batched_tokens] rows of [max_num_seqs] sequences,
  // varlen (each piece's positions back to back, tables as wide as the widest piece) or uniform
  // (`rows` rows per request at a padded size, tables at full width: a catch-up graph reads these).
  struct CatchUpInputs {
    StagedTensor tokens, positions, slots, qsl, seq_lens, tables, logits_idx;
    void allocate(Backend& backend, int max_tokens, int max_num_seqs, int max_blocks_per_seq);
  };

  // Launch-ahead: every request's two-row piece as the uniform layout, moved on the device by what
  // it accepted, through one catch-up forward; samples the first drafts.
  void run_ahead_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                          std::vector<std::vector<int32_t>>& drafts);
  // A hidden-state proposer's launch-ahead: the verification's k + 1 rows of every request, the
  // first draft and the chain's start moved on the device to the last accepted one.
  void run_ahead_hidden_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                 std::vector<std::vector<int32_t>>& drafts);
  // Rows per request of a launch-ahead's catch-up (0 without one), and the padded size a
  // hidden-state one of n requests runs at: its graph's, else (no graphs) n or pad_batch's; 0
  // where none fits the catch-up buffers.
  int ahead_catch_up_rows(const ProposeBatch& batch) const;
  int ahead_catch_up_size(int n, int rows) const;
  // Stages `pieces` as the uniform layout of `rows` rows a request at `size` requests and uploads
  // it (waiting first for the last staging's uploads). The rows_past_last rows after a piece's
  // last one are staged as real (slots, hidden rows) with token 0, for a launch-ahead to fill.
  void stage_uniform_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces, int rows, int size,
                              int rows_past_last = 0);
  // Runs pieces through one catch-up forward and samples the first draft of those that draft.
  void run_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                    std::vector<std::vector<int32_t>>& drafts);
  void run_varlen_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                           std::vector<std::vector<int32_t>>& drafts);
  // The uniform layout (see the header); false when the catch-up must run varlen.
  bool run_uniform_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                            std::vector<std::vector<int32_t>>& drafts);
  // The uniform layout's forward over the catch-up inputs at `size` requests of `rows` rows (a
  // catch-up graph's work); at capture every request claims longest_sequence(), otherwise its
  // staged length plus lens_slack (a launch-ahead's inputs, moved on the device).
  Tensor uniform_catch_up_forward(int size, int rows, bool for_capture, int lens_slack = 0);
  // That forward as its graph's replay where `graphs` has one, else eagerly; its logits.
  Tensor run_uniform_catch_up_forward(PaddedGraphs* graphs, int size, int rows, int lens_slack = 0);
  // Uploads an all-padding uniform batch of `most` requests for a capture: `rows` tokens 0 at
  // positions 0..rows-1, slot -1, length rows, block 0 (the runner's padding).
  void stage_catch_up_capture(int most, int rows);
  // The target's hidden rows `rows` (target_rows_ uploaded) into target_hidden_ (a cast where
  // dtypes differ).
  void gather_target_rows(const Tensor& target_hidden, const Tensor& rows);
  // Samples draft 1 of every drafting piece from row row_of(s) of `logits` (s: the piece's
  // index); in a greedy chain their argmax, on the device, as the chain's next first drafts.
  void sample_first_drafts(const ProposeBatch& batch, const std::vector<Piece>& pieces, const Tensor& logits,
                           const std::function<int(int)>& row_of, std::vector<std::vector<int32_t>>& drafts);
  // Drafts 2..max_drafts through the draft sampler, one padded step each over `rows`.
  // Structured outputs: what request i's grammar allows after this step's accepted tokens and
  // `drafts_so_far` (empty without a grammar); the matcher is left as it was.
  std::span<const uint32_t> draft_grammar_mask(const ProposerRequest& r, size_t i, std::span<const int32_t> drafts_so_far);
  void run_draft_steps(const ProposeBatch& batch, const std::vector<size_t>& rows, int max_drafts,
                       std::vector<std::vector<int32_t>>& drafts);
  // The padded size a draft step of n rows runs at: a captured graph's, else pad_batch's.
  int step_batch_size(int n) const;
  // A draft step over the first `padded` rows of the static step buffers: its graph's replay, or
  // the eager step_forward. Returns logits F32 [padded, vocab] (backend scratch).
  Tensor run_step(int padded, int variant);
  // The step's forward; a hidden-state proposer's output replaces chained_hidden_ in place.
  Tensor step_forward(int padded, int variant, bool for_capture);
  // attended_ for this propose's batch.
  void plan_attended_blocks(const ProposeBatch& batch);
  int64_t slot_of(const ProposerRequest& r, int pos) const {
    return draft_kv_slot(r, pos, block_size_, kv_cache_name_);
  }

  std::unique_ptr<DraftSampler> sampler_;
  int64_t target_hidden_size_ = 0;
  int64_t chained_hidden_size_ = 0;
  std::string kv_cache_name_;  // in errors: "<method> K/V"
  Tensor q_store_;  // F32 [max_num_seqs * k, vocab]: q of each slot's drafts
  std::unordered_map<std::string, std::unique_ptr<RequestState>, StringViewHash, std::equal_to<>> states_;
  std::vector<int> free_slots_;  // handed out lowest first
  int64_t num_forwards_ = 0;
  int64_t last_catch_up_tokens_ = 0;

  // This propose's scratch.
  std::vector<int> num_drafts_;
  std::vector<Piece> pieces_;
  std::vector<std::vector<int32_t>> contexts_;  // drafting rows' context (tokens + drafts so far)
  // Per request of this propose: the blocks its rows attend to (attended_blocks_ holds the lists
  // of requests with stale blocks; the others attend to their whole block table).
  std::vector<AttendedBlocks> attended_;
  std::vector<std::vector<int32_t>> attended_blocks_;
  // Per request of this propose: the grammar mask its next draft is sampled under (structured
  // outputs; draft_grammar_mask), valid until that request's next draft.
  std::vector<std::vector<uint32_t>> draft_masks_;
  // Drafting requests with at least this many drafts have a draft-step row (their catch-up hidden
  // state starts the chained steps): 2, or 1 in a greedy chain, whose rows are every drafting one.
  int step_row_min_drafts_ = 2;

  CatchUpInputs catch_up_;
  std::unique_ptr<DeviceEvent> catch_up_uploaded_;  // after the last uniform staging's uploads
  std::vector<std::string> ahead_ids_;  // the launch-ahead's requests, for settle_ahead
  DraftStepBuffers step_;  // static draft-step inputs, [max_num_seqs] rows
  DraftChain chain_;  // this propose's, when on
  // A chain that left its drafts on the device: where they are, and whose they are (batch order).
  DraftsOnDevice on_device_;
  std::vector<std::string> on_device_ids_;
  // Hidden-state proposers only.
  StagedTensor target_rows_;  // [max_num_batched_tokens]: each catch-up row's row of the target's
  StagedTensor step_rows_;    // [max_num_seqs]: the catch-up rows whose hidden states start the steps
  Tensor target_hidden_;      // [max_num_batched_tokens, H]: the target's hidden rows the catch-up reads
  Tensor chained_hidden_;     // [max_num_seqs, H]: the previous step's (zeroed: padding stays finite)

  std::map<int, std::unique_ptr<PaddedGraphs>> catch_up_graphs_;  // by rows per request
  std::map<std::pair<int, int>, Tensor> catch_up_graph_logits_;   // by (rows, size): captured outputs
  Tensor every_row_logits_idx_;  // I32 0, 1, 2, ...: a tokens-only catch-up graph's logits rows
  int64_t catch_up_graph_replays_ = 0;
  int64_t uniform_catch_ups_ = 0;
  std::map<int, std::unique_ptr<PaddedGraphs>> step_graphs_;  // by step variant
  std::map<std::pair<int, int>, Tensor> step_graph_logits_;   // by (variant, size): captured outputs
  int64_t step_graph_replays_ = 0;
};

}  // namespace specula
