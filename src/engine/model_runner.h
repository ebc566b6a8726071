// ModelRunner: turns a SchedulerOutput into one Model::forward over the flattened batch, then
// samples. It keeps persistent per-request state (tokens, block table, sampling settings: vLLM's
// InputBatch idea) so that each step only ships what changed, and builds the step's inputs in
// host buffers that are copied to the backend's device in one go per tensor.
//
// Draft tokens scheduled for verification get logits at all k+1 positions and go through the
// RejectionSampler of spec/ (lossless: min(1, p/q) against the proposer's draft distributions q,
// or exact matching against the target's own sample where the drafts are deterministic). With a
// Speculator attached, the runner then asks its proposer for the next step's drafts, which travel
// back in ModelRunnerOutput::draft_token_ids.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/padded_graphs.h"
#include "sampling/sampler.h"
#include "engine/scheduler_output.h"
#include "model/model.h"

namespace specula {

class RejectionSampler;  // sampling/rejection_sampler.h
struct VerifyRequest;
class Speculator;        // engine/speculator.h
struct ProposerRequest;

// What the engine core drives each step: the ModelRunner, or a fake in tests.
class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual ModelRunnerOutput execute(const SchedulerOutput& scheduled) = 0;
  // Async scheduling: starts the step and returns its counts (what the next step's schedule needs)
  // before its values are on the host; collect() returns the oldest submitted step's output. The
  // step after a submitted one may be submitted before the first is collected. `host_work` (the
  // engine's processing of the step before: it may collect()) runs once, while the device runs
  // this step where the executor can: before it waits for anything of it. This default runs the
  // step at once, then host_work.
  using HostWork = std::function<void()>;
  virtual StepCounts submit(const SchedulerOutput& scheduled, const HostWork& host_work = nullptr);
  virtual ModelRunnerOutput collect();

 protected:
  static StepCounts counts_of(const ModelRunnerOutput& out);

 private:
  std::deque<ModelRunnerOutput> submitted_;
};

struct ModelRunnerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int max_model_len = 2048;
  int block_size = 16;
  int num_blocks = 0;
  int num_speculative_tokens = 0;
  std::optional<DType> kv_cache_dtype;  // unset: the backend's compute type (engine/kv_cache_dtype.h)
  // An fp8 cache's per-layer scales; empty: the checkpoint's (Model::kv_cache_scales), else 1.0.
  std::vector<KVCacheScales> kv_cache_scales;
  // Decode graphs (one row a sequence) are captured twice where max_model_len is longer than
  // this: for steps whose sequences are all at most this long, and for any length. Attention
  // sizes its launch (key splits, how they merge) at capture from the length it is given, and a
  // short step in the graph sized for max_model_len pays for splits it does not fill and their
  // merge kernel. 0: one set.
  int short_decode_graph_len = 1024;
};

class ModelRunner : public ModelExecutor {
 public:
  // Allocates the KV cache (num_blocks blocks per layer, in config.kv_cache_dtype) and the
  // persistent device input buffers.
  ModelRunner(Model& model, Backend& backend, Sampler& sampler, const ModelRunnerConfig& config);
  ~ModelRunner() override;

  ModelRunnerOutput execute(const SchedulerOutput& scheduled) override;
  // Async scheduling: a step whose every sampling row the device sampler covers and that verifies
  // and proposes nothing (no speculator) returns from submit() with its tokens still on the
  // device. The next step takes them as inputs on the device (the sampler's token feed) when it
  // replays a graph, and its submit() waits for them only after launching its forward; collect()
  // waits for them only when no older step's output is ready. A speculative step returns with its accepted tokens on the host and its
  // drafts, where the proposer chains them on the device, still there (placeholders in the
  // counts): the next step feeds them into its inputs on the device likewise. Other steps run at
  // once. engine/README.md lists which host buffers that makes safe.
  StepCounts submit(const SchedulerOutput& scheduled, const HostWork& host_work = nullptr) override;
  ModelRunnerOutput collect() override;

  // Speculative decoding: the speculator proposes drafts after every step (not owned; it must
  // outlive the runner). Without one, drafts set on the scheduler by hand are still verified.
  void set_speculator(Speculator* speculator) { speculator_ = speculator; }
  // Replaces the host rejection sampler (a device implementation).
  void set_rejection_sampler(std::unique_ptr<RejectionSampler> sampler);

