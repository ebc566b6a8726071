// What flows between the scheduler and the model runner each step: plain data, no tensors.
//
//   Scheduler::schedule()  -> SchedulerOutput       which requests run, how many tokens each, their
//                                                    new KV blocks, the draft tokens to verify
//   ModelRunner::execute() -> ModelRunnerOutput     the tokens each request accepted (a list: a
//                                                    verified speculative step yields up to k+1)
//   Scheduler::update()    -> EngineCoreOutput[]    what the OutputProcessor turns into text
//
// With async scheduling the runner's submit() returns StepCounts first (how many tokens each
// request gains, how many drafts it gets), Scheduler::apply_counts() plans the next step on them,
// and the step's ModelRunnerOutput (the values) reaches Scheduler::update() a step later.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/api.h"
#include "engine/request.h"
#include "sampling/sampling_params.h"

namespace specula {

// A request the runner has not seen, or one resumed after preemption (the runner dropped it then).
struct NewRequestData {
  std::string req_id;
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> output_token_ids;  // non-empty when resumed after preemption
  std::shared_ptr<const SamplingParams> params;
  uint64_t sampling_seed = 0;
  // Token ids masked while fewer than min_tokens have been generated (eos + stop tokens).
  std::vector<int32_t> min_tokens_stop_ids;
  bool want_prompt_logprobs = false;
  std::vector<int32_t> block_ids;         // the whole block table
};

struct ScheduledRequest {
  std::string req_id;
  int num_scheduled_tokens = 0;           // includes the draft tokens below
  int num_computed_tokens = 0;            // before this step
  std::vector<int32_t> spec_token_ids;    // drafts to verify: the last tokens of this request's chunk
  std::vector<int32_t> new_block_ids;     // appended to its block table (requests seen before)
  // Structured outputs, when this step samples the request: its grammar, at the state before
  // this step's tokens (Scheduler::update() advances it once the step's tokens are known). The
  // runner takes each sampled row's allowed-token mask from it after launching the forward, so
  // that the masks are computed while the device runs (row j after the first j drafts).
  GrammarMatcher* grammar = nullptr;
  // Drafts after the first one the grammar forbids (cut from the end of spec_token_ids before
  // scheduling; the forbidden one is verified and rejected): the speculator counts them as
  // rejected, so adaptive depth sees what drafting bought.
  int num_grammar_cut_drafts = 0;
};

struct SchedulerOutput {
  uint64_t step_id = 0;
  std::vector<NewRequestData> new_requests;
  std::vector<ScheduledRequest> scheduled;    // batch order: running requests first, then admitted ones
  int total_num_scheduled_tokens = 0;
  std::vector<std::string> finished_req_ids;  // finished since the previous step: drop their state
  std::vector<std::string> preempted_req_ids; // preempted by this step: drop their state

  bool empty() const { return scheduled.empty(); }
};

// Prompt logprobs computed by one chunk: entries for prompt positions [start, start + size).
struct PromptLogprobsChunk {
  int start = 0;
  std::vector<std::optional<PositionLogprobs>> entries;  // position 0 has none
};

struct ModelRunnerOutput {
  // Parallel to SchedulerOutput::scheduled.
  std::vector<std::vector<int32_t>> sampled_token_ids;   // empty: a prefill chunk that samples nothing
  std::vector<std::vector<PositionLogprobs>> logprobs;   // per sampled token, when requested
  std::vector<PromptLogprobsChunk> prompt_logprobs;      // when requested
  // Speculative decoding: drafts for each request's next step (empty: none), which the engine
  // core hands to Scheduler::set_draft_tokens, and the depth the proposer was asked for this step
  // (-1: speculation is off).
  std::vector<std::vector<int32_t>> draft_token_ids;
  int spec_depth = -1;
  // The proposer's work was launched before the host read this step's results (launch-ahead:
  // those drafts before the verification's; catch-up ahead: a depth-0 catch-up before the tokens).
  bool proposer_launched_ahead = false;
};

// A token id the host does not know yet (async scheduling): a draft the runner proposed and still
// holds on the device. The runner substitutes its own value; the scheduler only counts it.
inline constexpr int32_t kPlaceholderToken = -1;

// What a submitted step will produce, known before its token values reach the host. Parallel to
// SchedulerOutput::scheduled.
struct StepCounts {
  std::vector<int> num_sampled;                     // accepted drafts + 1; 0: a prefill chunk
  std::vector<std::vector<int32_t>> draft_token_ids; // the next step's drafts (values or placeholders)
  int spec_depth = -1;
  bool proposer_launched_ahead = false;
};

// New tokens (and a possible finish) of one sequence, for the OutputProcessor.
struct EngineCoreOutput {
  std::string req_id;
  std::vector<int32_t> new_token_ids;
  std::vector<PositionLogprobs> new_logprobs;
  std::optional<PromptLogprobsChunk> prompt_logprobs;
  RequestStatus status = RequestStatus::kRunning;  // a finished status when the scheduler ended it
  std::string error;                               // why, when status is kFinishedError
  StopReason stop_reason;
  int num_cached_tokens = 0;
  std::optional<RequestTimes> times;  // the sequence's phase times so far
};

}  // namespace specula
