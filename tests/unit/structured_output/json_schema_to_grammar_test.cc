// JSON Schema front end: the language of each keyword, checked on accepted and rejected texts,
// on nlohmann's own serializations of valid and invalid instances, and on error messages.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "structured_output/grammar_automaton.h"
#include "structured_output/json_schema_to_grammar.h"

namespace specula {
namespace {

using nlohmann::ordered_json;

JsonGrammarOptions compact() {
  JsonGrammarOptions o;
  o.any_whitespace = false;
  o.item_separator = ",";
  o.key_separator = ":";
  return o;
}

Grammar compile(std::string_view schema, const JsonGrammarOptions& o = {}) { return json_schema_text_to_grammar(schema, o); }

void expect_language(std::string_view schema, std::vector<std::string> accepted, std::vector<std::string> rejected,
                     const JsonGrammarOptions& o = {}) {
  Grammar g = compile(schema, o);
  for (const std::string& s : accepted) EXPECT_TRUE(grammar_matches(g, s)) << schema << "\nshould match " << s;
  for (const std::string& s : rejected) EXPECT_FALSE(grammar_matches(g, s)) << schema << "\nshould not match " << s;
}

// Every dump of a valid instance matches (compact always; indented when whitespace is free),
// every dump of an invalid one does not.
void expect_instances(std::string_view schema, std::vector<ordered_json> valid, std::vector<ordered_json> invalid) {
  Grammar any_ws = compile(schema);
  Grammar tight = compile(schema, compact());
  for (const ordered_json& v : valid) {
    EXPECT_TRUE(grammar_matches(any_ws, v.dump())) << schema << "\nshould match " << v.dump();
    EXPECT_TRUE(grammar_matches(any_ws, v.dump(2))) << schema << "\nshould match " << v.dump(2);
    EXPECT_TRUE(grammar_matches(tight, v.dump())) << schema << "\ncompact should match " << v.dump();
    if (v.is_structured() && !v.empty()) EXPECT_FALSE(grammar_matches(tight, v.dump(2))) << v.dump(2);
  }
  for (const ordered_json& v : invalid) {
    EXPECT_FALSE(grammar_matches(any_ws, v.dump())) << schema << "\nshould not match " << v.dump();
    EXPECT_FALSE(grammar_matches(any_ws, v.dump(2))) << schema << "\nshould not match " << v.dump(2);
    EXPECT_FALSE(grammar_matches(tight, v.dump())) << schema << "\ncompact should not match " << v.dump();
  }
}

std::string error_of(std::string_view schema) {
  try {
    compile(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchemaToGrammar, ScalarTypes) {
  expect_language(R"({"type":"string"})", {R"("")", R"("abc")", R"("a\"b\\c\/\b\f\n\r\t\u00e9")", "\"é😀\""},
                  {"abc", R"("a)", "\"a\nb\"", R"("\x")", R"("\u12")", "\"\x01\""});
  expect_language(R"({"type":"integer"})", {"0", "-7", "1234567890123"}, {"01", "1.5", "+1", "1e3", "-", ""});
  expect_language(R"({"type":"number"})", {"0", "-0.5", "1.25e-3", "3E+10", "42"}, {"01", ".5", "1.", "1e", "--1"});
  expect_language(R"({"type":"boolean"})", {"true", "false"}, {"True", "1"});
  expect_language(R"({"type":"null"})", {"null"}, {"nul", "None"});
  expect_language(R"({"type":["string","null"]})", {"null", R"("x")"}, {"1"});
  expect_language(R"({})", {"1", "null", R"({"a":[1,{"b":null}]})"}, {"{a:1}"});
  expect_language(R"(true)", {"[]", R"("s")"}, {"x"});
}

TEST(JsonSchemaToGrammar, ToolCallSchemaWithFiveProperties) {
  const char* schema = R"({
    "type": "object",
    "title": "get_weather", "description": "Weather for a place",
    "properties": {
      "city": {"type": "string", "description": "City name"},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 14},
      "include_hourly": {"type": "boolean"},
      "coords": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                 "required": ["lat", "lon"], "additionalProperties": false}
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": false
  })";
  expect_instances(schema,
                   {ordered_json::parse(R"({"city":"Paris","unit":"celsius","days":3})"),
                    ordered_json::parse(R"({"city":"Oslo","unit":"fahrenheit","days":14,"include_hourly":true})"),
                    ordered_json::parse(R"({"city":"","unit":"celsius","days":1,"coords":{"lat":1.5,"lon":-2}})"),
                    ordered_json::parse(
                        R"({"city":"x","unit":"celsius","days":7,"include_hourly":false,"coords":{"lat":0,"lon":0}})")},
                   {ordered_json::parse(R"({"city":"Paris","unit":"kelvin","days":3})"),
                    ordered_json::parse(R"({"city":"Paris","unit":"celsius"})"),
                    ordered_json::parse(R"({"city":"Paris","unit":"celsius","days":15})"),
                    ordered_json::parse(R"({"city":"Paris","unit":"celsius","days":0})"),
                    ordered_json::parse(R"({"unit":"celsius","city":"Paris","days":3})"),  // schema order
                    ordered_json::parse(R"({"city":"Paris","unit":"celsius","days":3,"extra":1})"),
                    ordered_json::parse(R"({"city":"P","unit":"celsius","days":3,"coords":{"lat":1}})"),
                    ordered_json::parse(R"([])")});
  Grammar g = compile(schema);
  EXPECT_TRUE(grammar_allows_prefix(g, R"({"city": "Par)"));
  EXPECT_TRUE(grammar_allows_prefix(g, R"({ "city" : "P" , "unit":"c)"));
  EXPECT_FALSE(grammar_allows_prefix(g, R"({"town)"));
  EXPECT_FALSE(grammar_allows_prefix(g, R"({"city":"P","unit":"k)"));
}

TEST(JsonSchemaToGrammar, WhitespaceIsBoundedAndOptional) {
  const char* schema = R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}},"required":["a"]})";
  Grammar g = compile(schema);
  EXPECT_TRUE(grammar_matches(g, "{ \"a\" :\n[ 1 ,\t2 ]\r\n}"));
  EXPECT_TRUE(grammar_matches(g, "{" + std::string(20, ' ') + "\"a\":[]}"));
  EXPECT_FALSE(grammar_matches(g, "{" + std::string(21, ' ') + "\"a\":[]}"));
  EXPECT_FALSE(grammar_matches(g, " {\"a\":[]}"));  // none outside the value
  EXPECT_FALSE(grammar_matches(g, "{\"a\":[]} "));
  JsonGrammarOptions loose;
  loose.max_whitespace = 100;
  EXPECT_TRUE(grammar_matches(compile(schema, loose), "{" + std::string(100, '\n') + "\"a\":[]}"));
}

