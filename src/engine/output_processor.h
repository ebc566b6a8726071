// OutputProcessor: turns the scheduler's per-sequence token outputs into the client-facing
// RequestOutput deltas: incremental detokenization per choice, stop strings matched across token
// boundaries (text that could start a stop string is held back), the stop token's text left out
// unless include_stop_str_in_output, logprobs, prompt logprobs, n > 1 choices joined into one
// stream. It runs on the engine loop thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/api.h"
#include "engine/scheduler_output.h"
#include "tokenizer/tokenizer.h"

namespace specula {

class OutputProcessor {
 public:
  explicit OutputProcessor(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // child_ids[i] is the sequence id of choice i.
  void add_request(const std::string& request_id, const std::vector<std::string>& child_ids, int num_prompt_tokens,
                   std::shared_ptr<const SamplingParams> params, std::shared_ptr<RequestStream> stream);

  // Pushes one RequestOutput per request with news. Returns the sequence ids a stop string ended
  // that the scheduler has not finished yet: the caller must finish them.
  std::vector<std::string> process(const std::vector<EngineCoreOutput>& outputs);

  // Final output for every unfinished choice with finish_reason "abort"; forgets the request.
  void abort(const std::string& request_id);
  // Final output carrying `message` as the error; forgets the request.
  void fail(const std::string& request_id, const std::string& message);

  bool has_request(const std::string& request_id) const { return requests_.count(request_id) > 0; }
  size_t num_requests() const { return requests_.size(); }
  // The client request a sequence belongs to ("" when unknown).
  std::string parent_of(const std::string& child_id) const;
  std::vector<std::string> request_ids() const;
  // The sequence ids of a client request's choices (empty when unknown).
  std::vector<std::string> children_of(const std::string& request_id) const;

 private:
  struct Choice {
    Choice(const Tokenizer& tok, bool skip_special, bool spaces_between)
        : detokenizer(tok, skip_special, spaces_between) {}
    std::string child_id;
    IncrementalDetokenizer detokenizer;
    std::string text;          // everything this choice produced (cut at a stop string)
    size_t sent = 0;           // bytes of `text` already streamed
    int num_tokens = 0;
    bool finished = false;
  };
  struct RequestState {
    std::string request_id;
    std::shared_ptr<const SamplingParams> params;
    std::shared_ptr<RequestStream> stream;
    std::deque<Choice> choices;
    int num_prompt_tokens = 0;
    int num_cached_tokens = 0;
    std::optional<RequestTimes> times;  // the latest phase times of its choices (choice 0 first)
    std::vector<std::optional<PositionLogprobs>> prompt_logprobs;  // when requested
    int prompt_logprobs_missing = 0;  // positions 1..P-1 not computed yet
    bool sent_prompt_logprobs = false;
    int num_unfinished = 0;
  };

  // Applies one sequence's new tokens to its choice; fills `delta`. Returns true when a stop string
  // ended a choice the scheduler still runs.
  bool apply(RequestState& req, Choice& choice, const EngineCoreOutput& out, ChoiceDelta& delta);

  const Tokenizer& tokenizer_;
  std::unordered_map<std::string, RequestState> requests_;
  std::unordered_map<std::string, std::pair<std::string, int>> child_to_parent_;  // -> (request, choice)
};

}  // namespace specula
