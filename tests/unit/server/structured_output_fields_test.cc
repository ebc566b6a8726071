#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/request_parser.h"
#include "server/structured_output_fields.h"

namespace specula::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using Kind = StructuredOutputsParams::Kind;

ApiError parse_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an ApiError";
  return ApiError(0, "", "");
}

// Parses `fields` added to a minimal completion request, and the same as a chat request: both
// routes take every structured-output field.
std::optional<StructuredOutputsParams> both_routes(const std::string& fields, CompletionRequest* out = nullptr) {
  std::string c = R"({"prompt": "x", )" + fields + "}";
  CompletionRequest cr = parse_completion_request(json::parse(c), ojson::parse(c), {});
  std::string ch = R"({"messages": [{"role": "user", "content": "x"}], )" + fields + "}";
  ChatRequest chat = parse_chat_request(json::parse(ch), ojson::parse(ch), {});
  EXPECT_EQ(cr.params.structured_outputs.has_value(), chat.params.structured_outputs.has_value()) << fields;
  if (cr.params.structured_outputs) {
    EXPECT_EQ(cr.params.structured_outputs->kind, chat.params.structured_outputs->kind) << fields;
    EXPECT_EQ(cr.params.structured_outputs->spec, chat.params.structured_outputs->spec) << fields;
    EXPECT_EQ(cr.params.structured_outputs->choices, chat.params.structured_outputs->choices) << fields;
    EXPECT_EQ(cr.params.structured_outputs->any_whitespace, chat.params.structured_outputs->any_whitespace) << fields;
  }
  EXPECT_EQ(cr.ignored_fields, chat.ignored_fields) << fields;
  if (out) *out = cr;
  return cr.params.structured_outputs;
}

// The 400 of `fields` on both routes; returns its param (the same on both).
std::string error_param(const std::string& fields, std::string* message = nullptr) {
  std::string c = R"({"prompt": "x", )" + fields + "}";
  ApiError e1 = parse_error([&] { parse_completion_request(json::parse(c), ojson::parse(c), {}); });
  std::string ch = R"({"messages": [{"role": "user", "content": "x"}], )" + fields + "}";
  ApiError e2 = parse_error([&] { parse_chat_request(json::parse(ch), ojson::parse(ch), {}); });
  EXPECT_EQ(e1.status(), 400) << fields;
  EXPECT_EQ(e2.status(), 400) << fields;
  EXPECT_EQ(e1.param(), e2.param()) << fields;
  EXPECT_STREQ(e1.what(), e2.what()) << fields;
  if (message) *message = e1.what();
  return e1.param().value_or("");
}

TEST(StructuredOutputFields, ResponseFormat) {
  EXPECT_FALSE(both_routes(R"("response_format": {"type": "text"})"));
  EXPECT_FALSE(both_routes(R"("response_format": null)"));
  auto obj = both_routes(R"("response_format": {"type": "json_object"})");
  ASSERT_TRUE(obj);
  EXPECT_EQ(obj->kind, Kind::kJsonObject);
  EXPECT_TRUE(obj->any_whitespace);
  // The schema's text keeps the client's key order (the order the model will write them in).
  auto schema = both_routes(R"("response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
      "schema": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}})");
  ASSERT_TRUE(schema);
  EXPECT_EQ(schema->kind, Kind::kJson);
  EXPECT_EQ(schema->spec, R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})");
}

TEST(StructuredOutputFields, VllmStructuredOutputs) {
  auto j = both_routes(R"("structured_outputs": {"json": {"type": "object", "b": 1, "a": 2}})");
  ASSERT_TRUE(j);
  EXPECT_EQ(j->kind, Kind::kJson);
  EXPECT_EQ(j->spec, R"({"type":"object","b":1,"a":2})");
  auto jtext = both_routes(R"("structured_outputs": {"json": "{\"type\": \"object\"}"})");
  ASSERT_TRUE(jtext);
  EXPECT_EQ(jtext->spec, R"({"type": "object"})");  // the text as given
  auto re = both_routes(R"("structured_outputs": {"regex": "[a-z]+\\d"})");
  ASSERT_TRUE(re);
  EXPECT_EQ(re->kind, Kind::kRegex);
  EXPECT_EQ(re->spec, "[a-z]+\\d");
  auto choice = both_routes(R"("structured_outputs": {"choice": ["yes", "no"]})");
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->kind, Kind::kChoice);
  EXPECT_EQ(choice->choices, (std::vector<std::string>{"yes", "no"}));
  auto grammar = both_routes(R"("structured_outputs": {"grammar": "root ::= \"a\""})");
  ASSERT_TRUE(grammar);
  EXPECT_EQ(grammar->kind, Kind::kGrammar);
  EXPECT_EQ(grammar->spec, "root ::= \"a\"");
  auto obj = both_routes(R"("structured_outputs": {"json_object": true, "disable_any_whitespace": true})");
  ASSERT_TRUE(obj);
  EXPECT_EQ(obj->kind, Kind::kJsonObject);
  EXPECT_FALSE(obj->any_whitespace);
  EXPECT_FALSE(both_routes(R"("structured_outputs": {"json_object": false})"));
  EXPECT_FALSE(both_routes(R"("structured_outputs": {})"));
  // disable_any_whitespace applies to the constraint whichever field sets it.
  auto rf = both_routes(R"("response_format": {"type": "json_object"}, "structured_outputs": {"disable_any_whitespace": true})");
  ASSERT_TRUE(rf);
  EXPECT_FALSE(rf->any_whitespace);
  // The backend is vLLM's choice among grammar engines: accepted, logged as not acted on.
  CompletionRequest req;
  auto b = both_routes(R"("structured_outputs": {"regex": "a", "backend": "xgrammar", "disable_fallback": true})", &req);
  ASSERT_TRUE(b);
  EXPECT_EQ(req.ignored_fields, (std::vector<std::string>{"structured_outputs.backend", "structured_outputs.disable_fallback"}));
}

