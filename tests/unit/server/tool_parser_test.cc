#include <gtest/gtest.h>

#include <functional>

#include "server/tool_choice.h"
#include "server/tool_parser.h"

namespace specula::server {
namespace {

using Factory = std::function<std::unique_ptr<ToolParser>()>;

Factory named_parser(const std::string& name) {
  return [name] { return ToolParser::create(name); };
}

ParsedToolOutput whole(const Factory& make, const std::string& text) { return make()->parse_all(text); }

// Accumulates a stream's deltas the way a client does (calls by index; a call's first piece
// names it, later pieces only extend its arguments).
struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;
  std::string error;
  void add(const ToolParseDelta& d) {
    content += d.content;
    for (const ToolCallDelta& c : d.calls) {
      if (c.name) {
        if (c.index != static_cast<int>(calls.size())) error = "call " + std::to_string(c.index) + " named out of order";
        calls.push_back({*c.name, ""});
      } else if (c.index != static_cast<int>(calls.size()) - 1) {
        error = "arguments for call " + std::to_string(c.index) + " before its name";
        continue;
      }
      calls[c.index].arguments += c.arguments;
    }
  }
};

void expect_same(const ParsedToolOutput& a, const Streamed& b, const std::string& where) {
  ASSERT_EQ(b.error, "") << where;
  ASSERT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    ASSERT_EQ(a.calls[i].name, b.calls[i].name) << where;
    ASSERT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// Streams `text` cut at every pair of positions (and one byte at a time); every stream must add up
// to the whole text's result.
void expect_streaming_matches_whole(const Factory& make, const std::string& text) {
  ParsedToolOutput ref = whole(make, text);
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      auto p = make();
      Streamed acc;
      for (auto piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) acc.add(p->feed(piece));
      acc.add(p->finish());
      expect_same(ref, acc, "cuts " + std::to_string(a) + "," + std::to_string(b) + " of " + text);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  auto p = make();
  Streamed acc;
  for (char c : text) acc.add(p->feed(std::string(1, c)));
  acc.add(p->finish());
  expect_same(ref, acc, "byte by byte: " + text);
}

void expect_calls(const ParsedToolOutput& r, const std::string& content, const std::vector<ToolCall>& calls) {
  EXPECT_EQ(r.content, content);
  ASSERT_EQ(r.calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(r.calls[i].name, calls[i].name) << i;
    EXPECT_EQ(r.calls[i].arguments, calls[i].arguments) << i;
  }
}

TEST(ToolParser, Registry) {
  EXPECT_EQ(ToolParser::names(), (std::vector<std::string>{"hermes", "llama3_json", "deepseek_v3"}));
  for (const auto& n : ToolParser::names()) {
    EXPECT_TRUE(ToolParser::is_known(n));
    EXPECT_NE(ToolParser::create(n), nullptr);
  }
  EXPECT_FALSE(ToolParser::is_known("mistral"));
  EXPECT_EQ(ToolParser::create("mistral"), nullptr);
  EXPECT_TRUE(ToolParser::keeps_special_tokens("hermes"));
}

TEST(ToolParser, Hermes) {
  auto hermes = named_parser("hermes");
  expect_calls(whole(hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
               "", {{"get_weather", R"({"city": "Paris"})"}});
  // Text before is content; two calls; the newline between them is not content.
  expect_calls(whole(hermes, "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                             "<tool_call>\n{\"arguments\": {\"x\": [1, \"}\"]}, \"name\": \"b\"}\n</tool_call>"),
               "Let me check.\n", {{"a", "{}"}, {"b", R"({"x": [1, "}"]})"}});
  // No call: all content; a lone '<' is text.
  expect_calls(whole(hermes, "a < b, <tool>"), "a < b, <tool>", {});
  // The closing tag cut off (max_tokens) after whole JSON: the call stands.
  expect_calls(whole(hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": 1}}\n"), "", {{"f", R"({"k": 1})"}});
  // No arguments: "{}". Text after a call is content.
  expect_calls(whole(hermes, "<tool_call>{\"name\": \"f\"}</tool_call>\n\nDone."), "Done.", {{"f", "{}"}});
  // Escapes in the name and in the arguments.
  expect_calls(whole(hermes, R"(<tool_call>{"name": "a\"b", "arguments": {"s": "\\\"}"}}</tool_call>)"), "",
               {{"a\"b", R"({"s": "\\\"}"})"}});
}

TEST(ToolParser, TextThatMayStartAMarkerIsHeldBackUntilDecided) {
  auto p = ToolParser::create("hermes");
  EXPECT_EQ(p->feed("Hello <tool").content, "Hello ");  // sent at once, but "<tool" may be a tag
  EXPECT_EQ(p->feed("s are").content, "<tools are");   // it was not
  ToolParseDelta d = p->feed(" <tool_");
  EXPECT_EQ(d.content, " ");
  d = p->feed("call>{\"name\": \"f\", \"arguments\": {\"a\"");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "f");
  EXPECT_EQ(d.calls[0].arguments, "{\"a\"");  // arguments go out as they come
  d = p->feed(": 1}}\n</tool_call>");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_FALSE(d.calls[0].name);
  EXPECT_EQ(d.calls[0].arguments, ": 1}");
  EXPECT_TRUE(p->finish().empty());
  EXPECT_FALSE(p->malformed());
}

TEST(ToolParser, HermesMalformedOutputIsContent) {
  auto hermes = named_parser("hermes");
  for (const std::string text : {
           "<tool_call>\nnot json\n</tool_call>",
           "Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }}</tool_call>",   // invalid arguments
           "<tool_call>{\"arguments\": {}}</tool_call>",                              // no name
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}",                  // cut off
           "<tool_call>{\"name\": \"f\"}} </tool_call>",                              // junk before the tag
           "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": 5}</tool_call>",  // second one bad
       }) {
    auto p = ToolParser::create("hermes");
    ParsedToolOutput r = p->parse_all(text);
    EXPECT_TRUE(p->malformed()) << text;
    expect_calls(r, text, {});
  }
}

