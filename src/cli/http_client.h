// A small blocking HTTP client for `specula bench serve`: one server (scheme, host, port and an
// optional path prefix from --base-url), JSON GET/POST, and streamed POSTs whose body is handed to
// the caller as it arrives, cut into Server-Sent Events by SseParser. cpp-httplib underneath; one
// HttpClient per thread (each holds its own connection).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace httplib {
class Client;
}

namespace specula::cli {

struct HttpTarget {
  std::string origin;  // "http://127.0.0.1:8000" (scheme, host, port; no trailing slash)
  std::string prefix;  // path before every route, "" or e.g. "/proxy" (no trailing slash)
  std::string api_key;  // sent as "Authorization: Bearer <key>" when not empty

  // From --base-url ("http://host:port[/prefix]"), or from --host/--port when base_url is empty.
  // Throws specula::Error on a URL it cannot use.
  static HttpTarget parse(const std::string& base_url, const std::string& host, int port);
  std::string url(const std::string& path) const { return origin + prefix + path; }
};

struct HttpResult {
  int status = 0;       // HTTP status; 0 when no answer came (see error)
  std::string body;     // the whole body (for streams: only when status != 200)
  std::string error;    // transport failure ("Connection refused ..."), empty otherwise
  bool ok() const { return error.empty() && status == 200; }
  // One line for an error report: the transport error, or "HTTP <status>: <body, shortened>".
  std::string describe() const;
};

class HttpClient {
 public:
  HttpClient(HttpTarget target, double timeout_s);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  const HttpTarget& target() const { return target_; }
  HttpResult get(const std::string& path);
  HttpResult post_json(const std::string& path, const std::string& body);
  // POSTs `body` and hands each piece of a 200 answer's body to on_data as it is received
  // (returning false from on_data cancels the request); other answers are collected in body.
  HttpResult post_stream(const std::string& path, const std::string& body,
                         const std::function<bool(std::string_view)>& on_data);

 private:
  HttpTarget target_;
  std::unique_ptr<httplib::Client> client_;
};

// Cuts an event stream into the data of each event ("data: ..." lines up to a blank line; several
// data lines of one event are joined with '\n'). Comments and other fields are skipped.
class SseParser {
 public:
  explicit SseParser(std::function<void(std::string_view data)> on_event) : on_event_(std::move(on_event)) {}
  void feed(std::string_view bytes);

 private:
  void line(std::string_view l);
  std::function<void(std::string_view)> on_event_;
  std::string pending_;  // bytes after the last newline
  std::string data_;     // data of the event being read
  bool has_data_ = false;
};

}  // namespace specula::cli
