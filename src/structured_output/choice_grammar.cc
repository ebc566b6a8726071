#include "structured_output/choice_grammar.h"

#include "core/error.h"

namespace specula {

Grammar choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) throw Error("a choice constraint needs at least one choice");
  GrammarBuilder b;
  std::vector<Sequence> alternatives;
  for (const std::string& c : choices) alternatives.push_back(b.literal(c));
  return b.build(b.add("root", std::move(alternatives)));
}

}  // namespace specula
