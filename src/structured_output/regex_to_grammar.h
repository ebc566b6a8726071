// Regular expressions (the PCRE2 / JSON Schema `pattern` subset people write) compiled to grammar
// rules. The whole output must match, as vLLM's guided_regex: `^` and `$` are accepted only at the
// pattern's ends (of a top-level alternative), where they change nothing. Constructs that are not
// regular or need context (backreferences, lookaround, \b, atomic groups, possessive quantifiers,
// inline flags, \p{...}) are rejected with a specula::Error naming the construct and its byte
// offset, never approximated. Lazy quantifiers (`*?`) match the same language as greedy ones.
#pragma once

#include <cstdint>
#include <string_view>

#include "structured_output/grammar.h"

namespace specula {

// Counts above this in {m,n} are rejected, as are patterns whose expansion would exceed
// kMaxRegexExpansion symbols (nested bounded repeats multiply).
inline constexpr int kMaxRegexRepeat = 10000;
inline constexpr int64_t kMaxRegexExpansion = 1'000'000;
// Groups nested deeper than this are rejected: parsing and lowering recurse once per level.
inline constexpr int kMaxRegexNesting = 256;

enum class RegexTarget {
  kRaw,             // the matched text itself
  kJsonStringBody,  // the text between a JSON string's quotes whose decoded value matches
};

Grammar regex_to_grammar(std::string_view pattern);

// Adds a rule to `builder` matching `pattern` (in the form `target` asks for) and returns its id.
// For kJsonStringBody, a character the regex allows is emitted in a JSON encoding: raw where JSON
// allows it raw, `\"` `\\` `\n` ... or `\u00XX` where it must be escaped (and `/` either way).
uint32_t add_regex_rule(GrammarBuilder& builder, std::string_view pattern, RegexTarget target,
                        std::string_view name = "regex");

}  // namespace specula