TEST(JsonSchemaToGrammar, WithoutWhitespaceTheSeparatorsAreXgrammars) {
  const char* schema = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"array","items":{"type":"integer"}}},"required":["a","b"]})";
  JsonGrammarOptions o;
  o.any_whitespace = false;
  expect_language(schema, {R"({"a": 1, "b": [1, 2]})", R"({"a": 1, "b": []})"},
                  {R"({"a":1,"b":[1,2]})", R"({"a": 1,"b": [1, 2]})", R"({ "a": 1, "b": [1, 2]})"}, o);
  expect_language(schema, {R"({"a":1,"b":[1,2]})"}, {R"({"a": 1, "b": [1, 2]})"}, compact());
}

TEST(JsonSchemaToGrammar, OptionalPropertiesKeepSchemaOrder) {
  const char* schema = R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"integer"},"m":{"type":"integer"}}})";
  expect_language(schema, {"{}", R"({"z":1})", R"({"a":1})", R"({"m":1})", R"({"z":1,"m":2})", R"({"z":1,"a":2,"m":3})"},
                  {R"({"a":1,"z":2})", R"({"m":1,"a":2})", R"({"z":1,})", R"({,"a":1})", R"({"z":1,"z":1})"}, compact());
  expect_language(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["b"]})",
                  {R"({"b":1})", R"({"a":1,"b":2})"}, {"{}", R"({"a":1})"}, compact());
}

