// An error that leaves the server as an OpenAI-shaped JSON body, the way vLLM answers:
//   {"error": {"message": "...", "type": "BadRequestError", "param": "temperature", "code": 400}}
// Request parsing and the route handlers throw ApiError; one place turns it into the response.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace specula::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message,
           std::optional<std::string> param = std::nullopt)
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::optional<std::string>& param() const { return param_; }
  nlohmann::json body() const;

 private:
  int status_;
  std::string type_;
  std::optional<std::string> param_;
};

// The error types vLLM (and the OpenAI SDKs' typed errors) use for each status.
ApiError bad_request(const std::string& message, std::optional<std::string> param = std::nullopt);
ApiError not_found(const std::string& message, std::optional<std::string> param = std::nullopt);
ApiError internal_error(const std::string& message);
ApiError service_unavailable(const std::string& message);  // 503: retry elsewhere or later

// The OpenAI-shaped body for any status (e.g. a 404 for an unknown route).
nlohmann::json error_body(int status, const std::string& type, const std::string& message,
                          const std::optional<std::string>& param = std::nullopt);

}  // namespace specula::server
