// One sequence the scheduler manages (vLLM v1's Request). A client request with n > 1 fans out
// into n of these ("child" sequences) that share the prompt; the OutputProcessor joins them back
// into one RequestOutput stream.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/api.h"
#include "sampling/sampling_params.h"
#include "structured_output/grammar_matcher.h"

namespace specula {

enum class RequestStatus {
  kWaiting,
  kRunning,
  kPreempted,          // waiting again after its blocks were taken (recomputed on resume)
  kFinishedStopped,    // eos, a stop token or a stop string
  kFinishedLength,     // max_tokens or max_model_len
  kFinishedAborted,    // the client went away or the engine shut down
  kFinishedError,      // the step that ran it threw
};
bool is_finished(RequestStatus s);
FinishReason finish_reason_of(RequestStatus s);
std::string_view status_name(RequestStatus s);

using StopReason = std::variant<std::monostate, int32_t, std::string>;
using BlockHash = uint64_t;

struct Request {
  // Identity. `request_id` is this sequence's engine-internal id; `parent_id` is the client's id.
  std::string request_id;
  std::string parent_id;
  int choice_index = 0;

  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> output_token_ids;
  std::vector<int32_t> all_token_ids;  // prompt followed by output

  std::shared_ptr<const SamplingParams> params;
  int max_tokens = 0;                  // resolved (default: max_model_len - prompt length)
  std::optional<int32_t> eos_token_id; // the primary eos; unset when ignore_eos
  // Tokens that end the sequence besides eos (stop_token_ids + generation_config's other eos ids):
  // stop_reason reports the token.
  std::vector<int32_t> stop_token_ids;
  uint64_t sampling_seed = 0;          // the key of this sequence's counter-based RNG stream

  uint64_t arrival_seq = 0;            // FCFS order
  double arrival_time = 0.0;           // seconds, steady clock
  double scheduled_time = 0.0;         // first scheduled (0: not yet); kept across preemption
  double first_token_time = 0.0;       // first output token (0: none yet)
  double last_token_time = 0.0;
  RequestStatus status = RequestStatus::kWaiting;
  StopReason stop_reason;

  // Tokens whose KV is computed, or scheduled to be computed by the step in flight (advanced at
  // schedule time, rolled back for rejected speculative tokens when the step's result lands).
  int num_computed_tokens = 0;
  // Draft tokens to verify in the next step (set by a proposer after update(); consumed by
  // schedule()).
  std::vector<int32_t> spec_token_ids;
  // Tokens scheduled whose sampled values are not known yet (async scheduling: step N+1 is
  // scheduled while step N runs). Always 0 between steps in synchronous mode.
  int num_output_placeholders = 0;
  int num_cached_tokens = -1;          // prompt tokens served by the prefix cache (first schedule)
  int num_preemptions = 0;

  // Structured outputs: where the output stands in its grammar (null: unconstrained). Advanced by
  // every token update() appends; drafts it forbids are cut before they are scheduled.
  std::unique_ptr<GrammarMatcher> grammar;

  // Prefix-cache hashes of this sequence's full blocks of known tokens, extended lazily.
  std::vector<BlockHash> block_hashes;

  int num_prompt_tokens() const { return static_cast<int>(prompt_token_ids.size()); }
  int num_output_tokens() const { return static_cast<int>(output_token_ids.size()); }
  int num_tokens() const { return static_cast<int>(all_token_ids.size()); }
  int num_tokens_with_spec() const { return num_tokens() + static_cast<int>(spec_token_ids.size()); }
  bool wants_prompt_logprobs() const { return params->prompt_logprobs.has_value() && choice_index == 0; }

  void append_output_token(int32_t token) {
    output_token_ids.push_back(token);
    all_token_ids.push_back(token);
  }
};

}  // namespace specula
