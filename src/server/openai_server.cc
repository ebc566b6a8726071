#include "server/openai_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <httplib.h>

#include "core/error.h"
#include "core/logging.h"
#include "engine/llm_engine.h"
#include "server/api_error.h"
#include "server/api_key.h"
#include "server/reasoning_parser.h"
#include "server/tool_parser.h"
#include "server/routes.h"
#include "server/server_state.h"
#include "server/thread_pool.h"
#include "tokenizer/tokenizer.h"

namespace specula::server {

using nlohmann::json;

// httplib::Server with access to its listening socket, to widen the accept backlog: the packaged
// library listens with a backlog of 5, and a burst of hundreds of clients would see refused or
// retried connections.
class OpenAIServer::Http : public httplib::Server {
 public:
  int listening_socket() const { return svr_sock_; }
};

namespace {

using Handler = void (*)(ServerState&, const httplib::Request&, httplib::Response&);

std::string version_string() { return "0.1.0"; }

// Reason phrases for the access log and httplib's own error statuses.
const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "";
  }
}

size_t max_prompt_bytes(const Tokenizer& tokenizer, int max_model_len) {
  size_t longest = 0;
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id)
    longest = std::max(longest, tokenizer.token_bytes(static_cast<int32_t>(id)).size());
  return longest > 0 && max_model_len > 0 ? 2 * longest * static_cast<size_t>(max_model_len) : 0;
}

bool requires_api_key(const std::string& path) {
  return path.rfind("/v1", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

}  // namespace

OpenAIServer::OpenAIServer(LLMEngine& engine, const ChatTemplate* chat_template, ServerOptions options)
    : options_(std::move(options)), http_(std::make_unique<Http>()) {
  SPECULA_CHECK(!options_.served_model_name.empty(), "OpenAIServer: served_model_name is empty");
  SPECULA_CHECK(options_.reasoning_parser.empty() || ReasoningParser::is_known(options_.reasoning_parser),
                "--reasoning-parser {}: unknown parser (choose deepseek_r1 or qwen3)", options_.reasoning_parser);
  SPECULA_CHECK(options_.tool_call_parser.empty() || ToolParser::is_known(options_.tool_call_parser),
                "--tool-call-parser {}: unknown parser (choose one of {})", options_.tool_call_parser,
                fmt::join(ToolParser::names(), ", "));
  SPECULA_CHECK(!options_.enable_auto_tool_choice || !options_.tool_call_parser.empty(),
                "--enable-auto-tool-choice requires --tool-call-parser");
  state_ = std::make_unique<ServerState>(engine, engine.tokenizer(), engine.max_model_len());
  state_->chat_template = chat_template;
  state_->max_prompt_bytes = max_prompt_bytes(engine.tokenizer(), engine.max_model_len());
  state_->served_model_name = options_.served_model_name;
  state_->model_root = options_.model_root.empty() ? options_.served_model_name : options_.model_root;
  state_->defaults = options_.defaults;
  state_->reasoning_parser = options_.reasoning_parser;
  state_->enable_auto_tool_choice = options_.enable_auto_tool_choice;
  state_->tool_call_parser = options_.tool_call_parser;
  state_->enable_prompt_tokens_details = options_.enable_prompt_tokens_details;
  install_routes();
}

OpenAIServer::~OpenAIServer() { shutdown(); }

std::vector<std::pair<std::string, std::string>> OpenAIServer::routes() {
  return {{"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"}, {"/v1/models", "GET"},
          {"/tokenize", "POST"},            {"/detokenize", "POST"},     {"/health", "GET"},
          {"/version", "GET"},              {"/metrics", "GET"}};
}

void OpenAIServer::install_routes() {
  Http& s = *http_;
  ServerState* state = state_.get();
  ThreadPoolLimits limits;
  limits.max_threads = options_.max_threads;
  limits.join_timeout = options_.connection_join_timeout;
  limits.on_abandoned = [this](size_t n) { abandoned_connections_ += n; };
  s.new_task_queue = [limits] { return new GrowingThreadPool(limits); };
  s.set_keep_alive_max_count(1000);
  s.set_payload_max_length(options_.max_request_body_bytes);  // larger bodies: 413, never read whole
  // SO_REUSEADDR alone: a restart can bind while old connections sit in TIME_WAIT, but a second
  // server on a port in use fails to bind (the library's default adds SO_REUSEPORT, which lets
  // it start and share the port).
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.set_tcp_nodelay(true);  // SSE events are small: send each at once

  // Every handler's errors end here: ApiError -> its status and OpenAI body; anything else -> 500.
  auto wrap = [state](Handler h) {
    return [state, h](const httplib::Request& req, httplib::Response& res) {
      try {
        h(*state, req, res);
      } catch (const ApiError& e) {
        set_json(res, e.body(), e.status());
      } catch (const Error& e) {
        set_json(res, internal_error(e.what()).body(), 500);
      } catch (const std::exception& e) {
        LOG_ERROR("{} {} failed: {}", req.method, req.path, e.what());
        set_json(res, internal_error(e.what()).body(), 500);
      }
    };
  };
  s.Post("/v1/chat/completions", wrap(handle_chat_completions));
  s.Post("/v1/completions", wrap(handle_completions));
  s.Get("/v1/models", wrap(handle_models));
  s.Post("/tokenize", wrap(handle_tokenize));
  s.Post("/detokenize", wrap(handle_detokenize));
  s.Get("/metrics", wrap(handle_metrics));
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  s.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    set_json(res, {{"version", version_string()}});
  });

  // --api-key guards the /v1 routes, as vLLM's middleware does, and also /tokenize and /detokenize:
  // they run the tokenizer (and chat template) on whatever a client sends, so left open they are
  // free CPU for anyone who can reach the port. /health, /version and /metrics stay open for
  // probes and Prometheus.
  // While shutting down every new request gets 503 (load balancers stop sending on /health's).
  s.set_pre_routing_handler([state, key = options_.api_key](const httplib::Request& req, httplib::Response& res) {
    if (state->draining.load()) {
      set_json(res, service_unavailable("The server is shutting down.").body(), 503);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (key.empty() || req.method == "OPTIONS" || !requires_api_key(req.path))
      return httplib::Server::HandlerResponse::Unhandled;
    if (bearer_token_matches(req.get_header_value("Authorization"), key))
      return httplib::Server::HandlerResponse::Unhandled;
    set_json(res, {{"error", "Unauthorized"}}, 401);
    return httplib::Server::HandlerResponse::Handled;
  });

  // Statuses httplib produces itself (unknown route, unparsable HTTP) get an OpenAI body too.
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      set_json(res, error_body(404, "NotFoundError", fmt::format("Route {} {} not found.", req.method, req.path)), 404);
    } else {
      set_json(res, error_body(res.status, "BadRequestError", reason_phrase(res.status)), res.status);
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    LOG_ERROR("{} {} failed: {}", req.method, req.path, what);
    set_json(res, internal_error(what).body(), 500);
  });
  if (options_.access_log) {
    s.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      LOG_INFO("{}:{} - \"{} {} {}\" {} {}", req.remote_addr, req.remote_port, req.method, req.path, req.version,
               res.status, reason_phrase(res.status));
    });
  }
}

