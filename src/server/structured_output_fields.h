// The request fields that constrain the output's text, mapped onto SamplingParams'
// structured_outputs (the engine compiles it; an invalid schema, regex or grammar is its 400):
//   response_format     {"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
//                       "schema", "strict"?, "description"?}}  (OpenAI)
//   structured_outputs  {"json" (a schema, or its text), "regex", "choice", "grammar",
//                       "json_object": true, "disable_any_whitespace"}  (vLLM)
//   guided_json, guided_regex, guided_choice, guided_grammar  (vLLM's older names)
// At most one constraint per request: two (even the same kind under two names) are a 400 naming
// both, rather than one silently winning. vLLM's options this server cannot honour
// (guided_whitespace_pattern, structural tags) are 400s; the backend choice is only logged.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/sampling_params.h"

namespace specula::server {

struct StructuredOutputFields {
  std::optional<StructuredOutputsParams> constraint;  // any_whitespace already applied
  std::string source;                                 // the field that set it ("response_format", ...)
  bool any_whitespace = true;                         // !structured_outputs.disable_any_whitespace
  std::vector<std::string> ignored;                   // sub-fields accepted but not acted on
};

// Reads the fields above from a request body (kept in the client's key order: a schema's
// property order is the order the model writes them in). Throws ApiError (400) naming the field.
StructuredOutputFields parse_structured_output_fields(const nlohmann::ordered_json& body);

// The 400 for a second constraint beside `first` (e.g. a forced tool_choice beside response_format).
[[noreturn]] void throw_structured_output_conflict(const std::string& first, const std::string& second);

}  // namespace specula::server
