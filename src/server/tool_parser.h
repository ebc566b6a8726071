// Tool calls in a model's output text (vLLM's ToolParser): `--tool-call-parser NAME` picks the
// format the model writes its calls in; tool_choice "required" and a named tool_choice have
// parsers of their own (tool_choice.h). Each parser reads the output incrementally, so that a
// stream's deltas split into content and tool calls exactly as the whole text does, even when a
// marker arrives cut over several deltas (text that may start a marker is held back until it is
// known not to be one).
//
// The arguments of a call are the JSON text the model wrote, as it wrote it (not re-serialised):
// that is what lets a stream send them piece by piece and still end with the same string.
//
// Malformed output: parse_all() returns the whole text as content and no calls, as vLLM does. A
// stream cannot take back what it sent: there a call is committed once its name is known, and a
// malformed call that never got that far is sent as content.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specula::server {

// One piece of one call, in output order. `name` is set on a call's first piece only.
struct ToolCallDelta {
  int index = 0;                    // the call's position in this choice's output (0, 1, ...)
  std::optional<std::string> name;
  std::string arguments;            // the next piece of the arguments' JSON text
};

struct ToolParseDelta {
  std::string content;              // text outside calls
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

struct ToolCall {
  std::string name;
  std::string arguments;            // JSON text
};

struct ParsedToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;

  // Names accepted by --tool-call-parser, in the order the error message lists them.
  static const std::vector<std::string>& names();
  static bool is_known(std::string_view name);
  // A fresh parser (one per choice: it keeps state); nullptr for an unknown name.
  static std::unique_ptr<ToolParser> create(std::string_view name);
  // Whether the parser needs special tokens kept in the output text (its markers may be special
  // tokens, which skip_special_tokens would drop before it sees them).
  static bool keeps_special_tokens(std::string_view name);

  // Feeds the next piece of generated text; returns what can be attributed now.
  ToolParseDelta feed(std::string_view text);
  // End of generation: releases what was held back.
  ToolParseDelta finish();
  // The whole output (feed + finish); when anything was malformed, all of it is content.
  ParsedToolOutput parse_all(std::string_view text);
  // Whether some call (or what looked like one) did not parse.
  bool malformed() const { return malformed_; }

 protected:
  // The format's state machine: consumes `text`, appending to `out` via the helpers below.
  virtual void consume(std::string_view text, ToolParseDelta* out) = 0;
  virtual void end(ToolParseDelta* out) = 0;

  // A new call named `name`; returns its index.
  int start_call(const std::string& name, ToolParseDelta* out);
  // Appends arguments text to the call started last.
  void append_arguments(std::string_view piece, ToolParseDelta* out);
  void set_malformed() { malformed_ = true; }
  int calls_started() const { return next_index_; }

 private:
  int next_index_ = 0;
  bool malformed_ = false;
};

// Parsers of the registry, one file each.
std::unique_ptr<ToolParser> make_hermes_tool_parser();
std::unique_ptr<ToolParser> make_llama3_json_tool_parser();
std::unique_ptr<ToolParser> make_deepseek_v3_tool_parser();

}  // namespace specula::server
