// libFuzzer target: chat templates (ChatTemplate::compile + render).
//
// The first byte picks the mode:
//  - even: the rest is template source, compiled and rendered with a small fixed context (a
//    conversation with a tool call, tools, bos/eos, add_generation_prompt);
//  - odd: the rest is message content, rendered through a real template (the other bits pick
//    which: models/specula-tiny's, or a fetched Qwen3 / DeepSeek-V3 / Llama-3 one) as the content
//    of system, user, assistant and tool messages.
// specula::Error (a construct the interpreter refuses, raise_exception, a type error in the
// template) is the expected refusal; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_util.h"
#include "test_paths.h"
#include "tokenizer/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;

const ojson& fixed_context() {
  static const ojson ctx = ojson::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "What is 2+2? <think>"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
        "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
      {"role": "tool", "content": "4"},
      {"role": "assistant", "content": "4", "reasoning_content": "adding"}
    ],
    "tools": [{"type": "function", "function": {"name": "add", "description": "a+b",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "enable_thinking": false
  })");
  return ctx;
}

// The real templates: the embedded model's, and Qwen3's, DeepSeek-V3's and Llama-3's where
// scripts/fetch_tokenizers.sh has fetched them (the test command does, before ctest).
std::unique_ptr<specula::ChatTemplate> template_from(const std::filesystem::path& config) {
  std::ifstream in(config);
  if (!in.good()) return nullptr;
  std::stringstream ss;
  ss << in.rdbuf();
  return specula::ChatTemplate::compile(nlohmann::json::parse(ss.str()).at("chat_template").get<std::string>());
}

const std::vector<std::unique_ptr<specula::ChatTemplate>>& real_templates() {
  static const auto templates = [] {
    std::vector<std::unique_ptr<specula::ChatTemplate>> t;
    t.push_back(template_from(specula::testing::models_dir() / "specula-tiny" / "tokenizer_config.json"));
    if (!t.back()) std::abort();
    for (const char* name : {"qwen3", "deepseek_v3", "llama3"}) {
      if (auto tmpl = template_from(specula::testing::tokenizer_cache_dir() / name / "tokenizer_config.json")) {
        t.push_back(std::move(tmpl));
      } else {
        std::fprintf(stderr, "chat_template_fuzz: %s's template not fetched (scripts/fetch_tokenizers.sh)\n", name);
      }
    }
    return t;
  }();
  return templates;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixed_context();
  real_templates();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest = specula::fuzz::as_string(data + 1, size - 1);
  try {
    if ((data[0] & 1) == 0) {
      auto tmpl = specula::ChatTemplate::compile(rest);
      (void)tmpl->render(fixed_context());
    } else {
      const auto& templates = real_templates();
      const specula::ChatTemplate& tmpl = *templates[(data[0] >> 1) % templates.size()];
      ojson ctx = fixed_context();
      for (auto& m : ctx["messages"]) m["content"] = rest;
      ctx["messages"].push_back({{"role", "user"}, {"content", rest}});
      (void)tmpl.render(ctx);
      ctx["add_generation_prompt"] = false;
      ctx["enable_thinking"] = true;
      (void)tmpl.render(ctx);
    }
  } catch (const specula::Error&) {
  }
  return 0;
}
