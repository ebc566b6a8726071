#include "structured_output/regex_to_grammar.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "structured_output/code_point_set.h"
#include "structured_output/json_string.h"

namespace specula {

namespace {

// The parsed pattern. An empty kConcat matches ""; an empty kAlt matches nothing.
struct Node {
  enum class Kind { kSet, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kConcat;
  CodePointSet set;          // kSet
  std::vector<Node> kids;    // kConcat, kAlt; kRepeat: one
  int min = 0, max = -1;     // kRepeat; -1: unbounded

  static Node of_set(CodePointSet s) {
    Node n;
    n.kind = Kind::kSet;
    n.set = std::move(s);
    return n;
  }
  static Node nothing() {
    Node n;
    n.kind = Kind::kAlt;
    return n;
  }
  bool is_nothing() const { return kind == Kind::kAlt && kids.empty(); }
};

bool nullable(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kSet: return false;
    case Node::Kind::kConcat: return std::all_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::Kind::kAlt: return std::any_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::Kind::kRepeat: return n.min == 0 || nullable(n.kids[0]);
  }
  return false;
}

// The node's language minus the empty string. An unbounded repeat of a nullable body would be a
// left-recursive rule (r ::= body r with body matching ""), so X{m,} with X nullable lowers to
// nonempty(X)*, the same language.
Node nonempty(const Node& n) {
  if (!nullable(n)) return n;
  Node out = Node::nothing();
  switch (n.kind) {
    case Node::Kind::kSet: return n;
    case Node::Kind::kConcat:
      // All kids nullable: the first non-empty kid is kid i, those before it empty.
      for (size_t i = 0; i < n.kids.size(); ++i) {
        Node first = nonempty(n.kids[i]);
        if (first.is_nothing()) continue;
        Node seq;
        seq.kids.push_back(std::move(first));
        seq.kids.insert(seq.kids.end(), n.kids.begin() + static_cast<std::ptrdiff_t>(i) + 1, n.kids.end());
        out.kids.push_back(std::move(seq));
      }
      return out;
    case Node::Kind::kAlt:
      for (const Node& k : n.kids) {
        Node ne = nonempty(k);
        if (!ne.is_nothing()) out.kids.push_back(std::move(ne));
      }
      return out;
    case Node::Kind::kRepeat: {
      if (n.max == 0) return out;
      Node body = nonempty(n.kids[0]);
      if (body.is_nothing()) return out;
      Node r;
      r.kind = Node::Kind::kRepeat;
      // A nullable body makes the lower bound moot: X{m,n} = X{0,n} when X matches "".
      r.min = 1;
      r.max = n.max;
      r.kids.push_back(std::move(body));
      return r;
    }
  }
  return out;
}

int64_t expansion(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kSet: return 1;
    case Node::Kind::kConcat:
    case Node::Kind::kAlt: {
      int64_t s = 1;
      for (const Node& k : n.kids) s = std::min(s + expansion(k), kMaxRegexExpansion + 1);
      return s;
    }
    case Node::Kind::kRepeat: {
      int64_t copies = std::max(n.max < 0 ? n.min + 1 : n.max, 1);
      return std::min(expansion(n.kids[0]) * copies, kMaxRegexExpansion + 1);
    }
  }
  return 1;
}

CodePointSet digits() { return CodePointSet::range('0', '9'); }
CodePointSet word() {
  CodePointSet s = CodePointSet::range('a', 'z');
  s.add('A', 'Z');
  s.add('0', '9');
  s.add('_', '_');
  return s;
}
CodePointSet space() {
  CodePointSet s = CodePointSet::range('\t', '\r');  // \t \n \v \f \r
  s.add(' ', ' ');
  return s;
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view p) : p_(p) {}

