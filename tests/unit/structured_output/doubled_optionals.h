// A grammar ambiguous on purpose, for the automaton's bound: after a literal prefix,
// r0 ::= r1 r1, r1 ::= r2 r2, ... down to r<depth> ::= [a-z] | "". It matches the prefix and then
// up to 2^depth letters, and each position after the prefix holds ~2^depth parse stacks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "structured_output/grammar.h"

namespace specula::testing {

inline Grammar doubled_optionals(int depth, std::string_view prefix) {
  GrammarBuilder b;
  std::vector<uint32_t> r;
  for (int i = 0; i <= depth; ++i) r.push_back(b.declare("r" + std::to_string(i)));
  for (int i = 0; i < depth; ++i) b.define(r[i], {{GrammarBuilder::ref(r[i + 1]), GrammarBuilder::ref(r[i + 1])}});
  b.define(r[depth], {{b.bytes(ByteSet::range('a', 'z'))}, {}});
  Sequence root = b.literal(prefix);
  root.push_back(GrammarBuilder::ref(r[0]));
  return b.build(b.add("root", {root}));
}

}  // namespace specula::testing
