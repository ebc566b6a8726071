// Shared by the jinja_*_test.cc files: renders a template against a fixed sample context (plus
// per-test overrides). The expected strings in those tests are what jinja2 3.1.6 renders for the
// same template and context in transformers' environment (ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks, loopcontrols and transformers' tojson / raise_exception).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace specula {

inline const char* kJinjaSampleContext = R"({
  "msgs": [{"role": "system", "content": "sys"}, {"role": "user", "content": " hi there \n"},
           {"role": "assistant", "content": "yo",
            "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": [1.5, null, true]}}}]}],
  "d": {"z": 1, "a": 2}, "s": "Hello, World", "u": "héllo wörld 日本", "n": null, "xs": [3, 1, 2],
  "e": [], "t": true, "f": false, "i": 7, "fl": 2.5})";

// The sample context, overridden/extended by the keys of `overrides` (a JSON object).
inline nlohmann::ordered_json sample_context(const std::string& overrides) {
  auto ctx = nlohmann::ordered_json::parse(kJinjaSampleContext);
  const auto extra = nlohmann::ordered_json::parse(overrides);
  for (const auto& [k, v] : extra.items()) ctx[k] = v;
  return ctx;
}

// Renders `source` with the sample context and `overrides`.
inline std::string render(const std::string& source, const std::string& overrides = "{}") {
  return ChatTemplate::compile(source)->render(sample_context(overrides));
}

// The message of the specula::Error that compiling `source` raises ("" when it compiles).
inline std::string compile_error(const std::string& source) {
  try {
    ChatTemplate::compile(source);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The message of the specula::Error that rendering raises ("" when it renders).
inline std::string render_error(const std::string& source, const std::string& overrides = "{}") {
  auto tmpl = ChatTemplate::compile(source);  // must compile: the error is a render-time one
  try {
    tmpl->render(sample_context(overrides));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace specula

// jinja2 raises for this template and context; so must we (at render time, after compiling).
#define EXPECT_RENDER_THROWS(...) EXPECT_NE(::specula::render_error(__VA_ARGS__), "")