  // CUDA graphs of uniform decode steps (model_runner_graphs.cc): captures the forward of a decode
  // batch for each padded batch size, and with speculation (num_speculative_tokens > 0) the forward of a
  // verification batch of r = 2 .. 1 + num_speculative_tokens rows per sequence for each padded size up
  // to kMaxVerifyGraphBatch; execute() then replays the smallest graph that fits a step in which
  // every sequence runs r rows that are all logits rows, instead of launching the forward (a
  // ragged decode step, sequences verifying different numbers of drafts, replays the graph of
  // its longest sequence's rows, the others padded).
  // Returns the number of graphs captured (0 on a backend without graphs). Call after
  // construction, before the first step.
  size_t capture_decode_graphs(const std::vector<int>& batch_sizes);
  size_t num_decode_graphs() const;   // all of them, verification graphs included
  size_t num_verify_graphs() const;   // those of r > 1 rows per sequence
  // Steps that replayed a graph of `rows` rows per sequence so far (tests, profiling); of them,
  // decode steps that replayed a graph of the short set (ModelRunnerConfig::short_decode_graph_len).
  int64_t num_graph_replays(int rows) const;
  int64_t num_short_graph_replays() const { return short_graph_replays_; }
  // Of them, steps that replayed a graph captured without EAGLE-3's features (idle steps).
  int64_t num_featureless_graph_replays() const { return featureless_graph_replays_; }
  // Ragged decode steps that ran padded as a graph (pad_ragged_decode), for tests.
  int64_t num_ragged_graph_steps() const { return ragged_graph_steps_; }
  // Steps whose inputs took the pending step's tokens through the sampler's token feed, for tests.
  int64_t num_fed_steps() const { return fed_steps_; }
  // Steps whose drafts stayed on the device until the next step was launched, for tests.
  int64_t num_steps_with_drafts_on_device() const { return steps_with_drafts_on_device_; }
  // Steps whose proposer work was launched ahead of their results (README.md): the next drafts
  // before the verification's, or a depth-0 catch-up before the sampled tokens.
  int64_t num_steps_launched_ahead() const { return steps_launched_ahead_; }
  static constexpr int kMaxVerifyGraphBatch = 256;

  std::vector<KVCacheLayer>& kv_cache() { return kv_; }
  // Per-request state is dropped when a later SchedulerOutput lists the request as finished.
  bool has_request_state(const std::string& id) const { return requests_.count(id) > 0; }

 private:
  struct RequestState {
    std::vector<int32_t> tokens;   // prompt followed by the output sampled so far
    int num_prompt_tokens = 0;
    std::shared_ptr<const SamplingParams> params;
    uint64_t seed = 0;
    std::vector<int32_t> min_tokens_stop_ids;
    bool want_prompt_logprobs = false;
    std::vector<int32_t> block_ids;
    int num_cached_tokens = -1;  // prefix-cache hit when first scheduled (-1: not scheduled yet)
    // Async scheduling: its last token is row pending_row of the pending step's sampling, not yet
    // in `tokens` (-1: none).
    int pending_row = -1;
    // Async scheduling: where its drafts from the last proposal are while they are on the device
    // (the index of its first in drafts_on_device_'s tokens; -1: not there), and their values once
    // collected (for a later step that verifies them).
    int draft_first = -1;
    std::vector<int32_t> drafts;
    int num_known_tokens() const { return static_cast<int>(tokens.size()) + (pending_row >= 0 ? 1 : 0); }
    int num_output_tokens() const { return static_cast<int>(tokens.size()) - num_prompt_tokens; }
  };

  // Where one request's results come from in the step's logits.
  struct RequestPlan {
    RequestState* state = nullptr;
    const ScheduledRequest* sched = nullptr;
    int first_sample_row = -1;     // k+1 consecutive logits rows when it samples, else -1
    int num_sample_rows = 0;
    int first_prompt_row = -1;     // prompt logprob rows
    int num_prompt_rows = 0;
    int first_prompt_position = 0; // the prompt position the first prompt row predicts
    int first_token_row = 0;       // its first row of the flattened batch (hidden states)
    // The drafts it verifies: the scheduled ones, or, where those hold placeholders, their values
    // once collected (collect_drafts), kept in collected_drafts.
    std::span<const int32_t> drafts;
    std::vector<int32_t> collected_drafts;
  };

  // A submitted step whose sampled tokens are still on the device.
  struct PendingStep {
    ModelRunnerOutput out;
    // (scheduled index, request id), in row order; a request finished or preempted meanwhile has no
    // state left to append to.
    std::vector<std::pair<size_t, std::string>> samplers;
    // A uniform decode step (every sequence one row) whose time the speculator's cost model
    // learns once its tokens arrive: its sequences (0: not timed) and when its forward launched.
    int num_timed_seqs = 0;
    double launched_at = 0.0;
  };