TEST(JsonSchemaToGrammar, AdditionalProperties) {
  // Absent: false (xgrammar's strict mode, as vLLM runs it).
  expect_language(R"({"type":"object","properties":{"a":{"type":"integer"}}})", {R"({"a":1})"}, {R"({"a":1,"b":2})"}, compact());
  expect_language(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})",
                  {R"({"a":1,"b":[true]})", R"({"x":null,"y":"z"})", "{}"}, {R"({"b":1,)"}, compact());
  expect_language(R"({"type":"object","additionalProperties":{"type":"string"}})", {R"({"k":"v","k2":"v2"})", "{}"},
                  {R"({"k":1})"}, compact());
  expect_language(R"({"type":"object"})", {"{}"}, {R"({"a":1})"}, compact());
}

TEST(JsonSchemaToGrammar, NestedObjectsAndArrays) {
  const char* schema = R"({"type":"object","properties":{
      "user":{"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},
              "required":["name","tags"]},
      "scores":{"type":"array","items":{"type":"array","items":{"type":"number"}}}},
    "required":["user","scores"]})";
  expect_instances(schema,
                   {ordered_json::parse(R"({"user":{"name":"ann","tags":[]},"scores":[]})"),
                    ordered_json::parse(R"({"user":{"name":"b","tags":["x","y"]},"scores":[[1,2.5],[],[-3e5]]})")},
                   {ordered_json::parse(R"({"user":{"name":"ann"},"scores":[]})"),
                    ordered_json::parse(R"({"user":{"name":"b","tags":[1]},"scores":[]})"),
                    ordered_json::parse(R"({"user":{"name":"b","tags":[]},"scores":[1]})")});
}

TEST(JsonSchemaToGrammar, RecursiveRefs) {
  const char* tree = R"({
    "$defs": {"node": {"type":"object","properties":{"value":{"type":"integer"},
                        "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
                       "required":["value","children"]}},
    "$ref": "#/$defs/node"})";
  expect_instances(tree,
                   {ordered_json::parse(R"({"value":1,"children":[]})"),
                    ordered_json::parse(R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]}]})")},
                   {ordered_json::parse(R"({"value":1})"),
                    ordered_json::parse(R"({"value":1,"children":[{"value":2}]})")});
  // The root itself, and draft-7 definitions.
  expect_language(R"({"type":"array","items":{"anyOf":[{"type":"integer"},{"$ref":"#"}]}})",
                  {"[]", "[1,[2,[]],3]"}, {"[[1],x]"}, compact());
  expect_language(R"({"definitions":{"a b/c":{"type":"integer"}},"$ref":"#/definitions/a b~1c"})", {"5"}, {"\"5\""});
}

TEST(JsonSchemaToGrammar, EnumAndConst) {
  expect_language(R"({"enum":["red","green",3,null,true,{"k":[1,"x"]}]})",
                  {R"("red")", R"("green")", "3", "null", "true", R"({"k":[1,"x"]})", R"({ "k" : [ 1 , "x" ] })"},
                  {R"("blue")", "4", "false", R"({"k":[1]})"});
  expect_language(R"({"const":"only"})", {R"("only")"}, {R"("other")"});
  expect_language(R"({"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"]})",
                  {R"({"kind":"circle","r":2})"}, {R"({"kind":"square","r":2})"}, compact());
  expect_language(R"({"const":"a\"é\n"})", {R"("a\"é\n")"}, {"\"a\\\"é\n\""});
}

TEST(JsonSchemaToGrammar, AnyOfOneOfAllOf) {
  const char* schema = R"({"anyOf":[{"type":"integer"},{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}]})";
  expect_language(schema, {"1", R"({"a":"x"})"}, {R"("x")", "{}"}, compact());
  expect_language(R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"1"});
  expect_language(R"({"allOf":[{"type":"integer","minimum":3}],"description":"wrapped"})", {"3", "40"}, {"2"});
}

TEST(JsonSchemaToGrammar, ArrayBounds) {
  const char* schema = R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":4})";
  expect_instances(schema,
                   {ordered_json::parse("[1,2]"), ordered_json::parse("[1,2,3,4]")},
                   {ordered_json::parse("[]"), ordered_json::parse("[1]"), ordered_json::parse("[1,2,3,4,5]"),
                    ordered_json::parse(R"([1,"2"])")});
  expect_language(R"({"type":"array","maxItems":0})", {"[]"}, {"[1]"});
  expect_language(R"({"type":"array","items":{"type":"integer"},"minItems":1})", {"[1]", "[1,2,3]"}, {"[]"});
  expect_language(R"({"type":"array","items":{"type":"integer"},"maxItems":1})", {"[]", "[1]"}, {"[1,2]"});
  expect_language(R"({"type":"array"})", {"[]", R"([1,"a",[null]])"}, {"[1,]"});
}

