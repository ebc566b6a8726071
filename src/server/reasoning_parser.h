// --reasoning-parser: splits a reasoning model's <think>...</think> output into reasoning_content
// and content, incrementally, so that streamed deltas split the same way as the whole text even
// when a tag arrives cut over several deltas (text that may be the start of a tag is held back
// until it is known not to be one).
//
// As vLLM's parsers behave:
//   deepseek_r1  Output starts inside the reasoning (the chat template already opened <think>); a
//                <think> the model writes itself is dropped. Everything before </think> is
//                reasoning, everything after is content; no </think> means all reasoning.
//   qwen3        Reasoning only when the output opens with <think> (Qwen3 writes it itself); no
//                <think> (thinking disabled, or enable_thinking=false in chat_template_kwargs)
//                means everything is content. An unclosed <think> leaves the rest as reasoning.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace specula::server {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // Names accepted by --reasoning-parser.
  static bool is_known(std::string_view name);
  // One parser per choice (it keeps state). `chat_template_kwargs` is the request's (enable_thinking).
  static std::unique_ptr<ReasoningParser> create(std::string_view name, const nlohmann::json& chat_template_kwargs);

  // Feeds the next piece of generated text; returns what can be attributed now.
  ReasoningDelta feed(std::string_view text);
  // End of generation: releases any held-back text.
  ReasoningDelta finish();
  // Whole-output convenience: feed(text) + finish().
  ReasoningDelta parse_all(std::string_view text);

 private:
  enum class State { kExpectStart, kReasoning, kContent };
  // deepseek_r1: a missing <think> still means reasoning; qwen3: it means content.
  ReasoningParser(State initial, bool reasoning_without_start_tag)
      : state_(initial), reasoning_without_start_tag_(reasoning_without_start_tag) {}
  void emit(ReasoningDelta* out, std::string_view text) const;

  State state_;
  bool reasoning_without_start_tag_;
  std::string held_;  // text that may still turn out to be (part of) a tag
};

}  // namespace specula::server
