#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/request_parser.h"
#include "server/tool_choice.h"

namespace specula::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using Kind = ToolChoice::Kind;

ApiError parse_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an ApiError";
  return ApiError(0, "", "");
}

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time"}}])";

ChatRequest chat(const std::string& fields) {
  std::string body = R"({"messages": [{"role": "user", "content": "x"}])" + (fields.empty() ? "" : ", " + fields) + "}";
  return parse_chat_request(json::parse(body), ojson::parse(body), {});
}

ApiError chat_error(const std::string& fields) { return parse_error([&] { chat(fields); }); }

TEST(ToolChoice, DefaultsAsVllm) {
  EXPECT_EQ(chat("").tool_choice.kind, Kind::kNone);
  EXPECT_EQ(chat(std::string(R"("tools": )") + kTools).tool_choice.kind, Kind::kAuto);  // tools given: auto
  EXPECT_EQ(chat(R"("tools": [])").tool_choice.kind, Kind::kNone);
  EXPECT_TRUE(chat("").tool_choice.parallel_tool_calls);
  auto none = chat(std::string(R"("tool_choice": "none", "tools": )") + kTools);
  EXPECT_EQ(none.tool_choice.kind, Kind::kNone);
  EXPECT_EQ(none.tools.size(), 2u);  // still for the template
  EXPECT_FALSE(none.params.structured_outputs);
  auto autoc = chat(std::string(R"("tool_choice": "auto", "tools": )") + kTools);
  EXPECT_EQ(autoc.tool_choice.kind, Kind::kAuto);
  EXPECT_FALSE(autoc.params.structured_outputs);  // the model chooses: nothing is forced
  // "required" without tools means none, as OpenAI.
  EXPECT_EQ(chat(R"("tool_choice": "required", "tools": [])").tool_choice.kind, Kind::kNone);
}

TEST(ToolChoice, RequiredForcesAnArrayOfCalls) {
  auto r = chat(std::string(R"("tool_choice": "required", "tools": )") + kTools);
  EXPECT_EQ(r.tool_choice.kind, Kind::kRequired);
  ASSERT_TRUE(r.params.structured_outputs);
  EXPECT_EQ(r.params.structured_outputs->kind, StructuredOutputsParams::Kind::kJson);
  EXPECT_TRUE(r.params.structured_outputs->any_whitespace);
  EXPECT_EQ(r.params.structured_outputs->spec,
            R"({"type":"array","minItems":1,"items":{"type":"object","anyOf":[)"
            R"({"properties":{"name":{"type":"string","const":"get_weather"},"parameters":{"type":"object","properties":)"
            R"({"city":{"type":"string"}},"required":["city"]}},"required":["name","parameters"]},)"
            R"({"properties":{"name":{"type":"string","const":"get_time"},"parameters":{"type":"object","properties":{}}},)"
            R"("required":["name","parameters"]}]}})");
  auto one = chat(std::string(R"("tool_choice": "required", "parallel_tool_calls": false,
      "structured_outputs": {"disable_any_whitespace": true}, "tools": )") + kTools);
  EXPECT_FALSE(one.tool_choice.parallel_tool_calls);
  ASSERT_TRUE(one.params.structured_outputs);
  EXPECT_FALSE(one.params.structured_outputs->any_whitespace);
  EXPECT_EQ(json::parse(one.params.structured_outputs->spec)["maxItems"], 1);
}

TEST(ToolChoice, DefsMoveToTheTopOfTheRequiredSchema) {
  ojson tools = ojson::parse(R"([
    {"function": {"name": "a", "parameters": {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
                                               "$defs": {"P": {"type": "integer"}}}}},
    {"function": {"name": "b", "parameters": {"$defs": {"P": {"type": "integer"}, "Q": {"type": "string"}}}}}])");
  ojson s = required_tool_calls_schema(tools, true);
  EXPECT_EQ(s["$defs"].dump(), R"({"P":{"type":"integer"},"Q":{"type":"string"}})");
  EXPECT_FALSE(s["items"]["anyOf"][0]["properties"]["parameters"].contains("$defs"));
  tools[1]["function"]["parameters"]["$defs"]["P"] = ojson{{"type", "string"}};
  ApiError e = parse_error([&] { required_tool_calls_schema(tools, true); });
  EXPECT_NE(std::string(e.what()).find("'P' has multiple schemas"), std::string::npos) << e.what();
}

