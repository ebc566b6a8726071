// The engine's public face: what the server (and `specula generate`, and benchmarks) use. The
// HTTP threads only call add_request / abort / metrics and read RequestStreams; they never touch
// engine state, which belongs to the engine loop thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sampling/logprobs.h"
#include "sampling/sampling_params.h"

namespace specula {

// Why a choice stopped, as OpenAI reports it.
enum class FinishReason { kNone, kStop, kLength, kAbort };
std::string finish_reason_name(FinishReason r);  // "stop", "length", "abort"

// New output of one choice since the previous RequestOutput of the same request.
struct ChoiceDelta {
  int index = 0;
  std::vector<int32_t> token_ids;
  std::string text;                          // detokenized, never ends in a broken UTF-8 sequence
  std::vector<PositionLogprobs> logprobs;    // one per token, when requested
  FinishReason finish_reason = FinishReason::kNone;
  std::variant<std::monostate, int32_t, std::string> stop_reason;  // the stop token or string
};

// When a request went through the engine's phases (seconds on the engine's steady clock), on its
// final output: vLLM's queue (arrival -> first scheduled), prefill (-> first token), decode
// (first -> last token) and inference (scheduled -> last token) times come from these.
struct RequestTimes {
  double arrival = 0.0;
  double scheduled = 0.0;
  double first_token = 0.0;
  double last_token = 0.0;
};

struct RequestOutput {
  std::string request_id;
  std::vector<ChoiceDelta> choices;          // only choices with something new
  std::optional<std::vector<std::optional<PositionLogprobs>>> prompt_logprobs;  // first output only
  int num_prompt_tokens = 0;
  int num_cached_tokens = 0;                 // prompt tokens served from the prefix cache
  bool finished = false;                     // every choice has finished
  std::optional<std::string> error;          // the engine failed this request
  std::optional<RequestTimes> times;         // final output of a request that produced tokens
};

// A thread-safe queue of outputs for one request; the engine pushes, the server pops.
class RequestStream {
 public:
  void push(RequestOutput out);
  // Waits up to `timeout`; false on timeout. Once the final output has been popped, returns false
  // at once.
  bool pop(RequestOutput* out, std::chrono::milliseconds timeout);
  bool done() const;  // the final output has been pushed

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool final_pushed_ = false;
};

struct NewRequest {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
};

}  // namespace specula