TEST(StructuredOutputFields, OlderGuidedFields) {
  auto j = both_routes(R"("guided_json": {"type": "array"})");
  ASSERT_TRUE(j);
  EXPECT_EQ(j->kind, Kind::kJson);
  EXPECT_EQ(j->spec, R"({"type":"array"})");
  auto jt = both_routes(R"("guided_json": "{\"type\": \"array\"}")");
  ASSERT_TRUE(jt);
  EXPECT_EQ(jt->spec, R"({"type": "array"})");
  auto re = both_routes(R"("guided_regex": "\\d+")");
  ASSERT_TRUE(re);
  EXPECT_EQ(re->kind, Kind::kRegex);
  auto c = both_routes(R"("guided_choice": ["a", "b"])");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->choices, (std::vector<std::string>{"a", "b"}));
  auto g = both_routes(R"("guided_grammar": "root ::= x")");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->kind, Kind::kGrammar);
  // guided_decoding_backend: not acted on, so listed for the warning like any unknown field.
  CompletionRequest req;
  both_routes(R"("guided_regex": "a", "guided_decoding_backend": "outlines")", &req);
  EXPECT_EQ(req.ignored_fields, (std::vector<std::string>{"guided_decoding_backend"}));
  EXPECT_FALSE(both_routes(R"("guided_json": null, "guided_regex": null)"));
}

TEST(StructuredOutputFields, EveryWrongFieldIsA400NamingIt) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("response_format": "json")", "response_format"},
      {R"("response_format": {})", "response_format.type"},
      {R"("response_format": {"type": 3})", "response_format.type"},
      {R"("response_format": {"type": "structural_tag"})", "response_format.type"},
      {R"("response_format": {"type": "xml"})", "response_format.type"},
      {R"("response_format": {"type": "json_schema"})", "response_format.json_schema"},
      {R"("response_format": {"type": "json_schema", "json_schema": []})", "response_format.json_schema"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"schema": {}}})", "response_format.json_schema.name"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})", "response_format.json_schema.schema"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "s"}})",
       "response_format.json_schema.schema"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": 1, "schema": {}}})",
       "response_format.json_schema.name"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}})",
       "response_format.json_schema.strict"},
      {R"("structured_outputs": [1])", "structured_outputs"},
      {R"("structured_outputs": {"json": 5})", "structured_outputs.json"},
      {R"("structured_outputs": {"json": "not json"})", "structured_outputs.json"},
      {R"("structured_outputs": {"json": "[1]"})", "structured_outputs.json"},
      {R"("structured_outputs": {"regex": 1})", "structured_outputs.regex"},
      {R"("structured_outputs": {"choice": "a"})", "structured_outputs.choice"},
      {R"("structured_outputs": {"choice": []})", "structured_outputs.choice"},
      {R"("structured_outputs": {"choice": ["a", 2]})", "structured_outputs.choice[1]"},
      {R"("structured_outputs": {"grammar": {}})", "structured_outputs.grammar"},
      {R"("structured_outputs": {"json_object": "true"})", "structured_outputs.json_object"},
      {R"("structured_outputs": {"disable_any_whitespace": 1})", "structured_outputs.disable_any_whitespace"},
      {R"("structured_outputs": {"whitespace_pattern": " "})", "structured_outputs.whitespace_pattern"},
      {R"("structured_outputs": {"structural_tag": "{}"})", "structured_outputs.structural_tag"},
      {R"("structured_outputs": {"disable_additional_properties": true})",
       "structured_outputs.disable_additional_properties"},
      {R"("structured_outputs": {"backend": 1})", "structured_outputs.backend"},
      {R"("guided_json": 1)", "guided_json"},
      {R"("guided_regex": ["a"])", "guided_regex"},
      {R"("guided_choice": "a")", "guided_choice"},
      {R"("guided_grammar": 1)", "guided_grammar"},
      {R"("guided_whitespace_pattern": "\\s*")", "guided_whitespace_pattern"},
      {R"("guided_decoding_backend": 7)", "guided_decoding_backend"},
  };
  for (const auto& [fields, param] : cases) EXPECT_EQ(error_param(fields), param) << fields;
}

TEST(StructuredOutputFields, TwoConstraintsAreA400NamingBoth) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("response_format": {"type": "json_object"}, "guided_regex": "a")", "'response_format' and 'guided_regex'"},
      {R"("structured_outputs": {"regex": "a", "choice": ["b"]})", "'structured_outputs.regex' and 'structured_outputs.choice'"},
      {R"("structured_outputs": {"json_object": true}, "guided_json": {})", "'structured_outputs.json_object' and 'guided_json'"},
      {R"("guided_json": {}, "guided_choice": ["a"])", "'guided_json' and 'guided_choice'"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}}, "structured_outputs": {"json": {}})",
       "'response_format' and 'structured_outputs.json'"},
  };
  for (const auto& [fields, names] : cases) {
    std::string msg;
    error_param(fields, &msg);
    EXPECT_NE(msg.find("Only one kind of structured output"), std::string::npos) << msg;
    EXPECT_NE(msg.find(names), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace specula::server
