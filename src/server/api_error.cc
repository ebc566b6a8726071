#include "server/api_error.h"

namespace specula::server {

nlohmann::json error_body(int status, const std::string& type, const std::string& message,
                          const std::optional<std::string>& param) {
  nlohmann::json err = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}};
  if (param) err["param"] = *param;
  return {{"error", std::move(err)}};
}

nlohmann::json ApiError::body() const { return error_body(status_, type_, what(), param_); }

ApiError bad_request(const std::string& message, std::optional<std::string> param) {
  return ApiError(400, "BadRequestError", message, std::move(param));
}

ApiError not_found(const std::string& message, std::optional<std::string> param) {
  return ApiError(404, "NotFoundError", message, std::move(param));
}

ApiError service_unavailable(const std::string& message) {
  return ApiError(503, "ServiceUnavailableError", message);
}

ApiError internal_error(const std::string& message) {
  return ApiError(500, "InternalServerError", message);
}

}  // namespace specula::server