  // execute() and submit(): with may_defer, a step that can leaves its sampling in flight in
  // pending_ (its output then lacks the sampled tokens).
  ModelRunnerOutput run_step(const SchedulerOutput& scheduled, bool may_defer);
  // Waits for the pending step's tokens, appends them to the requests' states and queues its
  // output for collect(); returns the tokens in row order.
  std::vector<int32_t> finish_pending();
  // Async scheduling: collects the drafts the last step left on the device (waiting for them)
  // into the requests' states and the plans' drafts. Returns when they were on the host (steady
  // clock seconds; 0 when none were pending).
  double collect_drafts(std::vector<RequestPlan>& plans);
  // The input token of a request's draft j that the scheduler knows as a placeholder.
  int32_t draft_input_token(const RequestState& st, int j) const;
  void update_states(const SchedulerOutput& scheduled);
  ForwardInput prepare_inputs(const SchedulerOutput& scheduled, std::vector<RequestPlan>& plans);
  ForwardInput eager_step_inputs(int num_seqs, int t, int num_logits, int max_query, int max_seq, int max_blocks);
  // Fills grammar_masks_ with the token masks of every sampled row of a request with a grammar;
  // returns each plan's offset into it.
  std::vector<size_t> fill_grammar_masks(const std::vector<RequestPlan>& plans);
  // Tells the speculator's cost model what the step's target forward and sampling took.
  void record_target_cost(const std::vector<RequestPlan>& plans, double target_seconds);
  // Asks the speculator for the next step's drafts of every request the step ran.
  // may_leave_on_device: async scheduling; the speculator may leave the drafts on the device.
  void propose_drafts(const std::vector<RequestPlan>& plans, const ForwardOutput& fwd, double target_seconds,
                      bool may_leave_on_device, ModelRunnerOutput& out);
  // Launch-ahead (async scheduling, README.md): where every request verifies the same number of
  // deterministic drafts, starts the verification and asks the speculator for the next drafts
  // from its result on the device before the host waits for it. Returns their depth, or -1 when
  // none were launched; `started` says whether the verification was started (finish_verify()).
  int launch_ahead(std::vector<RequestPlan>& plans, const ForwardInput& input, const ForwardOutput& fwd,
                   std::span<const VerifyRequest> verify, bool& started, std::vector<std::vector<int32_t>>& drafts);
  // Catch-up ahead (async scheduling, README.md): a decode step whose proposer only catches up
  // (adaptive depth 0 with a proposer that must see every step) leaves its sampling in flight like
  // a plain step, the proposer's catch-up reading the sampled tokens on the device. false: the
  // speculator launched nothing.
  bool catch_up_ahead(std::vector<RequestPlan>& plans, const ForwardInput& input, const ForwardOutput& fwd);
  // A step's sampling left in flight (pending_); timed: the cost model learns its time.
  void defer_sampling(const std::vector<RequestPlan>& plans, double launched_at, bool timed);
  // What every ProposerRequest of a plan holds whatever the step (its tokens and drafts aside).
  ProposerRequest proposer_request(const RequestPlan& plan) const;
  // The drafts the speculator left on the device for the next step: where each request's are.
  void adopt_drafts_on_device(const std::vector<RequestPlan>& plans);
  // Drafts the next step could verify for a request that will hold `num_tokens` tokens.
  int max_drafts_at(const RequestState& st, int num_tokens) const;
  // The step's input arrays on the device: views into one buffer, at offsets that depend only on
  // (tokens t, logits rows, sequences), so a graph of B sequences of r rows reads the addresses it
  // was captured with. upload_inputs() first packs the host arrays' used entries into a pinned
  // buffer and copies them up in one transfer (one copy instead of seven on the device's queue).
  struct DeviceInputs {
    Tensor token_ids, positions, slots, logits_indices, query_start_loc, seq_lens, block_tables;
  };
  DeviceInputs input_views(int t, int num_logits, int num_seqs, int64_t table_entries) const;
  DeviceInputs upload_inputs(int t, int num_logits, int num_seqs, int64_t table_entries);

  std::optional<PendingStep> pending_;
  // Drafts the speculator left on the device in the last step (async scheduling): the next step's
  // inputs take them there (Backend::feed_tokens) and its host collects them after launching it.
  bool drafts_on_device_ = false;
  Tensor draft_source_;
  int draft_stride_ = 0;
  std::vector<std::string> draft_owners_;  // the proposal's requests, in its batch order
  int64_t steps_with_drafts_on_device_ = 0;
  int64_t steps_launched_ahead_ = 0;
  // Launch-ahead: the verification's token of each row on the device (fed from I32 -(1 + row),
  // verify_row_names_), and the last step's target seconds (the proposal's cost model reads them
  // before this step's are known).
  Tensor verified_tokens_, verify_row_names_;
  double last_target_seconds_ = 0.0;
  // When the last step's results (tokens, drafts) reached the host, steady-clock seconds: a step
  // queued behind that step started on the device no earlier.
  double last_results_at_ = 0.0;
  std::deque<ModelRunnerOutput> ready_;  // submitted steps' outputs, oldest first
  // submit()'s host work, until run_step runs it (run_host_work) where it would otherwise wait.
  HostWork host_work_;
  void run_host_work();

