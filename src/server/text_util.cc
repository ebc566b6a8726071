#include "server/text_util.h"

#include <cmath>
#include <random>

#include <fmt/format.h>

namespace specula::server {

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);  // shortest round-trip form, like repr()
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(n, '0');
  uint64_t bits = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i % 16 == 0) bits = rng();
    out[i] = kDigits[bits & 0xF];
    bits >>= 4;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // count every byte that starts a character
  return n;
}

}  // namespace specula::server
