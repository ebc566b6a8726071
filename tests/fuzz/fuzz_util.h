// Shared by the libFuzzer targets: which exceptions are an expected answer to bad input.
//
// A target calls the production entry points on arbitrary bytes. The project's error types
// (specula::Error and, for the server, specula::server::ApiError) are how bad input is refused;
// anything else that escapes (std::out_of_range, nlohmann's exceptions, std::bad_alloc, ...)
// is a bug: it is let through, libFuzzer reports the uncaught exception as a crash and saves the
// input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace specula::fuzz {

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace specula::fuzz
