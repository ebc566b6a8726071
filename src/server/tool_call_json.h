// Character-at-a-time readers of the JSON that tool calls are written in, shared by the tool
// parsers: where a JSON value ends, and the {"name": ..., "arguments": {...}} object of one call,
// with its arguments' text passed on as it arrives (a stream sends them before the call is done).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specula::server {

// Finds the end of one JSON value. Structure only (brackets, strings, escapes); whether the text
// is valid JSON is checked once it is complete (nlohmann's accept).
class JsonValueReader {
 public:
  enum class Step {
    kSkip,     // whitespace before the value: not part of it
    kMore,     // `c` is part of the value, which goes on
    kDone,     // `c` is the value's last character
    kBefore,   // the value (a number or literal) ended before `c`, which is not part of it
    kError,
  };
  Step feed(char c);
  // At the end of the text: a number or literal in progress is complete there.
  bool complete_at_end() const { return state_ == State::kScalar && stack_.empty(); }

 private:
  enum class State { kStart, kValue, kString, kEscape, kScalar, kEnd };
  State state_ = State::kStart;
  std::string stack_;  // open brackets
};

// Length of the longest suffix of `text` that is a proper prefix of `marker`: text that may be the
// beginning of the marker, cut by a delta boundary.
size_t partial_marker_suffix(std::string_view text, std::string_view marker);
bool is_json_space(char c);

// One call written as a JSON object holding its name and arguments under one of
// `argument_keys` ("arguments", "parameters"); other keys are skipped. Missing arguments are "{}".
class CallObjectReader {
 public:
  enum class Status { kMore, kDone, kError };
  // What one character produced.
  struct Event {
    std::optional<std::string> name;  // the call's name, once known (the arguments may already be in `arguments`)
    std::string arguments;            // arguments text to append, once the name is known
  };

  explicit CallObjectReader(std::vector<std::string> argument_keys) : argument_keys_(std::move(argument_keys)) {}

  // Consumes `c` (kDone: `c` was the closing brace).
  Status feed(char c, Event* ev);
  bool named() const { return name_.has_value(); }

 private:
  enum class State { kOpen, kKey, kKeyText, kColon, kValue, kName, kArguments, kOther, kAfterValue, kDone, kError };
  Status fail() {
    state_ = State::kError;
    return Status::kError;
  }
  Status value_ended(Event* ev);
  Status close(Event* ev);

  std::vector<std::string> argument_keys_;
  State state_ = State::kOpen;
  bool need_key_ = false;     // after a comma: a key must follow, not '}'
  bool escape_ = false;       // in a key or name string: the previous character was a backslash
  std::string raw_;           // the key or name being read (with its quotes)
  std::string key_;
  JsonValueReader value_;
  std::optional<std::string> name_;
  bool have_arguments_ = false;
  std::string arguments_;     // all of the arguments' text read so far
  size_t sent_ = 0;           // how much of arguments_ went out in events
};

}  // namespace specula::server
