// The OpenAI-compatible HTTP server (vLLM's API surface) over an LLMEngine:
//   POST /v1/chat/completions   POST /v1/completions   GET /v1/models
//   POST /tokenize   POST /detokenize   GET /health   GET /version   GET /metrics
// Built on cpp-httplib; each connection runs on its own worker thread, so a pool that grows on
// demand holds as many concurrent streams as max_threads allows. HTTP threads only call the
// engine's thread-safe add_request / abort / metrics.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/request_parser.h"

namespace specula {
class ChatTemplate;
class LLMEngine;
}  // namespace specula

namespace specula::server {

struct ServerState;

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;                      // 0: any free port (tests)
  std::string served_model_name;        // the model id clients name; required
  std::string model_root;               // the checkpoint path, shown as /v1/models root
  std::string api_key;                  // "": no authentication
  std::string reasoning_parser;         // "", deepseek_r1 or qwen3
  bool enable_prompt_tokens_details = false;
  bool access_log = true;               // uvicorn-style line per request
  size_t max_threads = 2048;            // upper bound on concurrent connections (streams)
  int listen_backlog = 4096;            // a burst of clients connecting at once must not be refused
  size_t max_request_body_bytes = 32u << 20;  // 413 past it (a max_model_len prompt is far smaller)
  RequestDefaults defaults;             // --max-logprobs, generation_config sampling defaults
};

class OpenAIServer {
 public:
  // `chat_template` may be null (chat requests then get a 400). The engine must be started.
  OpenAIServer(LLMEngine& engine, const ChatTemplate* chat_template, ServerOptions options);
  ~OpenAIServer();

  // Binds host:port and starts listening; returns the port. Throws specula::Error naming the address.
  int bind();
  // Serves until shutdown(); returns once every connection thread has finished.
  void serve();
  // Thread-safe: in-flight requests abort their engine requests, the listener closes, serve() returns.
  void shutdown();

  int port() const { return port_; }
  // (path, method) of every route, for the startup log.
  static std::vector<std::pair<std::string, std::string>> routes();

 private:
  class Http;
  void install_routes();

  ServerOptions options_;
  std::unique_ptr<ServerState> state_;
  std::unique_ptr<Http> http_;
  int port_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool serving_ = false;
};

}  // namespace specula::server