TEST(ToolParser, HermesStreamsLikeTheWholeText) {
  auto hermes = named_parser("hermes");
  for (const char* text : {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                           "Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": \"<tool_call>\"}}\n</tool_call>\n"
                           "<tool_call>{\"arguments\": {\"n\": -1.5e3}, \"name\": \"b\"}</tool_call> ok",
                           "<tool_cal <tool_call>{\"name\": \"f\"}</tool_call>", "no calls at all <", "</tool_call>"}) {
    expect_streaming_matches_whole(hermes, text);
  }
}

TEST(ToolParser, Llama3Json) {
  auto llama = named_parser("llama3_json");
  expect_calls(whole(llama, R"({"name": "get_weather", "parameters": {"city": "Paris"}})"), "",
               {{"get_weather", R"({"city": "Paris"})"}});
  expect_calls(whole(llama, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"x\": 1}}"),
               "", {{"a", "{}"}, {"b", R"({"x": 1})"}});
  expect_calls(whole(llama, "  \n{\"name\": \"f\", \"parameters\": {\"v\": true}}\n"), "", {{"f", R"({"v": true})"}});
  // Plain text, and JSON that is not a call, are content.
  expect_calls(whole(llama, "The answer is {\"a\": 1}."), "The answer is {\"a\": 1}.", {});
  for (const std::string text : {R"({"answer": 42})", "<|python_tag|>print(1)", R"({"name": "f", "parameters": {}} trailing)",
                                 R"({"name": "f", "parameters": {)"}) {
    auto p = ToolParser::create("llama3_json");
    expect_calls(p->parse_all(text), text, {});
    EXPECT_TRUE(p->malformed()) << text;
  }
}

TEST(ToolParser, Llama3JsonStreamsLikeTheWholeText) {
  auto llama = named_parser("llama3_json");
  for (const char* text : {R"({"name": "get_weather", "parameters": {"city": "Paris"}})",
                           "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"};{\"}} ;\n{\"name\": \"b\", \"parameters\": {}}",
                           "Plain text answer.", "<|python", " {\"answer\": 42}", "<|python_tag|>"}) {
    expect_streaming_matches_whole(llama, text);
  }
}

