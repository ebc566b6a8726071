// What every route handler shares: the engine, tokenizer and template, the served model's facts,
// the server-side metrics and the shutdown flag. Handlers only read it (metrics are atomic).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "server/metrics.h"
#include "server/request_parser.h"

namespace specula {
class ChatTemplate;
class LLMEngine;
class Tokenizer;
}  // namespace specula

namespace specula::server {

struct ServerState {
  ServerState(LLMEngine& e, const Tokenizer& t, int max_len) : engine(e), tokenizer(t), max_model_len(max_len), metrics(max_len) {}

  LLMEngine& engine;
  const Tokenizer& tokenizer;
  const ChatTemplate* chat_template = nullptr;  // null: the tokenizer has none (chat -> 400)
  std::string served_model_name;                // /v1/models id and the "model" of responses
  std::string model_root;                       // the checkpoint path (/v1/models root)
  int max_model_len;
  // Text longer than this cannot fit max_model_len: twice (normalisation can change the bytes)
  // the longest token's bytes times max_model_len. 0: no bound.
  size_t max_prompt_bytes = 0;
  RequestDefaults defaults;
  std::string reasoning_parser;                 // "" = off
  bool enable_auto_tool_choice = false;         // --enable-auto-tool-choice
  std::string tool_call_parser;                 // --tool-call-parser ("" = none)
  bool enable_prompt_tokens_details = false;    // usage.prompt_tokens_details.cached_tokens
  ServerMetrics metrics;
  // Shutdown: first `draining` (new requests get 503, in-flight ones may finish), then `stopping`
  // (in-flight ones end now: 503, or an error event and [DONE] on a stream).
  std::atomic<bool> draining{false};
  std::atomic<bool> stopping{false};
  std::atomic<int> active_runs{0};              // GenerationRuns alive (requests in flight)
};

}  // namespace specula::server
