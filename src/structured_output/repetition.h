// Bounded repetition for the front ends, with rules named uniquely. GrammarBuilder::repeat gives
// every nested optional of a long chain the same hint, and GrammarBuilder::declare searches
// hint, hint_1, hint_2, ... linearly for a free name, so a {0,10000} chain cost minutes to build;
// here each rule of the chain gets a name no other rule has. RuleNamer makes the front ends'
// hints unique for the same reason.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "structured_output/grammar.h"

namespace specula {

class RuleNamer {
 public:
  std::string operator()(std::string_view base) { return std::string(base) + "_" + std::to_string(next_++); }

 private:
  int next_ = 0;
};

// s repeated min..max times (max absent: unbounded), as GrammarBuilder::repeat.
Symbol repeat_unique(GrammarBuilder& b, Sequence s, int min, std::optional<int> max, RuleNamer& names,
                     std::string_view hint);

}  // namespace specula
