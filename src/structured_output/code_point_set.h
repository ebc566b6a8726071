// Sets of Unicode code points as sorted, merged inclusive ranges, and UTF-8 decoding of pattern
// text. The front ends (regex, EBNF, JSON strings) reason about characters; only at the end does
// GrammarBuilder::code_points turn a set into byte sequences. JSON string bodies need set algebra
// (a class minus the characters that must be escaped), which the builder does not offer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specula {

class CodePointSet {
 public:
  using Range = std::pair<uint32_t, uint32_t>;  // inclusive
  static constexpr uint32_t kMax = 0x10ffff;

  CodePointSet() = default;
  static CodePointSet of(uint32_t cp) { return range(cp, cp); }
  static CodePointSet range(uint32_t lo, uint32_t hi);
  static CodePointSet all() { return range(0, kMax); }

  void add(uint32_t lo, uint32_t hi);
  void add(const CodePointSet& o);
  CodePointSet complement() const;
  CodePointSet minus(const CodePointSet& o) const;
  bool contains(uint32_t cp) const;
  bool empty() const { return ranges_.empty(); }
  // Exactly one code point (regex literals lower to plain bytes).
  bool single() const { return ranges_.size() == 1 && ranges_[0].first == ranges_[0].second; }
  const std::vector<Range>& ranges() const { return ranges_; }

 private:
  std::vector<Range> ranges_;  // sorted, disjoint, not adjacent
};

// The UTF-8 encoding of `cp` appended to `out`.
void append_utf8(std::string& out, uint32_t cp);

// Decodes one code point of `text` at `pos` and advances `pos`; false (pos unchanged) when the
// bytes there are not valid UTF-8.
bool decode_utf8(std::string_view text, size_t& pos, uint32_t& cp);

}  // namespace specula
