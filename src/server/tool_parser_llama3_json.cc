// llama3_json (Llama 3.1 / 3.2 JSON tool calling): the whole output is the calls, an optional
// <|python_tag|> and then one JSON object {"name": "NAME", "parameters": {...}} or several
// separated by ';' ("arguments" is taken for "parameters" too). Output that does not open with
// the tag or '{' is content; so is output that opens with '{' but is not a call.
#include <memory>
#include <optional>

#include "server/tool_call_json.h"
#include "server/tool_parser.h"

namespace specula::server {
namespace {

constexpr std::string_view kTag = "<|python_tag|>";

class Llama3JsonToolParser : public ToolParser {
 protected:
  void consume(std::string_view text, ToolParseDelta* out) override {
    for (char c : text) step(c, out);
  }

  void end(ToolParseDelta* out) override {
    switch (state_) {
      case State::kStart:
        out->content += held_;
        break;
      case State::kExpectObject:
        // A trailing ';' after calls is harmless; a tag with no call after it is not a call.
        if (calls_started() == 0) {
          set_malformed();
          out->content += raw_;
        }
        break;
      case State::kObject:
        set_malformed();
        if (!reader_->named()) out->content += raw_;
        break;
      case State::kBetween:
      case State::kContent:
      case State::kSkip:
        break;
    }
    held_.clear();
  }

 private:
  enum class State { kStart, kExpectObject, kObject, kBetween, kContent, kSkip };

  void begin_object(char c, ToolParseDelta* out) {
    reader_.emplace(std::vector<std::string>{"parameters", "arguments"});
    state_ = State::kObject;
    step(c, out);
  }

  // What looked like a call is not one: text, unless a call was already sent for it.
  void not_a_call(ToolParseDelta* out) {
    set_malformed();
    if (reader_ && reader_->named() && state_ == State::kObject) {
      state_ = State::kSkip;
      return;
    }
    out->content += raw_;
    state_ = State::kContent;
  }

  void step(char c, ToolParseDelta* out) {
    switch (state_) {
      case State::kStart: {
        held_.push_back(c);
        size_t first = held_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos) return;
        std::string_view rest = std::string_view(held_).substr(first);
        if (rest.size() < kTag.size() && kTag.substr(0, rest.size()) == rest) return;  // maybe "<|python"
        if (rest == kTag) {
          raw_ = held_;
          held_.clear();
          state_ = State::kExpectObject;
        } else if (rest == "{") {
          raw_ = held_.substr(0, first);
          held_.clear();
          begin_object(c, out);
        } else {
          out->content += held_;
          held_.clear();
          state_ = State::kContent;
        }
        return;
      }
      case State::kExpectObject:
        if (is_json_space(c)) {
          raw_.push_back(c);
          return;
        }
        if (c == '{') {
          begin_object(c, out);
          return;
        }
        raw_.push_back(c);
        not_a_call(out);
        return;
      case State::kObject: {
        raw_.push_back(c);
        CallObjectReader::Event ev;
        CallObjectReader::Status s = reader_->feed(c, &ev);
        if (ev.name) start_call(*ev.name, out);
        append_arguments(ev.arguments, out);
        if (s == CallObjectReader::Status::kDone) state_ = State::kBetween;
        if (s == CallObjectReader::Status::kError) not_a_call(out);
        return;
      }
      case State::kBetween:
        if (is_json_space(c)) return;
        if (c == ';') {
          raw_.clear();
          state_ = State::kExpectObject;
          return;
        }
        raw_ = std::string(1, c);
        not_a_call(out);  // text after the calls
        return;
      case State::kContent:
        out->content.push_back(c);
        return;
      case State::kSkip:
        return;
    }
  }

  State state_ = State::kStart;
  std::string held_;  // leading text that may still become <|python_tag|>
  std::string raw_;   // the current object's text (with the tag or separator before it)
  std::optional<CallObjectReader> reader_;
};

}  // namespace

std::unique_ptr<ToolParser> make_llama3_json_tool_parser() { return std::make_unique<Llama3JsonToolParser>(); }

}  // namespace specula::server
