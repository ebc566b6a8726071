#include "tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "tokenizer/utf8.h"

namespace specula::byte_level {
namespace {

// The largest code point of the alphabet: 256 + (number of non-printable bytes) - 1 = 0x143.
constexpr char32_t kMaxChar = 0x143;

struct Tables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, kMaxChar + 1> char_to_byte;  // -1: not in the alphabet

  Tables() {
    char_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : next++;
      utf8::append_codepoint(byte_to_utf8[b], c);
      char_to_byte[c] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

void encode(std::string_view bytes, std::string& out) {
  const auto& t = tables();
  for (char c : bytes) out.append(t.byte_to_utf8[static_cast<uint8_t>(c)]);
}

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  encode(bytes, out);
  return out;
}

std::optional<std::string> decode(std::string_view token) {
  const auto& t = tables();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    if (utf8::valid_sequence_length(token, i) == 0) return std::nullopt;
    const char32_t cp = utf8::next_codepoint(token, i);
    if (cp > kMaxChar || t.char_to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.char_to_byte[cp]));
  }
  return out;
}

}  // namespace specula::byte_level
