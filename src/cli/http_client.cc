#include "cli/http_client.h"

#include <httplib.h>

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace specula::cli {
namespace {

std::string transport_error(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "connection refused or host unreachable";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    case httplib::Error::Read: return "connection closed while reading the answer";
    case httplib::Error::Write: return "connection closed while sending the request";
    case httplib::Error::Canceled: return "request cancelled";
    default: return "HTTP error: " + httplib::to_string(e);
  }
}

HttpResult from(const httplib::Result& r) {
  HttpResult out;
  if (!r) {
    out.error = transport_error(r.error());
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  return out;
}

}  // namespace

HttpTarget HttpTarget::parse(const std::string& base_url, const std::string& host, int port) {
  HttpTarget t;
  if (base_url.empty()) {
    SPECULA_CHECK(port > 0 && port < 65536, "--port {}: expected 1..65535", port);
    const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
    t.origin = fmt::format("http://{}{}{}:{}", v6 ? "[" : "", host, v6 ? "]" : "", port);
    return t;
  }
  const size_t scheme_end = base_url.find("://");
  SPECULA_CHECK(scheme_end != std::string::npos, "--base-url {}: expected http://HOST[:PORT][/PREFIX]", base_url);
  const std::string scheme = base_url.substr(0, scheme_end);
  SPECULA_CHECK(scheme == "http" || scheme == "https", "--base-url {}: the scheme must be http or https", base_url);
  const size_t path_start = base_url.find('/', scheme_end + 3);
  const std::string authority = base_url.substr(scheme_end + 3, path_start == std::string::npos
                                                                     ? std::string::npos
                                                                     : path_start - scheme_end - 3);
  SPECULA_CHECK(!authority.empty(), "--base-url {}: no host", base_url);
  t.origin = scheme + "://" + authority;
  if (path_start != std::string::npos) t.prefix = base_url.substr(path_start);
  while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  return t;
}

std::string HttpResult::describe() const {
  if (!error.empty()) return error;
  std::string b = body;
  for (char& c : b) if (c == '\n' || c == '\r') c = ' ';
  if (b.size() > 500) b = b.substr(0, 500) + "...";
  return fmt::format("HTTP {}: {}", status, b);
}

HttpClient::HttpClient(HttpTarget target, double timeout_s)
    : target_(std::move(target)), client_(std::make_unique<httplib::Client>(target_.origin)) {
  const auto secs = static_cast<time_t>(timeout_s);
  const auto usecs = static_cast<time_t>(std::fmod(timeout_s, 1.0) * 1e6);
  client_->set_connection_timeout(std::min<time_t>(secs, 10), secs >= 10 ? 0 : usecs);
  client_->set_read_timeout(secs, usecs);
  client_->set_write_timeout(secs, usecs);
  client_->set_keep_alive(true);
  client_->set_tcp_nodelay(true);  // no 40 ms delayed-ACK stalls between small requests
  if (!target_.api_key.empty()) client_->set_bearer_token_auth(target_.api_key);
}

HttpClient::~HttpClient() = default;

HttpResult HttpClient::get(const std::string& path) { return from(client_->Get(target_.prefix + path)); }

HttpResult HttpClient::post_json(const std::string& path, const std::string& body) {
  return from(client_->Post(target_.prefix + path, body, "application/json"));
}

HttpResult HttpClient::post_stream(const std::string& path, const std::string& body,
                                   const std::function<bool(std::string_view)>& on_data) {
  httplib::Request req;
  req.method = "POST";
  req.path = target_.prefix + path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.set_header("Accept-Encoding", "identity");  // chunks as they are sent, never a compressed whole
  HttpResult out;
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (out.status != 200) {
      out.body.append(data, n);
      return true;
    }
    return on_data(std::string_view(data, n));
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = client_->send(req, res, err);
  if (!sent) {
    out.error = transport_error(err);
    return out;
  }
  out.status = res.status;
  if (out.body.empty() && out.status != 200) out.body = res.body;
  return out;
}

void SseParser::feed(std::string_view bytes) {
  pending_.append(bytes);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view l(pending_.data() + start, nl - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    line(l);
  }
  pending_.erase(0, start);
}

void SseParser::line(std::string_view l) {
  if (l.empty()) {  // end of an event
    if (has_data_) on_event_(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.substr(0, 5) != "data:") return;  // comments (":"), event:, id:, retry:
  l.remove_prefix(5);
  if (!l.empty() && l.front() == ' ') l.remove_prefix(1);
  if (has_data_) data_ += '\n';
  data_.append(l);
  has_data_ = true;
}

}  // namespace specula::cli