  Model& model_;
  Backend& backend_;
  Sampler& sampler_;
  std::unique_ptr<RejectionSampler> rejection_sampler_;
  Speculator* speculator_ = nullptr;
  ModelRunnerConfig config_;
  std::vector<KVCacheLayer> kv_;
  std::vector<uint32_t> grammar_masks_;  // this step's structured-output masks (fill_grammar_masks)
  std::unordered_map<std::string, RequestState> requests_;

  // The step's input arrays on the host, sized for the largest step; upload_inputs() packs them.
  Tensor h_tokens_, h_positions_, h_slots_, h_qsl_, h_seq_lens_, h_block_tables_, h_logits_idx_;
  // Pinned packing buffers (where the backend has them), used by alternate steps: under async
  // scheduling step N+1 packs while step N's copy may still read the other one; the copy of step
  // N-1, which used this one, has run (its tokens were waited for). And the device buffer.
  Tensor h_packed_[2];
  int packed_index_ = 0;
  Tensor d_inputs_;

  // ---- decode and verification graphs (model_runner_graphs.cc) ----
  // The graph size a step of num_seqs sequences and t tokens runs as (0: eager), and its rows per
  // sequence: uniform, every sequence r rows, every row a logits row, in order.
  int uniform_graph_size(int num_seqs, int t, int num_logits, int& rows) const;
  // A ragged decode step (every sequence decodes from its last token: 1 row, or 1 + its own
  // number of drafts) as the graph of its longest sequence's rows: rewrites the host inputs to r
  // rows per sequence, each shorter one followed by rows that write no K/V and that its real rows
  // never attend to, and moves the plans' rows along. Returns the graph size (0: eager; nothing
  // rewritten).
  int pad_ragged_decode(int num_seqs, int t, int num_logits, std::vector<RequestPlan>& plans, int& rows);
  // Pads the host inputs already filled for num_seqs sequences to `size` harmless sequences of
  // `rows` rows, uploads them into the graphs' static buffers and returns the step's input (block
  // tables at full width).
  ForwardInput graph_step_inputs(int size, int rows, int num_seqs, int max_blocks);
  // Fills sequences [first_padding_seq, size) of the host inputs with padding and uploads the
  // first size sequences of `rows` rows (and table_entries of the compact block table).
  DeviceInputs upload_padded_graph_inputs(int first_padding_seq, int size, int rows, int64_t table_entries);
  // The forward of the step prepare_inputs built: a graph replay, or Model::forward.
  ForwardOutput forward_step(const ForwardInput& input);
  // capture_len: the sequence length a capture sizes attention for (0: the block table's width).
  ForwardInput static_decode_input(int size, int rows, bool for_capture, int capture_len = 0);
  // Captures the graphs of `rows` rows per sequence for `sizes` into graphs (their outputs into
  // outputs, by batch size); returns false where none could be captured.
  // with_aux: ForwardInput::with_aux_hidden_states of the captured forwards.
  bool capture_graph_set(int rows, const std::vector<int>& sizes, int capture_len, bool with_aux,
                         std::unique_ptr<PaddedGraphs>& graphs, std::map<int, ForwardOutput>& outputs);
  std::map<int, std::unique_ptr<PaddedGraphs>> graphs_;  // by rows per sequence
  // Keeps the captured outputs (and their arena) alive, by rows per sequence and batch size.
  std::map<int, std::map<int, ForwardOutput>> graph_outputs_;
  // The decode graphs for steps of sequences of at most config_.short_decode_graph_len tokens.
  std::unique_ptr<PaddedGraphs> short_decode_graphs_;
  std::map<int, ForwardOutput> short_graph_outputs_;
  // Decode graphs and their outputs, captured without EAGLE-3's features (for steps that leave
  // them out), for the full-length and the short set: only for a model that returns them.
  struct GraphSet {
    std::unique_ptr<PaddedGraphs> graphs;
    std::map<int, ForwardOutput> outputs;
    size_t size() const { return graphs ? graphs->size() : 0; }
  };
  GraphSet featureless_decode_, featureless_short_decode_;
  Tensor d_graph_block_tables_;  // I32 [max_num_seqs, max_blocks_per_seq]
  int graph_size_ = 0;           // the graph this step replays (0: eager)
  int graph_rows_ = 0;           // its rows per sequence
  bool graph_short_ = false;     // it is of the short decode set
  int64_t short_graph_replays_ = 0;
  int64_t featureless_graph_replays_ = 0;
  std::map<int, int64_t> graph_replays_;  // by rows per sequence
  int64_t ragged_graph_steps_ = 0;
  int64_t fed_steps_ = 0;
  int ragged_rows_ = 0;  // this step ran padded to this many rows per sequence (0: it did not)
};

}  // namespace specula
