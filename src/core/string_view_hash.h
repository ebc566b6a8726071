// Hash for looking up std::string keys with a std::string_view, without a temporary string
// (a heap allocation for ids past the small-string buffer): per-request maps are read every step.
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>

namespace specula {

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  // namespace specula
