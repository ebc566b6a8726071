// The route handlers behind OpenAIServer. Each reads the request, throws ApiError for a bad one
// (OpenAIServer turns it into the OpenAI error body) and fills the response, or installs an SSE
// content provider for a streamed one.
#pragma once

#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/server_state.h"

namespace specula::server {

void handle_chat_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_models(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_metrics(ServerState& state, const httplib::Request& req, httplib::Response& res);

// ---- helpers shared by the handlers ----

// The body as JSON (400 when malformed).
nlohmann::json parse_body(const httplib::Request& req);
// 404 with OpenAI's body when the request names a model this server does not serve.
void check_model(const ServerState& state, const nlohmann::json& body);
// Serialises for the wire; invalid UTF-8 (never expected) is replaced rather than throwing.
std::string dump(const nlohmann::json& j);
void set_json(httplib::Response& res, const nlohmann::json& j, int status = 200);
// One server-sent event.
inline std::string sse_event(const nlohmann::json& j) { return "data: " + dump(j) + "\n\n"; }
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
nlohmann::json stop_reason_json(const std::variant<std::monostate, int32_t, std::string>& r);
nlohmann::json finish_reason_json(FinishReason r);
// OpenAI's usage object (prompt_tokens_details when --enable-prompt-tokens-details).
nlohmann::json usage_json(const ServerState& state, int prompt_tokens, int completion_tokens, int cached_tokens);
// Token ids of a prompt after checking them against the vocabulary (400 naming `param`).
void check_token_ids(const ServerState& state, const std::vector<int32_t>& ids, const char* param);
// vLLM's warning for request fields the server does not act on, once per request.
void log_ignored_fields(const std::vector<std::string>& fields);
// The tokenizer's encode, after refusing text too long for max_model_len whatever its tokens
// (ServerState::max_prompt_bytes), so that a huge prompt costs no tokenization.
std::vector<int32_t> encode_prompt(const ServerState& state, const std::string& text, bool add_special_tokens,
                                   const char* param);
// SamplingParams for one prompt: max_tokens resolved against the prompt length.
SamplingParams params_for_prompt(const ServerState& state, const CommonRequest& req, int prompt_len);

}  // namespace specula::server

#include "server/connection_probe.h"
#include "server/generation.h"

namespace specula::server {

// The disconnect check a GenerationRun polls for this HTTP request's connection.
inline GenerationRun::ClientGone client_probe(const httplib::Request& http) {
  TcpEndpoints ep{http.local_addr, http.local_port, http.remote_addr, http.remote_port};
  return [ep] { return tcp_peer_closed(ep); };
}

// Streams SSE text produced by `pump` through httplib's chunked content provider. `pump` appends
// the next events to its argument and returns false when the stream is complete ([DONE] written)
// or must end. When the client stops reading, the run is cancelled (its engine requests abort).
void install_sse_stream(httplib::Response& res, std::shared_ptr<GenerationRun> run,
                        std::function<bool(std::string*)> pump);

}  // namespace specula::server
