// "Did you mean": Levenshtein distance, and the candidate nearest a mistyped key or flag.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace specula {

size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `key` (the first of equals); empty when there are none.
std::string_view nearest_key(std::string_view key, std::span<const std::string_view> candidates);

}  // namespace specula
