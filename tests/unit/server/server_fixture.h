// Starts an OpenAIServer on 127.0.0.1 (a free port) over the fake engine, with helpers to send
// JSON and read SSE streams.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fakes.h"
#include "server/openai_server.h"

namespace specula::testing {

using nlohmann::json;

struct HttpResult {
  int status = 0;
  std::string body;
  json json_body() const { return json::parse(body, nullptr, false); }
};

// "data: ..." events of an SSE body, in order ("[DONE]" kept as a string).
inline std::vector<json> sse_events(const std::string& body, bool* saw_done = nullptr) {
  std::vector<json> events;
  size_t pos = 0;
  if (saw_done) *saw_done = false;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    std::string data = ev.substr(6);
    if (data == "[DONE]") {
      if (saw_done) *saw_done = true;
      continue;
    }
    events.push_back(json::parse(data));
  }
  return events;
}

// A one-message chat request body.
inline json chat_body(bool stream) {
  return {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stream", stream}};
}

class ServerTest : public ::testing::Test {
 protected:
  void start(server::ServerOptions opts = {}) {
    opts.host = "127.0.0.1";
    opts.port = 0;
    if (opts.served_model_name.empty()) opts.served_model_name = "fake-model";
    opts.access_log = false;
    opts.shutdown_timeout = shutdown_timeout_;
    opts.connection_join_timeout = connection_join_timeout_;
    server_ = std::make_unique<server::OpenAIServer>(engine_, &template_, opts);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  void stop() {
    if (!server_) return;
    server_->shutdown();
    thread_.join();
    server_.reset();
  }
  void TearDown() override { stop(); }

  HttpResult post(const std::string& path, const std::string& body, httplib::Headers headers = {}) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30);
    auto r = c.Post(path.c_str(), headers, body, "application/json");
    if (!r) return {-1, ""};
    return {r->status, r->body};
  }
  HttpResult post(const std::string& path, const json& body, httplib::Headers headers = {}) {
    return post(path, body.dump(), headers);
  }
  HttpResult get(const std::string& path, httplib::Headers headers = {}) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30);
    auto r = c.Get(path.c_str(), headers);
    if (!r) return {-1, ""};
    return {r->status, r->body};
  }

  std::chrono::milliseconds shutdown_timeout_{0};  // tests of the drain set these before start()
  std::chrono::milliseconds connection_join_timeout_{3000};
  FakeEngine engine_;
  FakeChatTemplate template_;
  std::unique_ptr<server::OpenAIServer> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace specula::testing
