// The chat request's `tools`, `tool_choice` and `parallel_tool_calls`, as vLLM reads them:
//   "none"      tools still reach the chat template, but nothing is parsed as a call;
//   "auto"      the model may call tools; --tool-call-parser finds the calls in its text (the
//               default when tools are given; needs --enable-auto-tool-choice, checked by the route);
//   "required"  the output is forced (a JSON-schema constraint) to be a JSON array of calls
//               [{"name": ..., "parameters": {...}}, ...], one at most when parallel_tool_calls
//               is false;
//   {"type": "function", "function": {"name": NAME}}  the output is forced to be the arguments of
//               one call to NAME (its parameters schema).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "sampling/sampling_params.h"
#include "server/tool_parser.h"

namespace specula::server {

struct ToolChoice {
  enum class Kind { kNone, kAuto, kRequired, kNamed };
  Kind kind = Kind::kNone;
  std::string function;             // kNamed: the tool's name
  bool parallel_tool_calls = true;
  bool forced() const { return kind == Kind::kRequired || kind == Kind::kNamed; }
};

// Validates `tools` (each {"type": "function", "function": {"name", "description"?,
// "parameters"?}}) and reads tool_choice and parallel_tool_calls; 400 naming what is wrong.
ToolChoice parse_tool_choice(const nlohmann::ordered_json& body);

// A tool's parameters schema; {"type": "object", "properties": {}} when it has none.
nlohmann::ordered_json tool_parameters(const nlohmann::ordered_json& tool);
// The schema "required" forces: an array of {"name": NAME, "parameters": ...} objects, anyOf over
// the tools; the tools' "$defs" move to the top, where their "#/$defs/..." references point.
nlohmann::ordered_json required_tool_calls_schema(const nlohmann::ordered_json& tools, bool parallel_tool_calls);

// The constraint a forced choice puts on the output (nullopt for "none" and "auto").
std::optional<StructuredOutputsParams> tool_choice_constraint(const ToolChoice& choice,
                                                              const nlohmann::ordered_json& tools);

// The parser that turns the output into calls: the forced choices' own, or --tool-call-parser's
// for "auto"; nullptr for "none".
std::unique_ptr<ToolParser> make_tool_choice_parser(const ToolChoice& choice, const std::string& auto_parser);

}  // namespace specula::server
