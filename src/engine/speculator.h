// The engine's seam for speculative decoding: what the model runner drives each step. The engine
// owns this interface and knows nothing of how drafts are made; spec_decode/ implements it
// (AdaptiveSpeculator: a proposer and the adaptive depth) and app/create_engine.h hands
// LLMEngine::create a SpeculatorFactory built from --speculative-config.
//
// Per step the runner
//   1. verifies the drafts the previous step proposed, against draft_probs() (q; null when every
//      draft is deterministic), and reports each request's result (record_verification) and the
//      step's target time (record_target_step);
//   2. calls propose() with every request the step ran; the drafts travel in
//      ModelRunnerOutput::draft_token_ids to Scheduler::set_draft_tokens.
// Under async scheduling a proposer may leave its drafts on the device (drafts_on_device): the
// next step takes them into its inputs there and collects their values (finish_drafts) only after
// launching its forward, so that the host plans and stages it while the drafts are made.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "model/model.h"
#include "sampling/sampling_params.h"
#include "structured_output/grammar_matcher.h"

namespace specula {

class Backend;
class Tokenizer;
struct ModelConfig;

// One request of the step, as the proposer sees it once the step's tokens are accepted.
struct ProposerRequest {
  std::string_view req_id;
  std::span<const int32_t> tokens;      // prompt + output, this step's accepted tokens included
  int num_prompt_tokens = 0;
  // Tokens whose target K/V is valid now (positions < this). A request that sampled has exactly
  // one more token (the last sampled one, not yet through the target); a prefill chunk has fewer.
  int num_target_computed = 0;
  // Its first positions served by the prefix cache when first scheduled: their entries in a
  // proposer's cache were written by the request that computed them (the same tokens).
  int num_cached_tokens = 0;
  bool sampled = false;                 // this step produced tokens for it (else: a prefill chunk)
  bool verified_drafts = false;         // this step verified drafts of it (it drafted last step)
  int max_drafts = 0;                   // drafts the next step could verify for it (0: none)
  // Left out of this step (load shedding, chosen by the speculator): the proposer runs nothing for
  // it and keeps no state of it, as in a step it is not called for; its positions count as
  // inherited when it next runs.
  bool shed = false;
  std::span<const int32_t> block_ids;   // its block table: also the block table of proposer caches
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;                    // its RNG stream (draws keyed by position, see sampling_math.h)
  std::span<const int32_t> min_tokens_stop_ids;  // masked while fewer than min_tokens are generated
  // Structured outputs: the request's grammar, at its state before `grammar_pending` (this step's
  // accepted tokens, the last of `tokens`: the scheduler advances it after the step). A proposer
  // that samples its drafts draws them under the grammar's mask, so that they are tokens the
  // target may accept; q is then the masked distribution, which verification is lossless for.
  // Nothing may be left changed in it.
  GrammarMatcher* grammar = nullptr;
  std::span<const int32_t> grammar_pending;
  // Its rows of this step's target forward: rows [first_row, first_row + num_rows) of
  // ProposeBatch::target_hidden_states are positions [first_position, first_position + num_rows)
  // (including drafts that were rejected: only positions < num_target_computed are real).
  int first_row = 0;
  int num_rows = 0;
  int first_position = 0;
};

// Drafts a propose() left on the device: draft j of the request at index i of that call's batch
// is tokens[first[i] + j * stride] (first[i] < 0: it has none there).
struct DraftsOnDevice {
  Tensor tokens;  // I32, on the backend's device; valid until the next propose()
  std::vector<int> first;
  int stride = 0;
};

struct ProposeBatch {
  std::vector<ProposerRequest> requests;
  // Async scheduling: the drafts may stay on the device. propose() then gives kPlaceholderToken
  // (engine/scheduler_output.h) for each draft it left there, their number exact, and
  // drafts_on_device() says where they are until finish_drafts().
  bool may_leave_drafts_on_device = false;
  // Drafts wanted per request this step (chosen by the speculator); each request also caps at its
  // max_drafts. 0: no drafts, but a proposer that cannot catch up later (one that needs the
  // target's hidden states of every position) must still consume this step.
  int depth = 0;
  // Wall seconds of this step's target forward and sampling / verification (what
  // record_target_step reports for uniform steps, here for every step).
  double target_seconds = 0.0;
  // F32/compute dtype [T, hidden] after the final norm, on the device. Backend scratch memory:
  // valid until the next forward on the backend, so a proposer copies the rows it needs before
  // running a model of its own. Undefined when the model did not return it.
  Tensor target_hidden_states;
  // [T, n hidden]: the target's aux-layer features (ForwardOutput::aux_hidden_states, for an
  // EAGLE-3 head), rows as target_hidden_states'; scratch. Undefined unless the model returns them.
  Tensor target_aux_hidden_states;
  // Launch-ahead (Speculator::propose_ahead): the step's verification is still on the device.
  // Every request verified k deterministic drafts; its `tokens` end with its last token before
  // them and then kPlaceholderToken, as if it had accepted none, and its max_drafts hold whatever
  // it accepts. `inputs` and `sampled` are the verification's rows on the device
  // (backend/accepted_shift.h), from which the proposer's staged inputs move on there. k = 0: a
  // plain step's sampling is in flight (Speculator::propose_ahead).
  struct LaunchAhead {
    Tensor inputs, sampled;
    int k = 0;
  };
  std::optional<LaunchAhead> ahead;
};

class Speculator {
 public:
  virtual ~Speculator() = default;