TEST(JsonSchemaToGrammar, PrefixItems) {
  expect_language(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}]})",
                  {R"(["a",1])"}, {R"(["a"])", R"(["a",1,2])", R"([1,"a"])"}, compact());
  expect_language(R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"integer"},"maxItems":3})",
                  {R"(["a"])", R"(["a",1,2])"}, {R"(["a",1,2,3])", R"(["a","b"])"}, compact());
  expect_language(R"({"type":"array","items":[{"type":"string"},{"type":"null"}]})", {R"(["a",null])"}, {R"(["a"])"}, compact());
}

TEST(JsonSchemaToGrammar, StringLength) {
  const char* schema = R"({"type":"string","minLength":2,"maxLength":3})";
  expect_language(schema, {R"("ab")", R"("abc")", R"("é😀")", R"("\n\u0041")", R"("a\"b")"},
                  {R"("a")", R"("abcd")", R"("")", R"("\n")"});
  expect_language(R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"});
  expect_language(R"({"type":"string","minLength":1})", {R"("a")", R"("abcdefgh")"}, {R"("")"});
  // Above the limit an upper bound is dropped.
  expect_language(R"({"type":"string","maxLength":100000})", {"\"" + std::string(200, 'x') + "\""}, {});
}

TEST(JsonSchemaToGrammar, StringPatternAndFormat) {
  expect_language(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})", {R"("AB-123")"}, {R"("ab-123")", R"("AB-1234")", "AB-123"});
  expect_language(R"({"type":"string","pattern":"a\"b\\\\"})", {R"("a\"b\\")"}, {"\"a\"b\\\""});
  expect_language(R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("24-01-01")"});
  expect_language(R"({"type":"string","format":"date-time"})", {R"("2024-01-02T03:04:05Z")", R"("2024-01-02T03:04:05.123+01:00")"},
                  {R"("2024-01-02 03:04:05")"});
  expect_language(R"({"type":"string","format":"time"})", {R"("23:59:60Z")"}, {R"("24:00:00Z")"});
  expect_language(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"});
  expect_language(R"({"type":"string","format":"email"})", {R"("a.b+c@example.com")"}, {R"("a@b")", R"("@x.com")"});
  expect_language(R"({"type":"string","format":"ipv4"})", {R"("192.168.0.255")"}, {R"("256.1.1.1")"});
  expect_language(R"({"type":"string","format":"x-unknown"})", {R"("anything")"}, {});  // an annotation
}

TEST(JsonSchemaToGrammar, IntegerBounds) {
  expect_language(R"({"type":"integer","minimum":0})", {"0", "7", "100000000000"}, {"-1", "-0", "00"});
  expect_language(R"({"type":"integer","exclusiveMinimum":0})", {"1", "99"}, {"0", "-3"});
  expect_language(R"({"type":"integer","minimum":-5,"maximum":123})", {"-5", "-1", "0", "9", "10", "99", "100", "123"},
                  {"-6", "-10", "124", "200", "1000", "-0"});
  expect_language(R"({"type":"integer","minimum":17,"maximum":2351})", {"17", "19", "20", "99", "100", "999", "1000", "2351", "2299"},
                  {"16", "2352", "2400", "9999", "5"});
  expect_language(R"({"type":"integer","exclusiveMaximum":-10})", {"-11", "-1000"}, {"-10", "0", "5"});
  expect_language(R"({"type":"integer","minimum":2.5,"maximum":4.5})", {"3", "4"}, {"2", "5"});
  expect_language(R"({"type":"integer","minimum":5,"exclusiveMinimum":true})", {"6"}, {"5"});  // draft 4
  expect_language(R"({"type":"integer","minimum":-9223372036854775808})", {"0", "-999999999999999999"}, {});
  for (int lo : {-120, -7, 0, 3, 45}) {
    for (int hi : {-3, 0, 9, 77, 301}) {
      if (hi < lo) continue;
      Grammar g = compile(fmt::format(R"({{"type":"integer","minimum":{},"maximum":{}}})", lo, hi));
      for (int v = -400; v <= 400; ++v)
        ASSERT_EQ(grammar_matches(g, std::to_string(v)), v >= lo && v <= hi) << lo << ".." << hi << " " << v;
    }
  }
}

TEST(JsonSchemaToGrammar, NumberBoundsNeverAdmitAnInvalidValue) {
  expect_language(R"({"type":"number","minimum":0})", {"0", "0.5", "12.25"}, {"-0.5", "-1"});
  expect_language(R"({"type":"number","exclusiveMinimum":0})", {"0.5", "0.001", "3"}, {"0", "0.0", "-1"});
  expect_language(R"({"type":"number","minimum":0,"maximum":1})", {"0", "0.5", "1", "0.999"}, {"1.5", "2", "-0.1"});
  expect_language(R"({"type":"number","minimum":-2.5,"exclusiveMaximum":3})", {"-2", "0", "2.99", "-1.5"}, {"3", "3.1", "-3"});
  const char* schemas[] = {R"({"type":"number","minimum":-2.5,"maximum":2.5})", R"({"type":"number","exclusiveMinimum":-1,"maximum":0})",
                           R"({"type":"number","minimum":1.5})", R"({"type":"number","exclusiveMaximum":-0.5})"};
  const double bounds[][4] = {{-2.5, 0, 2.5, 0}, {-1, 1, 0, 0}, {1.5, 0, 1e300, 0}, {-1e300, 0, -0.5, 1}};
  for (int s = 0; s < 4; ++s) {
    Grammar g = compile(schemas[s]);
    for (int i = -400; i <= 400; ++i) {
      for (const std::string& text : {fmt::format("{}", i / 100.0), fmt::format("{}", i / 10), fmt::format("{:.2f}", i / 100.0)}) {
        if (!grammar_matches(g, text)) continue;
        double v = std::stod(text);
        EXPECT_TRUE(bounds[s][1] ? v > bounds[s][0] : v >= bounds[s][0]) << schemas[s] << " " << text;
        EXPECT_TRUE(bounds[s][3] ? v < bounds[s][2] : v <= bounds[s][2]) << schemas[s] << " " << text;
      }
    }
  }
}

TEST(JsonSchemaToGrammar, UnsupportedKeywordsNameThemselvesAndTheirPath) {
  EXPECT_EQ(error_of(R"({"type":"object","properties":{"a":{"not":{"type":"string"}}}})"),
            "JSON schema: the keyword 'not' is not supported at '#/properties/a/not'");
  EXPECT_NE(error_of(R"({"if":{},"then":{}})").find("'if'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"object","patternProperties":{"^a":{}}})").find("'patternProperties' is not supported at '#/patternProperties'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"object","dependentRequired":{}})").find("dependentRequired"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"array","items":{"type":"array","uniqueItems":true}})").find("#/items/uniqueItems"), std::string::npos);
  EXPECT_EQ(error_of(R"({"type":"array","uniqueItems":false})"), "");
  EXPECT_NE(error_of(R"({"allOf":[{"type":"integer"},{"minimum":1}]})").find("allOf"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"#/$defs/a","type":"object","$defs":{"a":{}}})").find("'type' alongside '$ref'"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"https://example.com/s.json"})").find("only local references"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"strin"})").find("unknown type 'strin' at '#/type'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","pattern":"(a)\\1"})").find("backreferences"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","pattern":"a","maxLength":3})").find("#/pattern"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","minLength":20000})").find("'minLength' above 10000"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","minLength":3,"maxLength":2})").find("below"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"integer","minimum":5,"maximum":4})").find("no integer"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"object","required":["x"]})").find("'x' is not in 'properties'"), std::string::npos);
  EXPECT_NE(error_of(R"(false)").find("matches nothing"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":)").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})").find("left-recursive"), std::string::npos);
  // Annotations and unknown keywords are ignored.
  EXPECT_EQ(error_of(R"({"type":"string","title":"t","description":"d","examples":["x"],"default":"y","$schema":"s","$id":"i","$comment":"c","x-vendor":1})"), "");
}

