// One HTTP request's generation: its engine requests (one per prompt, each with n choices), the
// outputs as they arrive from their RequestStreams, the per-choice accumulated state, and the
// latencies the server measures (TTFT, inter-token, end-to-end). Used by both OpenAI routes,
// streamed or not. Destroying a run aborts whatever is unfinished, so a client that goes away
// (or a server that shuts down) frees its KV blocks.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/api.h"
#include "server/server_state.h"

namespace specula::server {

class GenerationRun {
 public:
  using Clock = std::chrono::steady_clock;
  // Polled while no output arrives; true when the client has disconnected.
  using ClientGone = std::function<bool()>;

  struct Choice {
    int index = 0;                     // OpenAI's choice index: prompt * n + j
    int prompt = 0;
    std::string text;
    std::vector<int32_t> token_ids;
    std::vector<PositionLogprobs> logprobs;
    FinishReason finish_reason = FinishReason::kNone;
    std::variant<std::monostate, int32_t, std::string> stop_reason;
    std::optional<Clock::time_point> last_token_at;
  };
  struct Prompt {
    std::string request_id;
    std::vector<int32_t> token_ids;
    std::shared_ptr<RequestStream> stream;
    bool finished = false;
    bool saw_first_token = false;
    int num_cached_tokens = 0;
    int generated_tokens = 0;
    std::optional<std::vector<std::optional<PositionLogprobs>>> prompt_logprobs;
  };
  // One RequestOutput of prompt `prompt`, with choice indices already made global.
  struct Update {
    int prompt = 0;
    RequestOutput output;
  };

  GenerationRun(ServerState& state, std::string id, Clock::time_point arrival, ClientGone client_gone);
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  // Queues one engine request per prompt (ids "<id>-<i>" when there are several, as vLLM does).
  // An engine refusal (specula::Error) becomes a 400 ApiError, after aborting what was queued.
  void submit(std::vector<std::vector<int32_t>> prompts, const std::vector<SamplingParams>& params);

  // Waits for the next output. False when every prompt has finished, or the run was cancelled
  // (client gone, server stopping; see cancelled()).
  bool next(Update* update);
  bool cancelled() const { return cancelled_; }
  // Cancelled because the server is shutting down (not because the client left): the client is
  // still there and gets a 503 or, on a stream, an error event and [DONE].
  bool stopped_by_shutdown() const { return stopped_by_shutdown_; }
  // The engine failed a request (RequestOutput::error); the run ends with it.
  const std::optional<std::string>& error() const { return error_; }
  // Aborts every unfinished engine request and counts its choices as aborted.
  void cancel();

  const std::string& id() const { return id_; }
  int n() const { return n_; }
  const std::vector<Prompt>& prompts() const { return prompts_; }
  const std::vector<Choice>& choices() const { return choices_; }
  int prompt_tokens() const;
  int completion_tokens() const;
  int cached_tokens() const;

 private:
  void apply(int prompt, RequestOutput* out);

  ServerState& state_;
  std::string id_;
  Clock::time_point arrival_;
  ClientGone client_gone_;
  Clock::time_point last_probe_;
  int n_ = 1;
  std::vector<Prompt> prompts_;
  std::vector<Choice> choices_;
  size_t unfinished_ = 0;
  size_t rr_ = 0;  // round-robin start among several prompts' streams
  bool cancelled_ = false;
  bool stopped_by_shutdown_ = false;
  std::optional<std::string> error_;
};

}  // namespace specula::server
