// The one form every structured-output constraint compiles to: a context-free grammar over bytes.
// JSON Schema, regular expressions, choice lists and EBNF all build one through GrammarBuilder; the
// matcher (grammar_matcher.h) runs it. Terminals are byte sets rather than characters because
// tokens are byte strings that may end inside a UTF-8 character: a code point class becomes
// alternatives of byte sequences (GrammarBuilder::code_points).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace specula {

class ByteSet {
 public:
  ByteSet() = default;
  static ByteSet of(uint8_t b);
  static ByteSet range(uint8_t lo, uint8_t hi);  // inclusive
  static ByteSet all();
  void add(uint8_t b) { bits_[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi);
  bool contains(uint8_t b) const { return (bits_[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits_[0] | bits_[1] | bits_[2] | bits_[3]) == 0; }
  ByteSet complement() const;
  ByteSet& operator|=(const ByteSet& o);
  bool operator==(const ByteSet& o) const = default;
  std::string to_string() const;  // "[a-z_]"
  const std::array<uint64_t, 4>& bits() const { return bits_; }

 private:
  std::array<uint64_t, 4> bits_{};
};

// One symbol of a sequence: a byte of a set, or a reference to a rule.
struct Symbol {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  uint32_t id = 0;  // index of the byte set (kBytes) or the rule (kRule)
  bool operator==(const Symbol&) const = default;
};
using Sequence = std::vector<Symbol>;

class Grammar {
 public:
  struct Rule {
    std::string name;
    std::vector<Sequence> alternatives;  // an empty sequence matches the empty string
  };

  uint32_t root() const { return root_; }
  size_t num_rules() const { return rules_.size(); }
  const Rule& rule(uint32_t id) const { return rules_.at(id); }
  const ByteSet& byte_set(uint32_t id) const { return byte_sets_.at(id); }
  size_t num_byte_sets() const { return byte_sets_.size(); }
  // GBNF-like text, one rule a line, root first: for errors and tests.
  std::string to_string() const;

 private:
  friend class GrammarBuilder;
  std::vector<Rule> rules_;
  std::vector<ByteSet> byte_sets_;
  uint32_t root_ = 0;
};

// Builds a Grammar. Rules may be declared before they are defined (recursion); anonymous helper
// rules (star, repeat, ...) get unique names derived from `hint`. build() checks the grammar and
// throws specula::Error naming the rule for an undefined rule, left recursion (which a top-down
// matcher cannot run) or a root that matches nothing.
class GrammarBuilder {
 public:
  uint32_t declare(std::string_view name);  // a unique name is made if taken
  void define(uint32_t rule, std::vector<Sequence> alternatives);
  uint32_t add(std::string_view name, std::vector<Sequence> alternatives);  // declare + define
  std::optional<uint32_t> find(std::string_view name) const;

  Symbol bytes(const ByteSet& set);  // byte sets are interned
  static Symbol ref(uint32_t rule) { return {Symbol::Kind::kRule, rule}; }
  Sequence literal(std::string_view bytes);
  // One UTF-8 encoded code point in the inclusive ranges (or outside them all when `negated`),
  // surrogates excluded: an anonymous rule of byte sequences.
  Symbol code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated, std::string_view hint = "cp");
  Symbol choice(std::vector<Sequence> alternatives, std::string_view hint = "alt");
  Symbol optional(Sequence s, std::string_view hint = "opt");
  Symbol star(Sequence s, std::string_view hint = "star");
  Symbol plus(Sequence s, std::string_view hint = "plus");
  // s repeated min..max times (no max: unbounded).
  Symbol repeat(Sequence s, int min, std::optional<int> max, std::string_view hint = "rep");

  Grammar build(uint32_t root);

 private:
  Grammar g_;
  std::vector<bool> defined_;
  // Name -> rule, and per name the next suffix to try: declaring thousands of rules from one
  // hint (a long repeat) stays linear.
  std::unordered_map<std::string, uint32_t> rule_ids_;
  std::unordered_map<std::string, int> next_suffix_;
};

}  // namespace specula