TEST(JsonSchemaToGrammar, DepthIsLimited) {
  std::string deep = R"({"type":"string"})";
  for (int i = 0; i < 70; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  EXPECT_NE(error_of(deep).find("deeper than 64"), std::string::npos);
  std::string ok = R"({"type":"string"})";
  for (int i = 0; i < 30; ++i) ok = R"({"type":"array","items":)" + ok + "}";
  EXPECT_EQ(error_of(ok), "");
}

TEST(JsonSchemaToGrammar, PlainJsonOverloadSortsKeys) {
  nlohmann::json schema = nlohmann::json::parse(R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"integer"}},"required":["a","b"]})");
  Grammar g = json_schema_to_grammar(schema, compact());
  EXPECT_TRUE(grammar_matches(g, R"({"a":1,"b":2})"));
  EXPECT_FALSE(grammar_matches(g, R"({"b":2,"a":1})"));
}

TEST(AnyJsonGrammar, AnyObjectAtTheTop) {
  Grammar g = any_json_grammar();
  for (const char* ok : {"{}", "{ }", R"({"a":1})", R"({"a":[1,2,{"b":null}],"c":"d","e":-1.5e3,"f":true})",
                         "{\n  \"a\": [\n    1\n  ]\n}"})
    EXPECT_TRUE(grammar_matches(g, ok)) << ok;
  for (const char* bad : {"[]", "1", R"("s")", "{a:1}", R"({"a":1,})", R"({"a"})", "{'a':1}", R"({"a":01})"})
    EXPECT_FALSE(grammar_matches(g, bad)) << bad;
  ordered_json v = ordered_json::parse(R"({"x":[1,2.5,"é\n",{"y":[]}],"z":{"w":false}})");
  EXPECT_TRUE(grammar_matches(g, v.dump()));
  EXPECT_TRUE(grammar_matches(g, v.dump(2)));
  Grammar tight = any_json_grammar(compact());
  EXPECT_TRUE(grammar_matches(tight, v.dump()));
  EXPECT_FALSE(grammar_matches(tight, v.dump(2)));
  EXPECT_TRUE(grammar_allows_prefix(g, R"({"x": [1, "ab)"));
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

TEST(JsonSchemaToGrammar, LargeBoundsAtTheLimitCompileAndRun) {
  Grammar s = compile(R"({"type":"string","maxLength":10000})");
  EXPECT_TRUE(grammar_matches(s, "\"" + std::string(10000, 'a') + "\""));
  EXPECT_FALSE(grammar_matches(s, "\"" + std::string(10001, 'a') + "\""));
  Grammar a = compile(R"({"type":"array","items":{"type":"integer"},"minItems":3,"maxItems":10000})", compact());
  std::string arr = "[1";
  for (int i = 1; i < 10000; ++i) arr += ",1";
  EXPECT_TRUE(grammar_matches(a, arr + "]"));
  EXPECT_FALSE(grammar_matches(a, arr + ",1]"));
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

TEST(JsonSchemaToGrammar, TypeBesideAnyOfRestrictsEachAlternative) {
  // vLLM's schema for tool_choice "required": items {"type": "object", "anyOf": [one per tool]}.
  const char* required = R"({"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
    {"properties": {"name": {"type": "string", "const": "get_weather"}, "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}},
     "required": ["name", "parameters"]},
    {"properties": {"name": {"type": "string", "const": "noop"}, "parameters": {"type": "object", "properties": {}}},
     "required": ["name", "parameters"]}]}})";
  expect_language(required,
                  {R"([{"name": "get_weather", "parameters": {"city": "Oslo"}}])",
                   R"([{"name": "noop", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "x"}}])"},
                  {"[]", R"([{"name": "other", "parameters": {}}])", R"(["get_weather"])"});
  // Alternatives keep only the types the outer schema allows.
  expect_language(R"({"type": "integer", "anyOf": [{"type": "number", "minimum": 5}, {"type": "string"}]})",
                  {"5", "17"}, {"4", "5.5", "\"a\""});
  EXPECT_NE(error_of(R"({"type": "string", "anyOf": [{"type": "integer"}]})").find("no alternative"), std::string::npos);
}

}  // namespace
}  // namespace specula
