// hermes (Qwen2.5, Qwen3, Hermes 2 Pro): each call is
//   <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
// Text outside the tags is content; the whitespace that follows a call (the newline between two
// calls) is not. A last call whose closing tag was cut off still counts when its JSON is whole.
#include <memory>
#include <optional>

#include "server/tool_call_json.h"
#include "server/tool_parser.h"

namespace specula::server {
namespace {

constexpr std::string_view kStart = "<tool_call>";
constexpr std::string_view kEnd = "</tool_call>";

class HermesToolParser : public ToolParser {
 protected:
  void consume(std::string_view text, ToolParseDelta* out) override {
    for (char c : text) step(c, out);
  }

  void end(ToolParseDelta* out) override {
    switch (state_) {
      case State::kText:
        out->content += held_;  // a cut-off "<tool_ca" is text
        break;
      case State::kCall:
        set_malformed();
        if (!reader_->named()) out->content += raw_;
        break;
      case State::kAfterCall:  // the JSON was whole; only the closing tag is missing
      case State::kSkipToEnd:
        break;
    }
    held_.clear();
  }

 private:
  enum class State { kText, kCall, kAfterCall, kSkipToEnd };

  void step(char c, ToolParseDelta* out) {
    switch (state_) {
      case State::kText:
        if (skip_space_ && held_.empty() && is_json_space(c)) return;
        skip_space_ = false;
        held_.push_back(c);
        if (held_ == kStart) {
          held_.clear();
          raw_ = std::string(kStart);
          reader_.emplace(std::vector<std::string>{"arguments"});
          state_ = State::kCall;
          return;
        }
        while (!held_.empty() && kStart.substr(0, held_.size()) != held_) {
          out->content.push_back(held_.front());
          held_.erase(0, 1);
        }
        return;
      case State::kCall: {
        raw_.push_back(c);
        CallObjectReader::Event ev;
        CallObjectReader::Status s = reader_->feed(c, &ev);
        if (ev.name) start_call(*ev.name, out);
        append_arguments(ev.arguments, out);
        if (s == CallObjectReader::Status::kDone) {
          state_ = State::kAfterCall;
        } else if (s == CallObjectReader::Status::kError) {
          set_malformed();
          if (reader_->named()) {
            skipped_.clear();
            state_ = State::kSkipToEnd;
          } else {
            out->content += raw_;  // never became a call: it is text
            state_ = State::kText;
          }
        }
        return;
      }
      case State::kAfterCall:
        if (held_.empty() && is_json_space(c)) return;
        held_.push_back(c);
        if (held_ == kEnd) {
          held_.clear();
          skip_space_ = true;
          state_ = State::kText;
        } else if (kEnd.substr(0, held_.size()) != held_) {
          set_malformed();
          skipped_ = held_;
          held_.clear();
          state_ = State::kSkipToEnd;
          if (skipped_.ends_with(kEnd)) state_ = State::kText;
        }
        return;
      case State::kSkipToEnd:
        skipped_.push_back(c);
        if (skipped_.ends_with(kEnd)) {
          skip_space_ = true;
          state_ = State::kText;
        }
        return;
    }
  }

  State state_ = State::kText;
  std::string held_;         // text that may be the start of a tag
  std::string raw_;          // the current call's text, from its <tool_call>
  std::string skipped_;      // a malformed call's rest, up to its </tool_call>
  bool skip_space_ = false;  // just after a call: whitespace is dropped
  std::optional<CallObjectReader> reader_;
};

}  // namespace

std::unique_ptr<ToolParser> make_hermes_tool_parser() { return std::make_unique<HermesToolParser>(); }

}  // namespace specula::server
