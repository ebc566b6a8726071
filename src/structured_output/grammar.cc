#include "structured_output/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace specula {

ByteSet ByteSet::of(uint8_t b) {
  ByteSet s;
  s.add(b);
  return s;
}

ByteSet ByteSet::range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add_range(lo, hi);
  return s;
}

ByteSet ByteSet::all() { return range(0, 255); }

void ByteSet::add_range(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
}

ByteSet ByteSet::complement() const {
  ByteSet s;
  for (int i = 0; i < 4; ++i) s.bits_[i] = ~bits_[i];
  return s;
}

ByteSet& ByteSet::operator|=(const ByteSet& o) {
  for (int i = 0; i < 4; ++i) bits_[i] |= o.bits_[i];
  return *this;
}

std::string ByteSet::to_string() const {
  auto show = [](int b) {
    if (b >= 0x21 && b < 0x7f && b != '\\' && b != ']' && b != '-' && b != '^') return std::string(1, char(b));
    return fmt::format("\\x{:02x}", b);
  };
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!contains(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && contains(static_cast<uint8_t>(e + 1))) ++e;
    out += show(b);
    if (e > b) out += (e > b + 1 ? "-" : "") + show(e);
    b = e + 1;
  }
  return out + "]";
}

std::string Grammar::to_string() const {
  std::string out;
  auto write_rule = [&](uint32_t id) {
    const Rule& r = rules_[id];
    out += r.name + " ::=";
    for (size_t a = 0; a < r.alternatives.size(); ++a) {
      if (a > 0) out += " |";
      if (r.alternatives[a].empty()) out += " \"\"";
      for (const Symbol& s : r.alternatives[a])
        out += " " + (s.kind == Symbol::Kind::kRule ? rules_[s.id].name : byte_sets_[s.id].to_string());
    }
    out += "\n";
  };
  write_rule(root_);
  for (uint32_t i = 0; i < rules_.size(); ++i)
    if (i != root_) write_rule(i);
  return out;
}

uint32_t GrammarBuilder::declare(std::string_view name) {
  const std::string base(name.empty() ? "rule" : name);
  std::string unique = base;
  if (rule_ids_.count(unique)) {
    int& n = next_suffix_[base];
    do unique = fmt::format("{}_{}", base, ++n);
    while (rule_ids_.count(unique));
  }
  const auto id = static_cast<uint32_t>(g_.rules_.size());
  rule_ids_.emplace(unique, id);
  g_.rules_.push_back({unique, {}});
  defined_.push_back(false);
  return id;
}

void GrammarBuilder::define(uint32_t rule, std::vector<Sequence> alternatives) {
  SPECULA_ASSERT(rule < g_.rules_.size());
  SPECULA_CHECK(!defined_[rule], "grammar: rule '{}' is defined twice", g_.rules_[rule].name);
  g_.rules_[rule].alternatives = std::move(alternatives);
  defined_[rule] = true;
}

uint32_t GrammarBuilder::add(std::string_view name, std::vector<Sequence> alternatives) {
  uint32_t id = declare(name);
  define(id, std::move(alternatives));
  return id;
}

std::optional<uint32_t> GrammarBuilder::find(std::string_view name) const {
  auto it = rule_ids_.find(std::string(name));
  if (it == rule_ids_.end()) return std::nullopt;
  return it->second;
}

Symbol GrammarBuilder::bytes(const ByteSet& set) {
  auto it = std::find(g_.byte_sets_.begin(), g_.byte_sets_.end(), set);
  if (it == g_.byte_sets_.end()) it = g_.byte_sets_.insert(g_.byte_sets_.end(), set);
  return {Symbol::Kind::kBytes, static_cast<uint32_t>(it - g_.byte_sets_.begin())};
}

Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence s;
  for (char c : text) s.push_back(bytes(ByteSet::of(static_cast<uint8_t>(c))));
  return s;
}

namespace {

// Code point boundaries of the UTF-8 encoding lengths.
constexpr uint32_t kMaxOfLength[] = {0, 0x7f, 0x7ff, 0xffff, 0x10ffff};

void encode(uint32_t cp, int len, uint8_t* out) {
  if (len == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  for (int i = len - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3f));
    cp >>= 6;
  }
  static constexpr uint8_t kLead[] = {0, 0, 0xc0, 0xe0, 0xf0};
  out[0] = static_cast<uint8_t>(kLead[len] | cp);
}

}  // namespace

