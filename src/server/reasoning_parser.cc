#include "server/reasoning_parser.h"

#include <algorithm>

namespace specula::server {
namespace {

constexpr std::string_view kStart = "<think>";
constexpr std::string_view kEnd = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag` (text that might be the
// beginning of a tag cut by the delta boundary).
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  size_t max = std::min(text.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

bool ReasoningParser::is_known(std::string_view name) { return name == "deepseek_r1" || name == "qwen3"; }

std::unique_ptr<ReasoningParser> ReasoningParser::create(std::string_view name, const nlohmann::json& kwargs) {
  if (name == "deepseek_r1") {
    return std::unique_ptr<ReasoningParser>(new ReasoningParser(State::kExpectStart, true));
  }
  if (name == "qwen3") {
    bool thinking = true;
    if (kwargs.is_object()) {
      auto it = kwargs.find("enable_thinking");
      if (it != kwargs.end() && it->is_boolean()) thinking = it->get<bool>();
    }
    return std::unique_ptr<ReasoningParser>(
        new ReasoningParser(thinking ? State::kExpectStart : State::kContent, false));
  }
  return nullptr;
}

void ReasoningParser::emit(ReasoningDelta* out, std::string_view text) const {
  (state_ == State::kReasoning ? out->reasoning : out->content).append(text);
}

ReasoningDelta ReasoningParser::feed(std::string_view text) {
  ReasoningDelta out;
  held_.append(text);
  for (;;) {
    if (state_ == State::kContent) {
      out.content += held_;
      held_.clear();
      return out;
    }
    if (state_ == State::kExpectStart) {
      // Leading whitespace does not decide anything yet (a model may write "\n<think>").
      size_t start = held_.find_first_not_of(" \t\r\n");
      if (start == std::string::npos) return out;
      std::string_view rest = std::string_view(held_).substr(start);
      if (rest.size() < kStart.size() && kStart.substr(0, rest.size()) == rest) return out;  // maybe "<thi"
      if (rest.substr(0, kStart.size()) == kStart) {
        held_.erase(0, start + kStart.size());
        state_ = State::kReasoning;
      } else {
        state_ = reasoning_without_start_tag_ ? State::kReasoning : State::kContent;
      }
      continue;
    }
    // kReasoning: everything up to </think> is reasoning.
    size_t end = held_.find(kEnd);
    if (end != std::string::npos) {
      out.reasoning.append(held_, 0, end);
      held_.erase(0, end + kEnd.size());
      state_ = State::kContent;
      continue;
    }
    size_t keep = partial_tag_suffix(held_, kEnd);
    out.reasoning.append(held_, 0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  if (held_.empty()) return out;
  if (state_ == State::kExpectStart) {
    // Generation ended before anything decided the state: whitespace or a cut-off "<thi".
    state_ = reasoning_without_start_tag_ ? State::kReasoning : State::kContent;
  }
  emit(&out, held_);
  held_.clear();
  return out;
}

ReasoningDelta ReasoningParser::parse_all(std::string_view text) {
  ReasoningDelta out = feed(text);
  ReasoningDelta tail = finish();
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  return out;
}

}  // namespace specula::server
