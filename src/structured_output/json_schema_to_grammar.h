// JSON Schema -> Grammar, for response_format json_schema, guided_json and forced tool calls, and
// the grammar of any JSON object (response_format json_object). Semantics follow xgrammar as vLLM
// runs it (strict mode), so a request behaves as it does on vLLM:
//
// - Properties appear in the schema's order; required ones must appear, optional ones may be left
//   out. additionalProperties absent means false (xgrammar's strict mode, and what OpenAI's strict
//   schemas say); true or a schema allows extra keys after the listed properties.
// - prefixItems (or a draft-7 `items` array) are all present, then `items` (absent: no more items
//   after prefixItems; any values when there are none).
// - Whitespace (any_whitespace): up to max_whitespace of ` \t\n\r` in each gap between tokens,
//   none before or after the value, so a model cannot loop on whitespace. Without it the
//   separators are exactly item_separator and key_separator, by default xgrammar's ", " and ": "
//   (Python's json.dumps); {"," ":"} gives compact JSON.
// - Keywords that change the accepted language but are not supported (not, if/then/else,
//   patternProperties, uniqueItems, ...) are a specula::Error naming the keyword and its JSON
//   pointer, never ignored; annotations (title, description, examples, default, ...) and unknown
//   keywords are ignored, as JSON Schema says. `format` is an annotation unless it is one this
//   file writes a pattern for (date, time, date-time, uuid, email, ipv4).
// - Limits: nesting deeper than max_depth is an error; minLength / minItems above kMaxJsonRepeat
//   are an error, maxLength / maxItems above it are treated as unbounded (max_tokens bounds the
//   output); integer and number bounds as number_range.h.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "structured_output/grammar.h"

namespace specula {

inline constexpr int kMaxJsonRepeat = 10000;

struct JsonGrammarOptions {
  bool any_whitespace = true;     // vLLM: !disable_any_whitespace
  int max_whitespace = 20;        // per gap, when any_whitespace
  std::string item_separator = ", ";  // when !any_whitespace
  std::string key_separator = ": ";   // when !any_whitespace
  int max_depth = 64;             // schema nesting
};

// `schema` keeps its keys' order: properties come out in it. The nlohmann::json overload sees keys
// sorted (std::map); the text overload parses with the order kept (the server's path).
Grammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonGrammarOptions& options = {});
Grammar json_schema_to_grammar(const nlohmann::json& schema, const JsonGrammarOptions& options = {});
Grammar json_schema_text_to_grammar(std::string_view schema_text, const JsonGrammarOptions& options = {});

// Any JSON object at the top level, any JSON values inside (OpenAI's json_object mode).
Grammar any_json_grammar(const JsonGrammarOptions& options = {});

}  // namespace specula
