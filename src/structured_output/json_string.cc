#include "structured_output/json_string.h"

#include <fmt/format.h>

namespace specula {

namespace {

constexpr std::string_view kAnyCharRule = "json_char";

// Both cases of a hex digit: `\u001F` and `\u001f` are the same character.
ByteSet hex_digit_of(int v) {
  ByteSet s = ByteSet::of(static_cast<uint8_t>("0123456789abcdef"[v]));
  if (v >= 10) s.add(static_cast<uint8_t>("0123456789ABCDEF"[v]));
  return s;
}

}  // namespace

Symbol json_string_char(GrammarBuilder& b, const CodePointSet& chars, std::string_view hint) {
  CodePointSet must_escape = CodePointSet::range(0, 0x1f);
  must_escape.add('"', '"');
  must_escape.add('\\', '\\');
  std::vector<Sequence> alts;
  CodePointSet raw = chars.minus(must_escape);
  if (!raw.empty()) alts.push_back({b.code_points(raw.ranges(), false, hint)});
  for (auto [lo, hi] : chars.ranges()) {
    for (uint32_t cp = lo; cp <= hi && cp < 0x80; ++cp) {
      std::string_view short_form;
      switch (cp) {
        case '"': short_form = "\\\""; break;
        case '\\': short_form = "\\\\"; break;
        case '/': short_form = "\\/"; break;
        case '\b': short_form = "\\b"; break;
        case '\f': short_form = "\\f"; break;
        case '\n': short_form = "\\n"; break;
        case '\r': short_form = "\\r"; break;
        case '\t': short_form = "\\t"; break;
        default: break;
      }
      if (!short_form.empty()) alts.push_back(b.literal(short_form));
      if (cp < 0x20 && short_form.empty()) {
        Sequence s = b.literal("\\u00");
        s.push_back(b.bytes(hex_digit_of(static_cast<int>(cp >> 4))));
        s.push_back(b.bytes(hex_digit_of(static_cast<int>(cp & 15))));
        alts.push_back(std::move(s));
      }
    }
  }
  if (alts.empty()) return GrammarBuilder::ref(b.add(hint, {}));  // matches nothing
  return b.choice(std::move(alts), hint);
}

Symbol json_any_string_char(GrammarBuilder& b) {
  if (auto id = b.find(kAnyCharRule)) return GrammarBuilder::ref(*id);
  CodePointSet plain = CodePointSet::all();
  plain = plain.minus(CodePointSet::range(0, 0x1f));
  plain = plain.minus(CodePointSet::of('"'));
  plain = plain.minus(CodePointSet::of('\\'));
  ByteSet hex = ByteSet::range('0', '9');
  hex.add_range('a', 'f');
  hex.add_range('A', 'F');
  ByteSet simple;
  for (char c : std::string_view("\"\\/bfnrt")) simple.add(static_cast<uint8_t>(c));
  Sequence unicode = b.literal("\\u");
  for (int i = 0; i < 4; ++i) unicode.push_back(b.bytes(hex));
  Sequence escape = b.literal("\\");
  escape.push_back(b.bytes(simple));
  std::vector<Sequence> alts{{b.code_points(plain.ranges(), false, "json_plain")}, escape, unicode};
  return GrammarBuilder::ref(b.add(kAnyCharRule, std::move(alts)));
}

}  // namespace specula
