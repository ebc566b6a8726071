// The OpenAI-compatible HTTP server (vLLM's API surface) over an LLMEngine:
//   POST /v1/chat/completions   POST /v1/completions   GET /v1/models
//   POST /tokenize   POST /detokenize   GET /health   GET /version   GET /metrics
// Built on cpp-httplib; each connection runs on its own worker thread, so a pool that grows on
// demand holds as many concurrent streams as max_threads allows. HTTP threads only call the
// engine's thread-safe add_request / abort / metrics.
#pragma once

#include <atomic>
#include <chrono>
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
  bool enable_auto_tool_choice = false; // tool_choice "auto" allowed (needs tool_call_parser)
  std::string tool_call_parser;         // "", or a ToolParser name (hermes, llama3_json, deepseek_v3)
  bool enable_prompt_tokens_details = false;
  bool access_log = true;               // uvicorn-style line per request
  size_t max_threads = 2048;            // upper bound on concurrent connections (streams)
  // Shutdown: requests in flight may finish for this long (vLLM's --shutdown-timeout), then end
  // with 503 / an error event; connections still busy a little later are not waited for.
  std::chrono::milliseconds shutdown_timeout{5000};
  std::chrono::milliseconds connection_join_timeout{3000};
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
  // Thread-safe. New requests get 503 at once; those in flight may finish within shutdown_timeout,
  // then end (503, or an error event and [DONE] on a stream) and abort their engine requests; the
  // listener closes and serve() returns.
  void shutdown();
  // Connections that were still busy (a client trickling its headers, say) when serve() stopped
  // waiting for them: their threads still run inside this server, so the process must exit
  // without destroying it (std::_Exit after the engine's shutdown).
  size_t abandoned_connections() const { return abandoned_connections_.load(); }

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
  std::atomic<size_t> abandoned_connections_{0};
};

}  // namespace specula::server
