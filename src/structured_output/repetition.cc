#include "structured_output/repetition.h"

#include "core/error.h"

namespace specula {

Symbol repeat_unique(GrammarBuilder& b, Sequence s, int min, std::optional<int> max, RuleNamer& names,
                     std::string_view hint) {
  SPECULA_CHECK(min >= 0 && (!max || *max >= min), "grammar: repetition {{{},{}}} in '{}' is empty", min,
                max ? std::to_string(*max) : "", hint);
  Sequence out;
  for (int i = 0; i < min; ++i) out.insert(out.end(), s.begin(), s.end());
  if (!max) {
    out.push_back(b.star(s, names(hint)));
  } else if (*max > min) {
    // tail_k ::= s tail_{k-1} | "" matches 0..k more copies; tail_1 ::= s | "".
    Symbol tail = GrammarBuilder::ref(b.add(names(hint), {s, {}}));
    for (int k = 2; k <= *max - min; ++k) {
      Sequence more = s;
      more.push_back(tail);
      tail = GrammarBuilder::ref(b.add(names(hint), {std::move(more), {}}));
    }
    out.push_back(tail);
  }
  if (out.size() == 1) return out[0];
  return GrammarBuilder::ref(b.add(names(hint), {std::move(out)}));
}

}  // namespace specula
