// vLLM's `choice` constraint (guided_choice): the output is exactly one of the given strings.
#pragma once

#include <string>
#include <vector>

#include "structured_output/grammar.h"

namespace specula {

// One alternative a choice, each a literal; an empty list is a specula::Error.
Grammar choice_grammar(const std::vector<std::string>& choices);

}  // namespace specula