const std::string kDsCall1 = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>";
const std::string kDsCall2 = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>";

TEST(ToolParser, DeepSeekV3) {
  auto ds = named_parser("deepseek_v3");
  expect_calls(whole(ds, "<｜tool▁calls▁begin｜>" + kDsCall1 + "<｜tool▁calls▁end｜>"), "",
               {{"get_weather", R"({"city": "Paris"})"}});
  expect_calls(whole(ds, "Checking.<｜tool▁calls▁begin｜>" + kDsCall1 + "\n" + kDsCall2 + "<｜tool▁calls▁end｜>\nok"),
               "Checking.ok", {{"get_weather", R"({"city": "Paris"})"}, {"get_time", "{}"}});
  expect_calls(whole(ds, "No tools <｜tool"), "No tools <｜tool", {});
  // The closing marker cut off after whole calls: they stand.
  expect_calls(whole(ds, "<｜tool▁calls▁begin｜>" + kDsCall2), "", {{"get_time", "{}"}});
  for (const std::string text : {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{bad}\n```<｜tool▁call▁end｜>",
                                 "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜>",
                                 "<｜tool▁calls▁begin｜>junk", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"}) {
    auto p = ToolParser::create("deepseek_v3");
    expect_calls(p->parse_all(text), text, {});
    EXPECT_TRUE(p->malformed()) << text;
  }
}

TEST(ToolParser, DeepSeekV3StreamsLikeTheWholeText) {
  auto ds = named_parser("deepseek_v3");
  for (const std::string text : {"<｜tool▁calls▁begin｜>" + kDsCall1 + "<｜tool▁calls▁end｜>",
                                 "Hm <｜tool▁calls▁begin｜>" + kDsCall2 + kDsCall1 + "<｜tool▁calls▁end｜> bye",
                                 std::string("<｜tool▁call"), std::string("plain")}) {
    expect_streaming_matches_whole(ds, text);
  }
}

Factory forced(ToolChoice::Kind kind, std::string name = "") {
  return [kind, name] {
    ToolChoice c;
    c.kind = kind;
    c.function = name;
    return make_tool_choice_parser(c, "");
  };
}

TEST(ToolParser, RequiredOutputIsAnArrayOfCalls) {
  auto required = forced(ToolChoice::Kind::kRequired);
  expect_calls(whole(required, R"([{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}])"), "",
               {{"a", R"({"x": 1})"}, {"b", "{}"}});
  expect_calls(whole(required, "[\n  {\"parameters\": {\"q\": \"]\"}, \"name\": \"a\"}\n]\n"), "", {{"a", R"({"q": "]"})"}});
  // Cut off by max_tokens: the text comes back as content.
  const std::string cut = R"([{"name": "a", "parameters": {"x": 1}}, {"name": "b", "param)";
  expect_calls(whole(required, cut), cut, {});
  expect_calls(whole(required, "not json"), "not json", {});
  for (const char* text : {R"([{"name": "a", "parameters": {"x": [1, {"y": "z"}]}}, {"name": "b", "parameters": {}}])",
                           R"( [ { "name" : "a" , "parameters" : { } } ] )"}) {
    expect_streaming_matches_whole(required, text);
  }
}

TEST(ToolParser, NamedOutputIsTheArguments) {
  auto named = forced(ToolChoice::Kind::kNamed, "get_weather");
  expect_calls(whole(named, R"({"city": "Paris"})"), "", {{"get_weather", R"({"city": "Paris"})"}});
  expect_calls(whole(named, R"({"city": "Par)"), R"({"city": "Par)", {});
  expect_streaming_matches_whole(named, R"({"city": "Paris", "days": [1, 2]})");
  // The call is named with the first piece of text.
  auto p = forced(ToolChoice::Kind::kNamed, "f")();
  ToolParseDelta d = p->feed("{");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "f");
  EXPECT_EQ(d.calls[0].arguments, "{");
}

}  // namespace
}  // namespace specula::server