int OpenAIServer::bind() {
  Http& s = *http_;
  bool ok;
  if (options_.port == 0) {
    port_ = s.bind_to_any_port(options_.host);
    ok = port_ > 0;
  } else {
    ok = s.bind_to_port(options_.host, options_.port);
    port_ = options_.port;
  }
  SPECULA_CHECK(ok, "cannot listen on {}:{} (address in use, or not an address of this machine)", options_.host,
                options_.port);
  // Calling listen() again on a listening socket only changes its backlog (Linux).
  ::listen(s.listening_socket(), options_.listen_backlog);
  return port_;
}

void OpenAIServer::serve() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_->stopping) return;
    serving_ = true;
  }
  http_->listen_after_bind();
  {
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = false;
  }
  cv_.notify_all();
}

void OpenAIServer::shutdown() {
  if (!state_->draining.exchange(true)) {
    const auto deadline = std::chrono::steady_clock::now() + options_.shutdown_timeout;
    while (state_->active_runs.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (state_->active_runs.load() > 0)
      LOG_INFO("{} request(s) still in flight after the {} ms drain; ending them", state_->active_runs.load(),
               options_.shutdown_timeout.count());
  }
  state_->stopping = true;  // handlers see it within one wait slice and abort their requests
  // Give them that slice to send their 503 or error event: once the listener stops, the library
  // stops writing streamed responses.
  const auto ended_by = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (state_->active_runs.load() > 0 && std::chrono::steady_clock::now() < ended_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::unique_lock<std::mutex> lock(mu_);
  // stop() only takes once the listener runs: retry until serve() has returned.
  while (serving_) {
    http_->stop();
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

}  // namespace specula::server
