// deepseek_v3 (DeepSeek-V3, R1-0528): the calls sit between special markers, each as
//   <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>
// inside <｜tool▁calls▁begin｜> ... <｜tool▁calls▁end｜>. Text before the calls is content, as is
// text after them (less the whitespace that follows the closing marker).
#include <memory>

#include <nlohmann/json.hpp>

#include "server/tool_call_json.h"
#include "server/tool_parser.h"

namespace specula::server {
namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kFence = "```json\n";
constexpr std::string_view kArgsEnd = "\n```<｜tool▁call▁end｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";

bool starts(std::string_view marker, std::string_view text) { return marker.substr(0, text.size()) == text; }

class DeepSeekV3ToolParser : public ToolParser {
 protected:
  void consume(std::string_view text, ToolParseDelta* out) override {
    for (char c : text) step(c, out);
  }

  void end(ToolParseDelta* out) override {
    switch (state_) {
      case State::kText:
        out->content += held_;
        break;
      case State::kCalls:  // the closing marker was cut off: the calls before it stand
        if (calls_started() == 0) set_malformed();
        break;
      case State::kType:
      case State::kName:
      case State::kFence:
      case State::kArgs:
      case State::kSkipToCallEnd:
        set_malformed();
        break;
    }
    held_.clear();
  }

 private:
  enum class State { kText, kCalls, kType, kName, kFence, kArgs, kSkipToCallEnd };

  void malformed_call() {
    set_malformed();
    held_.clear();
    skipped_.clear();
    state_ = State::kSkipToCallEnd;
  }

  void step(char c, ToolParseDelta* out) {
    switch (state_) {
      case State::kText:
        if (skip_space_ && held_.empty() && is_json_space(c)) return;
        skip_space_ = false;
        held_.push_back(c);
        if (held_ == kCallsBegin) {
          held_.clear();
          state_ = State::kCalls;
          return;
        }
        while (!held_.empty() && !starts(kCallsBegin, held_)) {
          out->content.push_back(held_.front());
          held_.erase(0, 1);
        }
        return;
      case State::kCalls:
        if (held_.empty() && is_json_space(c)) return;
        held_.push_back(c);
        if (held_ == kCallBegin) {
          held_.clear();
          text_.clear();
          state_ = State::kType;
        } else if (held_ == kCallsEnd) {
          held_.clear();
          skip_space_ = true;
          state_ = State::kText;
        } else if (!starts(kCallBegin, held_) && !starts(kCallsEnd, held_)) {
          set_malformed();  // neither a call nor the end: the rest is text
          out->content += held_;
          held_.clear();
          state_ = State::kText;
        }
        return;
      case State::kType:  // "function", up to the separator
        text_.push_back(c);
        if (text_.ends_with(kSep)) {
          text_.clear();
          state_ = State::kName;
        }
        return;
      case State::kName:
        if (c != '\n') {
          text_.push_back(c);
          return;
        }
        {
          size_t b = text_.find_first_not_of(" \t\r");
          size_t e = text_.find_last_not_of(" \t\r");
          if (b == std::string::npos) {
            malformed_call();
            return;
          }
          start_call(text_.substr(b, e - b + 1), out);
        }
        args_.clear();
        state_ = State::kFence;
        return;
      case State::kFence:
        held_.push_back(c);
        if (held_ == kFence) {
          held_.clear();
          state_ = State::kArgs;
        } else if (!starts(kFence, held_)) {
          malformed_call();
        }
        return;
      case State::kArgs:
        held_.push_back(c);
        if (held_ == kArgsEnd) {
          held_.clear();
          if (!nlohmann::json::accept(args_)) set_malformed();
          state_ = State::kCalls;
          return;
        }
        {
          size_t n = 0;
          while (n < held_.size() && !starts(kArgsEnd, std::string_view(held_).substr(n))) ++n;
          args_.append(held_, 0, n);
          append_arguments(std::string_view(held_).substr(0, n), out);
          held_.erase(0, n);
        }
        return;
      case State::kSkipToCallEnd:
        skipped_.push_back(c);
        if (skipped_.ends_with(kCallEnd)) state_ = State::kCalls;
        return;
    }
  }

  State state_ = State::kText;
  std::string held_;         // text that may be the start of a marker
  std::string text_;         // the type, then the name, being read
  std::string args_;         // the current call's arguments (checked once whole)
  std::string skipped_;      // a malformed call's rest
  bool skip_space_ = false;  // just after the calls: whitespace is dropped
};

}  // namespace

std::unique_ptr<ToolParser> make_deepseek_v3_tool_parser() { return std::make_unique<DeepSeekV3ToolParser>(); }

}  // namespace specula::server