  // The most drafts a request verifies in one step: the scheduler reserves this many KV slots
  // ahead of each request, the runner sizes its verification rows by it.
  virtual int num_speculative_tokens() const = 0;
  // The depth is chosen per step in 0..num_speculative_tokens (false: always all of them).
  virtual bool adaptive() const = 0;
  // One line for the engine's start-up log ("method draft_model (path), ...").
  virtual std::string describe() const = 0;

  // A paged KV cache kept beside the target's on the target's block tables (a draft model's
  // layers); empty when there is none. Sized together with the target's, then allocated once.
  virtual KVCacheSpec kv_cache_spec() const { return {}; }
  virtual void allocate_kv_cache(int num_blocks, int block_size) {}
  // Device graphs of the speculator's fixed-shape work, after the target's; returns how many.
  virtual size_t capture_graphs(const std::vector<int>& batch_sizes) { return 0; }

  // The request finished or was preempted (a preempted one comes back new).
  virtual void drop_request(std::string_view req_id) = 0;
  // The distributions q the last drafts were sampled from: F32 [rows, vocab] on the device, row
  // draft_probs_row(id) + j for draft j of the request; nullptr / -1 where drafts are
  // deterministic (q one-hot at the draft).
  virtual const Tensor* draft_probs() const = 0;
  virtual int draft_probs_row(std::string_view req_id) const = 0;

  // Request req_id verified num_drafts drafts and accepted the first num_accepted of them.
  virtual void record_verification(std::string_view req_id, int num_drafts, int num_accepted) = 0;
  // A step in which every scheduled request decoded with `rows` query rows (1 + drafts) took
  // `seconds` for the target's forward and verification.
  virtual void record_target_step(int num_seqs, int rows, double seconds) = 0;
  // Asked before the forward of a step that verifies no drafts, num_decoding of whose requests
  // sample (with_prompts: others run prompt chunks): chooses the step's depth now. True: the depth is 0 and the proposer need not see the
  // step, so the runner does not call propose() for it (nothing after sampling needs its tokens on
  // the host, and under async scheduling they stay on the device like a plain step's) and its
  // forward leaves out what only a proposer reads (ForwardInput::with_aux_hidden_states). False:
  // propose() follows for this step and keeps the depth chosen here.
  virtual bool skip_step(int num_decoding, bool with_prompts) { return false; }
  // Chooses this step's depth (setting batch.depth) unless skip_step() chose it, proposes, and
  // returns the depth; drafts[i] are the drafts of batch.requests[i].
  virtual int propose(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) = 0;
  // Whether propose() can leave drafts on the device at all (greedy requests' drafts chained
  // there); the async scheduling default asks.
  virtual bool leaves_drafts_on_device() const { return false; }
  // After a propose() that left drafts on the device: where they are (nullptr: none pending).
  virtual const DraftsOnDevice* drafts_on_device() const { return nullptr; }
  // Waits for the drafts left on the device and returns their values: drafts[i] for request i of
  // that propose()'s batch (empty where it has none). None are pending afterwards.
  virtual std::vector<std::vector<int32_t>> finish_drafts() { return {}; }
  // Launch-ahead (async scheduling): asked before the host waits for a step's verification, with
  // the batch as ProposeBatch::ahead describes it. A depth >= 0: the next drafts were launched
  // from the verification's result on the device and left there as propose() leaves them
  // (drafts: their placeholders); settle_ahead() follows, with each request's accepted drafts,
  // once the step's tokens are on the host, and propose() is not called for the step. -1:
  // nothing was launched, and propose() follows as usual. After a plain decode step (ahead's k
  // = 0, the `sampled` rows its sampled tokens, each request's tokens ending with the name
  // -(1 + s) of its row there): depth 0, the proposer's catch-up launched on those tokens and
  // nothing else (no drafts, no settle_ahead()); -1: the runner samples and proposes as usual.
  virtual int propose_ahead(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) { return -1; }
  virtual void settle_ahead(std::span<const int> accepted) {}
};

// What a speculator may need when the engine builds it: the target is loaded, the KV cache is not
// sized yet (kv_cache_spec is asked next, allocate_kv_cache follows).
struct SpeculatorContext {
  std::string target_model;           // the target checkpoint folder (MTP reads its own layers there)
  std::string load_format;            // auto | safetensors | dummy, as the target's
  uint64_t seed = 0;
  int shared_expert_fusion = 0;       // as resolved for the target
  const ModelConfig& target_config;
  Model& target;                      // MTP/EAGLE share its embedding and head
  const Tokenizer& target_tokenizer;
  Backend& backend;
  int max_model_len = 0;              // the target's
  int max_num_seqs = 0;
  int max_num_batched_tokens = 0;
  int tensor_parallel_size = 1;       // the target's ranks (a draft model may be split over them too)
  std::function<std::unique_ptr<Backend>(int rank)> make_rank_backend{};  // the target's, for rank >= 1
  bool custom_all_reduce = true;      // the target's (--disable-custom-all-reduce)
};

using SpeculatorFactory = std::function<std::unique_ptr<Speculator>(const SpeculatorContext&)>;

}  // namespace specula