Symbol GrammarBuilder::code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated,
                                   std::string_view hint) {
  // Normalise: sorted, merged, surrogates and out-of-range removed, complemented when negated.
  std::vector<std::pair<uint32_t, uint32_t>> cut;
  for (auto [lo, hi] : ranges) {
    if (lo > hi) continue;
    hi = std::min<uint32_t>(hi, 0x10ffff);
    if (lo <= 0xdfff && hi >= 0xd800) {
      if (lo < 0xd800) cut.emplace_back(lo, 0xd7ff);
      if (hi > 0xdfff) cut.emplace_back(0xe000, hi);
    } else if (lo <= hi) {
      cut.emplace_back(lo, hi);
    }
  }
  std::sort(cut.begin(), cut.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto r : cut) {
    if (!merged.empty() && r.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> inv;
    uint32_t next = 0;
    for (auto [lo, hi] : merged) {
      if (lo > next) inv.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= 0x10ffff) inv.emplace_back(next, 0x10ffff);
    merged.clear();
    for (auto [lo, hi] : inv) {  // drop surrogates again
      if (lo <= 0xdfff && hi >= 0xd800) {
        if (lo < 0xd800) merged.emplace_back(lo, 0xd7ff);
        if (hi > 0xdfff) merged.emplace_back(0xe000, hi);
      } else {
        merged.emplace_back(lo, hi);
      }
    }
  }

  // Each range splits into pieces of one encoded length whose byte sequences form a product of
  // byte ranges: split recursively where the leading bytes differ (the classic UTF-8 range split).
  std::vector<Sequence> alternatives;
  ByteSet ascii;
  std::function<void(uint32_t, uint32_t, int)> split = [&](uint32_t lo, uint32_t hi, int len) {
    if (len == 1) {
      ascii.add_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
      return;
    }
    for (int i = 1; i < len; ++i) {
      const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          split(lo, lo | m, len);
          split((lo | m) + 1, hi, len);
          return;
        }
        if ((hi & m) != m) {
          split(lo, (hi & ~m) - 1, len);
          split(hi & ~m, hi, len);
          return;
        }
      }
    }
    uint8_t a[4], b[4];
    encode(lo, len, a);
    encode(hi, len, b);
    Sequence seq;
    for (int i = 0; i < len; ++i) seq.push_back(bytes(ByteSet::range(a[i], b[i])));
    alternatives.push_back(std::move(seq));
  };
  for (auto [lo, hi] : merged) {
    for (int len = 1; len <= 4; ++len) {
      const uint32_t min = len == 1 ? 0 : kMaxOfLength[len - 1] + 1;
      const uint32_t a = std::max(lo, min), b = std::min(hi, kMaxOfLength[len]);
      if (a <= b) split(a, b, len);
    }
  }
  if (!ascii.empty()) alternatives.insert(alternatives.begin(), Sequence{bytes(ascii)});
  if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
  SPECULA_CHECK(!alternatives.empty(), "grammar: the character class in '{}' matches no character", hint);
  return ref(add(hint, std::move(alternatives)));
}

Symbol GrammarBuilder::choice(std::vector<Sequence> alternatives, std::string_view hint) {
  if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
  return ref(add(hint, std::move(alternatives)));
}

Symbol GrammarBuilder::optional(Sequence s, std::string_view hint) { return ref(add(hint, {std::move(s), {}})); }

Symbol GrammarBuilder::star(Sequence s, std::string_view hint) {
  // Right recursion: the matcher's tail calls keep the stack flat however long the repetition.
  uint32_t r = declare(hint);
  s.push_back(ref(r));
  define(r, {std::move(s), {}});
  return ref(r);
}

Symbol GrammarBuilder::plus(Sequence s, std::string_view hint) {
  Sequence once = s;
  once.push_back(star(std::move(s), hint));
  return ref(add(hint, {std::move(once)}));
}

Symbol GrammarBuilder::repeat(Sequence s, int min, std::optional<int> max, std::string_view hint) {
  SPECULA_CHECK(min >= 0 && (!max || *max >= min), "grammar: repetition {{{},{}}} in '{}' is empty", min,
                max ? std::to_string(*max) : "", hint);
  Sequence out;
  for (int i = 0; i < min; ++i) out.insert(out.end(), s.begin(), s.end());
  if (!max) {
    out.push_back(star(s, hint));
  } else if (*max > min) {
    // Nested optionals, innermost first: tail_k ::= s tail_{k-1} | "" matches 0..k more copies.
    Symbol tail = optional(s, hint);
    for (int k = 2; k <= *max - min; ++k) {
      Sequence more = s;
      more.push_back(tail);
      tail = optional(std::move(more), hint);
    }
    out.push_back(tail);
  }
  if (out.size() == 1) return out[0];
  return ref(add(hint, {std::move(out)}));
}

