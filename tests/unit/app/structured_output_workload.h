// Structured-output workloads through LLMEngine::create on the embedded model, shared by the CPU
// suite (structured_output_test.cc) and the device one (cuda_structured_output_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "unit/app/async_workload.h"

namespace specula::testing {

using Kind = StructuredOutputsParams::Kind;

// A tool's arguments, bounded so that the embedded model always completes it within max_tokens.
inline const char* kToolSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"enum": ["Paris", "Oslo", "Lima"]},
    "admin": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}
  },
  "required": ["name", "age", "city", "admin", "tags"],
  "additionalProperties": false
})";

inline void expect_valid_tool_arguments(const std::string& text) {
  nlohmann::json v;
  ASSERT_NO_THROW(v = nlohmann::json::parse(text)) << text;
  ASSERT_TRUE(v.is_object()) << text;
  EXPECT_EQ(v.size(), 5u) << text;
  ASSERT_TRUE(v.contains("name") && v["name"].is_string()) << text;
  const std::string name = v["name"];
  EXPECT_GE(name.size(), 1u);
  ASSERT_TRUE(v.contains("age") && v["age"].is_number_integer()) << text;
  EXPECT_GE(v["age"].get<int64_t>(), 0) << text;
  EXPECT_LE(v["age"].get<int64_t>(), 120) << text;
  ASSERT_TRUE(v.contains("city")) << text;
  EXPECT_TRUE(v["city"] == "Paris" || v["city"] == "Oslo" || v["city"] == "Lima") << text;
  ASSERT_TRUE(v.contains("admin") && v["admin"].is_boolean()) << text;
  ASSERT_TRUE(v.contains("tags") && v["tags"].is_array()) << text;
  EXPECT_LE(v["tags"].size(), 3u) << text;
  for (const auto& t : v["tags"]) EXPECT_TRUE(t.is_string()) << text;
}

inline SamplingParams constrained(Kind kind, std::string spec, bool sampled, int i) {
  SamplingParams p;
  p.temperature = sampled ? 1.0f : 0.0f;
  p.seed = 500 + i;
  // Up to 20 whitespace characters per gap between JSON tokens (a sampled tiny model uses them):
  // room for all of them, so every output completes.
  p.max_tokens = 450;
  StructuredOutputsParams so;
  so.kind = kind;
  so.spec = std::move(spec);
  p.structured_outputs = so;
  return p;
}

struct EngineRun {
  std::vector<ChoiceResult> results;
  EngineMetrics metrics;
};

inline EngineRun run_requests(EngineConfig ec, const std::vector<SamplingParams>& params, bool async = false) {
  ec.async_scheduling = async;
  ec.max_model_len = 640;
  auto engine = create_engine(ec);
  const auto prompts = tiny_prompts();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < params.size(); ++i)
    streams.push_back(engine->add_request(NewRequest{"s" + std::to_string(i), prompts[i % prompts.size()], params[i]}));
  engine->start();
  EngineRun run;
  for (auto& s : streams) {
    std::map<int, ChoiceResult> choices;
    collect(*s, choices);
    run.results.push_back(choices[0]);
  }
  run.metrics = settled_metrics(*engine);
  engine->shutdown();
  return run;
}

inline std::vector<SamplingParams> tool_workload(bool sampled, int n) {
  std::vector<SamplingParams> out;
  for (int i = 0; i < n; ++i) out.push_back(constrained(Kind::kJson, kToolSchema, sampled, i));
  return out;
}

}  // namespace specula::testing
