// Small text helpers the server needs in several places.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace specula::server {

// A float the way Python's repr() prints it ("1.0", "0.25", "inf"), which is what vLLM's error
// messages and prometheus_client's exposition (le="1.0") show.
std::string py_float(double v);
// `n` random lowercase hex digits (request ids: "chatcmpl-" + random_hex(32)).
std::string random_hex(size_t n);
// Number of Unicode code points in UTF-8 text (Python's len(str), used for text_offset).
size_t utf8_length(std::string_view s);

}  // namespace specula::server