  Node parse() {
    Node n = parse_alt(0);
    if (pos_ < p_.size()) fail(pos_, "unmatched ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(fmt::format("regex: {} at offset {} of '{}'", what, at, p_));
  }
  bool eof() const { return pos_ >= p_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : '\0'; }

  Node parse_alt(int depth) {
    Node alt;
    alt.kind = Node::Kind::kAlt;
    alt.kids.push_back(parse_concat(depth));
    while (peek() == '|' && !eof()) {
      ++pos_;
      alt.kids.push_back(parse_concat(depth));
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  Node parse_concat(int depth) {
    Node seq;
    while (!eof() && peek() != '|' && !(peek() == ')' && depth > 0)) {
      const size_t at = pos_;
      if (peek() == ')') fail(at, "unmatched ')'");
      if (peek() == '^') {
        // Allowed only where nothing can precede it: the start of a top-level alternative.
        if (depth != 0 || !seq.kids.empty()) fail(at, "the anchor '^' is only supported at the pattern's start");
        ++pos_;
        continue;
      }
      if (peek() == '$') {
        ++pos_;
        if (depth != 0 || !(eof() || peek() == '|')) fail(at, "the anchor '$' is only supported at the pattern's end");
        continue;
      }
      Node atom = parse_atom();
      seq.kids.push_back(parse_quantifiers(std::move(atom)));
    }
    if (seq.kids.size() == 1) return std::move(seq.kids[0]);
    return seq;
  }

  // {m}, {m,}, {m,n}, {,n} at pos_; nullopt (pos_ unchanged) when the brace is a literal.
  std::optional<std::pair<int, int>> parse_braces() {
    size_t i = pos_ + 1;
    auto number = [&](std::optional<int64_t>& out) {
      int64_t v = 0;
      size_t start = i;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
        v = std::min<int64_t>(v * 10 + (p_[i] - '0'), int64_t{1} << 40);
        ++i;
      }
      if (i > start) out = v;
    };
    std::optional<int64_t> lo, hi;
    number(lo);
    bool comma = i < p_.size() && p_[i] == ',';
    if (comma) {
      ++i;
      number(hi);
    }
    if (i >= p_.size() || p_[i] != '}' || (!lo && !hi)) return std::nullopt;
    const size_t at = pos_;
    pos_ = i + 1;
    const int64_t min = lo.value_or(0);
    const int64_t max = comma ? hi.value_or(-1) : min;
    if (min > kMaxRegexRepeat || max > kMaxRegexRepeat)
      fail(at, fmt::format("a repetition count above {} is not supported", kMaxRegexRepeat));
    if (max >= 0 && max < min) fail(at, "the repetition's maximum is below its minimum");
    return std::pair<int, int>{static_cast<int>(min), static_cast<int>(max)};
  }

  Node parse_quantifiers(Node atom) {
    bool quantified = false;
    while (!eof()) {
      const size_t at = pos_;
      std::optional<std::pair<int, int>> q;
      if (peek() == '*') q = {0, -1}, ++pos_;
      else if (peek() == '+') q = {1, -1}, ++pos_;
      else if (peek() == '?') q = {0, 1}, ++pos_;
      else if (peek() == '{') q = parse_braces();
      if (!q) break;
      if (quantified) fail(at, "a quantifier cannot follow another quantifier");
      quantified = true;
      if (peek() == '?') ++pos_;  // lazy: same language
      else if (peek() == '+') fail(pos_, "possessive quantifiers are not supported");
      Node r;
      r.kind = Node::Kind::kRepeat;
      r.min = q->first;
      r.max = q->second;
      r.kids.push_back(std::move(atom));
      atom = std::move(r);
    }
    return atom;
  }

  Node parse_atom() {
    const size_t at = pos_;
    const char c = peek();
    if (c == '(') return parse_group();
    if (c == '[') return Node::of_set(parse_class());
    if (c == '.') {
      ++pos_;
      return Node::of_set(CodePointSet::all().minus(CodePointSet::of('\n')));
    }
    if (c == '\\') {
      ++pos_;
      return Node::of_set(parse_escape(false));
    }
    if (c == '*' || c == '+' || c == '?' || (c == '{' && parse_braces_peek())) fail(at, "nothing to repeat");
    return Node::of_set(CodePointSet::of(literal_code_point()));
  }

  bool parse_braces_peek() {
    const size_t save = pos_;
    bool is_quantifier = parse_braces().has_value();
    pos_ = save;
    return is_quantifier;
  }

  uint32_t literal_code_point() {
    uint32_t cp = 0;
    if (!decode_utf8(p_, pos_, cp)) fail(pos_, "invalid UTF-8");
    return cp;
  }

  Node parse_group() {
    const size_t at = pos_;
    ++pos_;  // '('
    if (peek() == '?') {
      const char k = peek(1);
      if (k == ':') {
        pos_ += 2;
      } else if (k == '=' || k == '!') {
        fail(at, "lookahead assertions are not supported");
      } else if (k == '<' && (peek(2) == '=' || peek(2) == '!')) {
        fail(at, "lookbehind assertions are not supported");
      } else if (k == '<' || (k == 'P' && peek(2) == '<') || k == '\'') {
        // A named capturing group: the name is irrelevant to the language.
        const char close = k == '\'' ? '\'' : '>';
        size_t end = p_.find(close, pos_ + (k == 'P' ? 3 : 2));
        if (end == std::string_view::npos) fail(at, "unterminated group name");
        pos_ = end + 1;
      } else if (k == 'P' && (peek(2) == '=' || peek(2) == '>')) {
        fail(at, "backreferences are not supported");
      } else if (k == '>') {
        fail(at, "atomic groups are not supported");
      } else if (k == '#') {
        fail(at, "comment groups are not supported");
      } else {
        fail(at, "inline flags and other (?...) groups are not supported");
      }
    }
    if (++group_depth_ > kMaxRegexNesting) fail(at, fmt::format("groups nest deeper than {} levels", kMaxRegexNesting));
    Node inner = parse_alt(1);
    if (peek() != ')' || eof()) fail(at, "missing ')' for the group opened");
    ++pos_;
    --group_depth_;
    return inner;
  }

  uint32_t hex_value(size_t count, size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < count; ++i) {
      const char h = peek();
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail(at, fmt::format("expected {} hex digits in the escape", count));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // \x{...} and \u{...}: hex digits up to '}'.
  uint32_t braced_hex(size_t at) {
    ++pos_;  // '{'
    uint32_t v = 0;
    size_t n = 0;
    while (!eof() && peek() != '}') {
      v = std::min<uint32_t>(v * 16 + hex_value(1, at), 0x110000);
      ++n;
    }
    if (eof() || n == 0) fail(at, "malformed braced hex escape");
    ++pos_;
    return v;
  }

  // After a backslash. In a class, \b is a backspace rather than a word boundary.
  CodePointSet parse_escape(bool in_class) {
    const size_t at = pos_ - 1;
    if (eof()) fail(at, "the pattern ends in a lone backslash");
    const char c = p_[pos_++];
    auto single = [](uint32_t cp) { return CodePointSet::of(cp); };
    switch (c) {
      case 'd': return digits();
      case 'D': return digits().complement();
      case 'w': return word();
      case 'W': return word().complement();
      case 's': return space();
      case 'S': return space().complement();
      case 'n': return single('\n');
      case 't': return single('\t');
      case 'r': return single('\r');
      case 'f': return single('\f');
      case 'v': return single('\v');
      case 'a': return single(7);
      case 'e': return single(27);
      case '0':
        if (peek() >= '0' && peek() <= '7') fail(at, "octal escapes are not supported");
        return single(0);
      case 'x':
      case 'u': {
        uint32_t cp = peek() == '{' ? braced_hex(at) : hex_value(c == 'x' ? 2 : 4, at);
        if (cp > CodePointSet::kMax || (cp >= 0xd800 && cp <= 0xdfff))
          fail(at, fmt::format("the escape names U+{:X}, which is not a Unicode scalar value", cp));
        return single(cp);
      }
      case 'b':
        if (in_class) return single('\b');
        fail(at, "word boundary assertions (\\b) are not supported");
      case 'B': fail(at, "word boundary assertions (\\B) are not supported");
      case 'A':
      case 'z':
      case 'Z':
      case 'G': fail(at, fmt::format("the anchor \\{} is not supported (use ^ and $ at the ends)", c));
      case 'k': fail(at, "backreferences (\\k) are not supported");
      case 'g': fail(at, "backreferences and subroutine calls (\\g) are not supported");
      case 'p':
      case 'P': fail(at, "Unicode property classes (\\p, \\P) are not supported");
      case 'c': fail(at, "control-character escapes (\\c) are not supported");
      case 'Q':
      case 'E': fail(at, "quoting (\\Q...\\E) is not supported");
      case 'X':
      case 'R':
      case 'K':
      case 'N':
      case 'h':
      case 'H':
      case 'V':
      case 'C': fail(at, fmt::format("the escape \\{} is not supported", c));
      default: break;
    }
    if (c >= '1' && c <= '9') fail(at, "backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail(at, fmt::format("unknown escape \\{}", c));
    --pos_;
    return single(literal_code_point());  // an escaped punctuation or other character: itself
  }

  CodePointSet posix_class(std::string_view name, size_t at) const {
    CodePointSet s;
    if (name == "alpha") s.add('a', 'z'), s.add('A', 'Z');
    else if (name == "digit") s = digits();
    else if (name == "alnum") s.add('a', 'z'), s.add('A', 'Z'), s.add('0', '9');
    else if (name == "upper") s.add('A', 'Z');
    else if (name == "lower") s.add('a', 'z');
    else if (name == "space") s = space();
    else if (name == "xdigit") s.add('0', '9'), s.add('a', 'f'), s.add('A', 'F');
    else if (name == "word") s = word();
    else if (name == "punct") s.add('!', '/'), s.add(':', '@'), s.add('[', '`'), s.add('{', '~');
    else fail(at, fmt::format("unknown POSIX class [:{}:]", name));
    return s;
  }

  CodePointSet parse_class() {
    const size_t open = pos_++;
    bool negated = false;
    if (peek() == '^') negated = true, ++pos_;
    CodePointSet set;
    bool first = true;
    while (true) {
      if (eof()) fail(open, "missing ']' for the character class opened");
      if (peek() == ']' && !first) break;
      first = false;
      const size_t at = pos_;
      if (peek() == '[' && peek(1) == ':') {
        size_t end = p_.find(":]", pos_ + 2);
        if (end == std::string_view::npos) fail(at, "malformed POSIX class");
        set.add(posix_class(p_.substr(pos_ + 2, end - pos_ - 2), at));
        pos_ = end + 2;
        continue;
      }
      CodePointSet item;
      if (peek() == '\\') {
        ++pos_;
        item = parse_escape(true);
      } else {
        item = CodePointSet::of(literal_code_point());
      }
      if (item.single() && peek() == '-' && peek(1) != ']' && pos_ + 1 < p_.size()) {
        ++pos_;  // '-'
        CodePointSet hi;
        if (peek() == '\\') {
          ++pos_;
          hi = parse_escape(true);
        } else {
          hi = CodePointSet::of(literal_code_point());
        }
        if (!hi.single()) fail(at, "a class range cannot end in a class escape");
        const uint32_t lo_cp = item.ranges()[0].first, hi_cp = hi.ranges()[0].first;
        if (lo_cp > hi_cp) fail(at, "the class range is out of order");
        set.add(lo_cp, hi_cp);
        continue;
      }
      set.add(item);
    }
    ++pos_;  // ']'
    return negated ? set.complement() : set;
  }

  std::string_view p_;
  size_t pos_ = 0;
  int group_depth_ = 0;  // groups open at pos_
};

class Lowering {
 public:
  Lowering(GrammarBuilder& b, RegexTarget target, std::string name) : b_(b), target_(target), name_(std::move(name)) {}

  Sequence lower(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kSet: return {set_symbol(n.set)};
      case Node::Kind::kConcat: {
        Sequence out;
        for (const Node& k : n.kids) {
          Sequence s = lower(k);
          out.insert(out.end(), s.begin(), s.end());
        }
        return out;
      }
      case Node::Kind::kAlt: {
        if (n.kids.size() == 1) return lower(n.kids[0]);
        std::vector<Sequence> alts;
        for (const Node& k : n.kids) alts.push_back(lower(k));
        return {alts.empty() ? GrammarBuilder::ref(b_.add(hint("none"), {})) : b_.choice(std::move(alts), hint("alt"))};
      }
      case Node::Kind::kRepeat: {
        const Node* body = &n.kids[0];
        int min = n.min;
        Node ne;
        if (n.max < 0 && nullable(*body)) {
          ne = nonempty(*body);
          body = &ne;
          min = 0;
          if (ne.is_nothing()) return {};
        }
        Sequence s = lower(*body);
        if (n.max == 0) return {};
        if (min == 0 && n.max < 0) return {b_.star(std::move(s), hint("star"))};
        if (min == 1 && n.max < 0) return {b_.plus(std::move(s), hint("plus"))};
        if (min == 0 && n.max == 1) return {b_.optional(std::move(s), hint("opt"))};
        if (min == 1 && n.max == 1) return s;
        return {b_.repeat(std::move(s), min, n.max < 0 ? std::nullopt : std::optional<int>(n.max), name_ + "_rep")};
      }
    }
    return {};
  }

 private:
  std::string hint(std::string_view what) { return fmt::format("{}_{}", name_, what); }  // the builder makes names unique

  Symbol set_symbol(const CodePointSet& set) {
    if (set.empty()) return GrammarBuilder::ref(b_.add(hint("none"), {}));
    if (target_ == RegexTarget::kJsonStringBody) return json_string_char(b_, set, hint("char"));
    if (set.single()) {
      std::string bytes;
      append_utf8(bytes, set.ranges()[0].first);
      Sequence s = b_.literal(bytes);
      return s.size() == 1 ? s[0] : b_.choice({std::move(s)}, hint("cp"));
    }
    return b_.code_points(set.ranges(), false, hint("cp"));
  }

  GrammarBuilder& b_;
  RegexTarget target_;
  std::string name_;
};

}  // namespace

uint32_t add_regex_rule(GrammarBuilder& builder, std::string_view pattern, RegexTarget target, std::string_view name) {
  Node root = RegexParser(pattern).parse();
  SPECULA_CHECK(expansion(root) <= kMaxRegexExpansion,
                "regex: '{}' expands to more than {} grammar symbols (nested repetition counts multiply)", pattern,
                kMaxRegexExpansion);
  uint32_t rule = builder.declare(name);
  Lowering lowering(builder, target, std::string(name));
  builder.define(rule, {lowering.lower(root)});
  return rule;
}

Grammar regex_to_grammar(std::string_view pattern) {
  GrammarBuilder b;
  uint32_t root = add_regex_rule(b, pattern, RegexTarget::kRaw, "root");
  return b.build(root);
}

}  // namespace specula
