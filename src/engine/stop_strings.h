// Stop strings matched on the detokenized text, across token boundaries.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace specula {

struct StopStringMatch {
  size_t position = 0;  // byte offset of the match in the text
  size_t stop_index = 0;
};

// The earliest match that ends after `old_size` (matches ending earlier were already seen when
// the text was that long).
std::optional<StopStringMatch> find_stop_string(const std::string& text, size_t old_size,
                                                const std::vector<std::string>& stops);

// Bytes at the end of `text` that could be the start of a stop string, to be held back from a
// stream until the next tokens decide.
size_t stop_string_holdback(const std::string& text, const std::vector<std::string>& stops);

}  // namespace specula