namespace {

// The rules with an alternative whose every symbol holds: a byte set where `bytes_hold` says so, a
// rule where it is itself in the result. Linear in the grammar's size (a pass per change would be
// quadratic on a chain of 10^5 rules): each alternative counts the rule symbols not yet known to
// hold, and a rule found to hold decrements the alternatives that use it.
template <typename BytesHold>
std::vector<bool> rules_with_a_holding_alternative(const Grammar& g, BytesHold bytes_hold) {
  const size_t n = g.num_rules();
  std::vector<bool> holds(n, false);
  std::vector<uint32_t> owner;                 // per alternative: its rule
  std::vector<uint32_t> pending;               // per alternative: rule symbols not known to hold
  std::vector<std::vector<uint32_t>> used_in(n);  // per rule: the alternatives using it, once a use
  std::vector<uint32_t> found;
  for (uint32_t r = 0; r < n; ++r) {
    for (const Sequence& alt : g.rule(r).alternatives) {
      const auto a = static_cast<uint32_t>(owner.size());
      owner.push_back(r);
      pending.push_back(0);
      bool possible = true;
      for (const Symbol& s : alt) {
        if (s.kind == Symbol::Kind::kBytes) {
          possible = possible && bytes_hold(g.byte_set(s.id));
        } else {
          ++pending[a];
          used_in[s.id].push_back(a);
        }
      }
      if (!possible) pending[a] = UINT32_MAX;  // never reaches 0
      if (pending[a] == 0 && !holds[r]) {
        holds[r] = true;
        found.push_back(r);
      }
    }
  }
  while (!found.empty()) {
    const uint32_t r = found.back();
    found.pop_back();
    for (uint32_t a : used_in[r]) {
      if (pending[a] == UINT32_MAX || --pending[a] != 0 || holds[owner[a]]) continue;
      holds[owner[a]] = true;
      found.push_back(owner[a]);
    }
  }
  return holds;
}

}  // namespace

Grammar GrammarBuilder::build(uint32_t root) {
  const size_t n = g_.rules_.size();
  SPECULA_CHECK(root < n, "grammar: no root rule");
  for (size_t i = 0; i < n; ++i)
    SPECULA_CHECK(defined_[i], "grammar: rule '{}' is used but never defined", g_.rules_[i].name);

  // Nullable rules (match ""): an alternative of rules that are all nullable.
  const std::vector<bool> nullable = rules_with_a_holding_alternative(g_, [](const ByteSet&) { return false; });
  // Left recursion: a rule that can reach itself without consuming a byte.
  std::vector<std::vector<uint32_t>> first(n);
  for (size_t i = 0; i < n; ++i) {
    for (const Sequence& alt : g_.rules_[i].alternatives) {
      for (const Symbol& s : alt) {
        if (s.kind != Symbol::Kind::kRule) break;
        first[i].push_back(s.id);
        if (!nullable[s.id]) break;
      }
    }
  }
  // Depth-first with an explicit stack: a request's grammar may chain 10^5 rules, deeper than a
  // thread's stack could recurse.
  std::vector<int> color(n, 0);                 // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;  // rule, index of its next first-rule to visit
  for (uint32_t i = 0; i < n; ++i) {
    if (color[i] != 0) continue;
    color[i] = 1;
    path.push_back({i, 0});
    while (!path.empty()) {
      auto& [r, k] = path.back();
      if (k == first[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t next = first[r][k++];
      SPECULA_CHECK(color[next] != 1, "grammar: rule '{}' is left-recursive", g_.rules_[next].name);
      if (color[next] == 0) {
        color[next] = 1;
        path.push_back({next, 0});
      }
    }
  }

  // A root that matches nothing at all would mask every token: productive rules, an alternative
  // of non-empty byte sets and productive rules.
  const std::vector<bool> productive =
      rules_with_a_holding_alternative(g_, [](const ByteSet& set) { return !set.empty(); });
  SPECULA_CHECK(productive[root], "grammar: rule '{}' matches no string", g_.rules_[root].name);
  g_.root_ = root;
  Grammar out = std::move(g_);
  g_ = Grammar{};
  defined_.clear();
  rule_ids_.clear();
  next_suffix_.clear();
  return out;
}

}  // namespace specula
