#include "engine/stop_strings.h"

#include <algorithm>
#include <string_view>

namespace specula {

std::optional<StopStringMatch> find_stop_string(const std::string& text, size_t old_size,
                                                const std::vector<std::string>& stops) {
  std::optional<StopStringMatch> best;
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string& stop = stops[i];
    if (stop.empty() || stop.size() > text.size()) continue;
    const size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
    const size_t pos = text.find(stop, from);
    if (pos != std::string::npos && (!best || pos < best->position)) best = StopStringMatch{pos, i};
  }
  return best;
}

size_t stop_string_holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  const std::string_view t(text);
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    // The longest proper prefix of `stop` that the text ends with.
    for (size_t len = std::min(stop.size() - 1, text.size()); len > hold; --len) {
      if (t.substr(text.size() - len) == std::string_view(stop).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

}  // namespace specula