TEST(ToolChoice, NamedForcesTheToolsParameters) {
  auto r = chat(std::string(R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "tools": )") +
                kTools);
  EXPECT_EQ(r.tool_choice.kind, Kind::kNamed);
  EXPECT_EQ(r.tool_choice.function, "get_weather");
  ASSERT_TRUE(r.params.structured_outputs);
  EXPECT_EQ(r.params.structured_outputs->kind, StructuredOutputsParams::Kind::kJson);
  EXPECT_EQ(r.params.structured_outputs->spec,
            R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  auto no_params = chat(std::string(R"("tool_choice": {"function": {"name": "get_time"}}, "tools": )") + kTools);
  EXPECT_EQ(no_params.params.structured_outputs->spec, R"({"type":"object","properties":{}})");
}

TEST(ToolChoice, ForcedToolsAndAnotherConstraintAreA400) {
  for (const char* other : {R"("response_format": {"type": "json_object"})", R"("guided_regex": "a")",
                            R"("structured_outputs": {"choice": ["a"]})"}) {
    for (const char* choice : {R"("required")", R"({"type": "function", "function": {"name": "get_time"}})"}) {
      ApiError e = chat_error(std::string(other) + R"(, "tool_choice": )" + choice + R"(, "tools": )" + kTools);
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "tool_choice");
      EXPECT_NE(std::string(e.what()).find("Only one kind of structured output"), std::string::npos) << e.what();
    }
    // auto and none force nothing: the other constraint stands.
    auto r = chat(std::string(other) + R"(, "tool_choice": "auto", "tools": )" + kTools);
    EXPECT_TRUE(r.params.structured_outputs);
  }
}

TEST(ToolChoice, EveryWrongToolOrChoiceIsA400NamingIt) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("tools": {})", "tools"},
      {R"("tools": [1])", "tools[0]"},
      {R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])", "tools[0].type"},
      {R"("tools": [{"type": "function"}])", "tools[0].function"},
      {R"("tools": [{"function": {"name": "f"}}, {"function": {"name": ""}}])", "tools[1].function.name"},
      {R"("tools": [{"function": {"name": 5}}])", "tools[0].function.name"},
      {R"("tools": [{"function": {"description": "d"}}])", "tools[0].function.name"},
      {R"("tools": [{"function": {"name": "f", "description": 1}}])", "tools[0].function.description"},
      {R"("tools": [{"function": {"name": "f", "parameters": "{}"}}])", "tools[0].function.parameters"},
      {R"("tool_choice": "sometimes", "tools": [{"function": {"name": "f"}}])", "tool_choice"},
      {R"("tool_choice": 1, "tools": [{"function": {"name": "f"}}])", "tool_choice"},
      {R"("tool_choice": "auto")", "tool_choice"},
      {R"("tool_choice": "required")", "tool_choice"},
      {R"("tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [{"function": {"name": "f"}}])",
       "tool_choice"},
      {R"("tool_choice": {"type": "function"}, "tools": [{"function": {"name": "f"}}])", "tool_choice"},
      {R"("tool_choice": {"type": "function", "function": {"name": ""}}, "tools": [{"function": {"name": "f"}}])",
       "tool_choice"},
      {R"("tool_choice": {"type": "x", "function": {"name": "f"}}, "tools": [{"function": {"name": "f"}}])",
       "tool_choice"},
      {R"("parallel_tool_calls": "no")", "parallel_tool_calls"},
  };
  for (const auto& [fields, param] : cases) {
    ApiError e = chat_error(fields);
    EXPECT_EQ(e.status(), 400) << fields;
    EXPECT_EQ(e.param().value_or(""), param) << fields << ": " << e.what();
  }
  EXPECT_NE(std::string(chat_error(R"("tool_choice": "auto")").what()).find("`tools` must be set"), std::string::npos);
  EXPECT_NE(std::string(chat_error(R"("tool_choice": {"function": {"name": "g"}}, "tools": [{"function": {"name": "f"}}])")
                            .what()).find("does not match any of the specified `tools`"), std::string::npos);
}

TEST(ToolChoice, ParallelToolCallsIsKnownToTheChatRoute) {
  EXPECT_TRUE(chat(R"("parallel_tool_calls": false)").ignored_fields.empty());
}

}  // namespace
}  // namespace specula::server
