// Errors are values at the boundaries: a bad checkpoint, a bad request or a bad flag becomes one
// specula::Error with a message that names the file, tensor, key or parameter at fault.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace specula {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws specula::Error(fmt::format(...)) when `cond` is false.
#define SPECULA_CHECK(cond, ...)                                   \
  do {                                                             \
    if (!(cond)) throw ::specula::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

// An internal invariant: failing it is a bug in specula, not bad input.
#define SPECULA_ASSERT(cond)                                                                    \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw ::specula::Error(::fmt::format("internal error: {} ({}:{})", #cond, __FILE__, __LINE__)); \
  } while (0)

}  // namespace specula
