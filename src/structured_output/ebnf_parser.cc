#include "structured_output/ebnf_parser.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "structured_output/code_point_set.h"

namespace specula {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

class EbnfParser {
 public:
  explicit EbnfParser(std::string_view text) : t_(text) {}

  Grammar parse(std::string_view root_name) {
    skip_space();
    while (!eof()) {
      parse_rule();
      skip_space();
    }
    auto root = rules_.find(std::string(root_name));
    if (root == rules_.end() || !root->second.defined)
      throw Error(fmt::format("grammar: no rule named '{}' (the root) is defined", root_name));
    for (const auto& [name, info] : rules_)
      if (!info.defined) throw Error(fmt::format("grammar: undefined rule '{}' used at {}", name, where(info.first_use)));
    return b_.build(root->second.id);
  }

 private:
  struct RuleInfo {
    uint32_t id;
    bool defined = false;
    size_t first_use = 0;
  };

  std::string where(size_t pos) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos && i < t_.size(); ++i) {
      if (t_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    return fmt::format("{}:{}", line, col);
  }
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    throw Error(fmt::format("grammar: {} at {}", what, where(pos)));
  }
  bool eof() const { return pos_ >= t_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < t_.size() ? t_[pos_ + ahead] : '\0'; }

  void skip_space() {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view name_at(size_t pos) const {
    size_t end = pos;
    while (end < t_.size() && is_name_char(t_[end])) ++end;
    return t_.substr(pos, end - pos);
  }

  // `::=` or `=` at pos (after spaces on the same line); returns its length, 0 when absent.
  size_t definition_mark(size_t pos) const {
    while (pos < t_.size() && (t_[pos] == ' ' || t_[pos] == '\t')) ++pos;
    if (t_.substr(pos, 3) == "::=") return pos + 3;
    if (pos < t_.size() && t_[pos] == '=') return pos + 1;
    return 0;
  }
  // Does a new rule (`name ::=`) start at pos_?
  bool at_rule_start() const {
    std::string_view name = name_at(pos_);
    return !name.empty() && definition_mark(pos_ + name.size()) != 0;
  }

  uint32_t rule_id(std::string_view name, size_t use) {
    auto it = rules_.find(std::string(name));
    if (it == rules_.end()) it = rules_.emplace(std::string(name), RuleInfo{b_.declare(name), false, use}).first;
    return it->second.id;
  }

  void parse_rule() {
    const size_t start = pos_;
    std::string_view name = name_at(pos_);
    if (name.empty()) fail(pos_, "expected a rule name");
    size_t after = definition_mark(pos_ + name.size());
    if (after == 0) fail(pos_ + name.size(), fmt::format("expected '::=' after the rule name '{}'", name));
    uint32_t id = rule_id(name, start);
    RuleInfo& info = rules_[std::string(name)];
    if (info.defined) fail(start, fmt::format("rule '{}' is defined twice", name));
    info.defined = true;
    pos_ = after;
    current_ = std::string(name);
    std::vector<Sequence> alts = parse_alternatives(false);
    b_.define(id, std::move(alts));
  }

  std::vector<Sequence> parse_alternatives(bool nested) {
    std::vector<Sequence> alts;
    alts.push_back(parse_sequence(nested));
    while (peek() == '|' && !eof()) {
      ++pos_;
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  Sequence parse_sequence(bool nested) {
    Sequence seq;
    while (true) {
      skip_space();
      if (eof() || peek() == '|' || peek() == ')') break;
      if (!nested && at_rule_start()) break;
      Sequence item = parse_item();
      seq.insert(seq.end(), item.begin(), item.end());
    }
    if (peek() == ')' && !nested) fail(pos_, "unmatched ')'");
    return seq;
  }

  std::string hint(std::string_view what) { return fmt::format("{}_{}", current_, what); }  // the builder makes names unique

  Sequence parse_item() {
    Sequence s = parse_primary();
    while (true) {
      const size_t at = pos_;
      std::optional<std::pair<int, int>> q;  // max -1: unbounded
      if (peek() == '*') q = {0, -1}, ++pos_;
      else if (peek() == '+') q = {1, -1}, ++pos_;
      else if (peek() == '?') q = {0, 1}, ++pos_;
      else if (peek() == '{') q = parse_braces();
      if (!q) break;
      auto [min, max] = *q;
      if (min == 0 && max < 0) s = {b_.star(std::move(s), hint("star"))};
      else if (min == 1 && max < 0) s = {b_.plus(std::move(s), hint("plus"))};
      else if (min == 0 && max == 1) s = {b_.optional(std::move(s), hint("opt"))};
      else if (!(min == 1 && max == 1))
        s = {b_.repeat(std::move(s), min, max < 0 ? std::nullopt : std::optional<int>(max), current_ + "_rep")};
      (void)at;
    }
    return s;
  }

  std::optional<std::pair<int, int>> parse_braces() {
    const size_t open = pos_++;
    auto number = [&]() -> std::optional<int64_t> {
      skip_space();
      int64_t v = 0;
      size_t start = pos_;
      while (!eof() && peek() >= '0' && peek() <= '9') v = std::min<int64_t>(v * 10 + (t_[pos_++] - '0'), int64_t{1} << 40);
      if (pos_ == start) return std::nullopt;
      return v;
    };
    std::optional<int64_t> min = number(), max;
    if (!min) fail(pos_, "expected a repetition count after '{'");
    skip_space();
    bool comma = peek() == ',';
    if (comma) {
      ++pos_;
      max = number();
      skip_space();
    } else {
      max = min;
    }
    if (peek() != '}') fail(pos_, "expected '}' to close the repetition");
    ++pos_;
    if (*min > kMaxEbnfRepeat || (max && *max > kMaxEbnfRepeat))
      fail(open, fmt::format("a repetition count above {} is not supported", kMaxEbnfRepeat));
    if (max && *max < *min) fail(open, "the repetition's maximum is below its minimum");
    return std::pair<int, int>{static_cast<int>(*min), max ? static_cast<int>(*max) : -1};
  }

  Sequence parse_primary() {
    const size_t at = pos_;
    const char c = peek();
    if (c == '"' || c == '\'') return parse_string();
    if (c == '[') return {parse_class()};
    if (c == '.') {
      ++pos_;
      return {b_.code_points({{0, CodePointSet::kMax}}, false, hint("any"))};
    }
    if (c == '(') {
      ++pos_;
      skip_space();
      if (peek() == '=') fail(at, "lookahead assertions '(= ...)' are not supported");
      if (++group_depth_ > kMaxEbnfNesting) fail(at, fmt::format("groups nest deeper than {} levels", kMaxEbnfNesting));
      std::vector<Sequence> alts = parse_alternatives(true);
      if (peek() != ')') fail(pos_, "expected ')' to close the group opened at " + where(at));
      ++pos_;
      --group_depth_;
      if (alts.size() == 1) return alts[0];
      return {b_.choice(std::move(alts), hint("group"))};
    }
    std::string_view name = name_at(pos_);
    if (!name.empty()) {
      pos_ += name.size();
      return {GrammarBuilder::ref(rule_id(name, at))};
    }
    fail(at, fmt::format("expected a string, a character class, '.', '(' or a rule name, found '{}'", c));
  }

  uint32_t hex(int digits, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail(pos_, fmt::format("expected {} hex digits in the escape", digits));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > CodePointSet::kMax || (v >= 0xd800 && v <= 0xdfff))
      fail(at, fmt::format("the escape names U+{:X}, which is not a Unicode scalar value", v));
    return v;
  }

  // One character of a string or class (escapes decoded); pos_ advances past it.
  uint32_t parse_char(bool in_class) {
    const size_t at = pos_;
    if (peek() == '\\') {
      ++pos_;
      if (eof()) fail(at, "unterminated escape");
      const char e = t_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'f': return '\f';
        case 'v': return '\v';
        case 'b': return '\b';
        case '0': return 0;
        case '\\':
        case '"':
        case '\'':
        case '/': return static_cast<uint8_t>(e);
        case 'x': return hex(2, at);
        case 'u': return hex(4, at);
        case 'U': return hex(8, at);
        case '[':
        case ']':
        case '-':
        case '^':
          if (in_class) return static_cast<uint8_t>(e);
          [[fallthrough]];
        default: fail(at, fmt::format("unknown escape '\\{}'", e));
      }
    }
    uint32_t cp = 0;
    if (!decode_utf8(t_, pos_, cp)) fail(at, "invalid UTF-8");
    return cp;
  }

  Sequence parse_string() {
    const size_t open = pos_;
    const char quote = t_[pos_++];
    std::string bytes;
    while (true) {
      if (eof() || peek() == '\n') fail(open, "unterminated string literal");
      if (peek() == quote) break;
      append_utf8(bytes, parse_char(false));
    }
    ++pos_;
    return b_.literal(bytes);
  }

  Symbol parse_class() {
    const size_t open = pos_++;
    bool negated = peek() == '^';
    if (negated) ++pos_;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (true) {
      if (eof() || peek() == '\n') fail(open, "unterminated character class");
      if (peek() == ']') break;
      const size_t at = pos_;
      uint32_t lo = parse_char(true), hi = lo;
      if (peek() == '-' && peek(1) != ']') {
        ++pos_;
        if (eof()) fail(open, "unterminated character class");
        hi = parse_char(true);
        if (hi < lo) fail(at, "the class range is out of order");
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    if (ranges.empty() && !negated) fail(open, "an empty character class matches nothing");
    return b_.code_points(std::move(ranges), negated, hint("class"));
  }

  std::string_view t_;
  size_t pos_ = 0;
  int group_depth_ = 0;  // groups open at pos_
  GrammarBuilder b_;
  std::map<std::string, RuleInfo> rules_;
  std::string current_;
};

}  // namespace

Grammar parse_ebnf(std::string_view text, std::string_view root) { return EbnfParser(text).parse(root); }

}  // namespace specula
