// Tool calling and structured outputs through the HTTP routes, over the fake engine: what reaches
// the engine (the constraint, skip_special_tokens), the chat.completion message and the stream's
// deltas, finish_reason "tool_calls".
#include <gtest/gtest.h>

#include "server_fixture.h"

namespace specula::testing {
namespace {

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "get_time"}}])");

const std::string kHermesReply =
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

json tool_body(bool stream, json extra = json::object()) {
  json b = chat_body(stream);
  b["tools"] = kTools;
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// A streamed choice put back together as a client does; checks the deltas' shape on the way.
struct Assembled {
  std::string content;
  std::string reasoning;
  json tool_calls = json::array();
  json finish_reason;
  int chunks_after_finish = 0;
};

Assembled assemble(const std::vector<json>& events) {
  Assembled a;
  for (const json& ev : events) {
    if (ev["choices"].empty()) continue;  // usage
    const json& c = ev["choices"][0];
    EXPECT_TRUE(a.finish_reason.is_null()) << "a chunk after the finish: " << ev.dump();
    const json& d = c["delta"];
    if (d.contains("content")) a.content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) a.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const json& t : d["tool_calls"]) {
        size_t i = t["index"].get<size_t>();
        if (t.contains("id")) {  // a call's first delta: id, type and name, no arguments yet
          EXPECT_EQ(i, a.tool_calls.size()) << ev.dump();
          EXPECT_EQ(t["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u) << ev.dump();
          EXPECT_EQ(t["type"], "function") << ev.dump();
          EXPECT_EQ(t["function"]["arguments"], "") << ev.dump();
          a.tool_calls.push_back({{"id", t["id"]}, {"type", "function"},
                                  {"function", {{"name", t["function"]["name"]}, {"arguments", ""}}}});
        } else {
          EXPECT_FALSE(t["function"].contains("name")) << ev.dump();
          EXPECT_EQ(i + 1, a.tool_calls.size()) << ev.dump();
          a.tool_calls[i]["function"]["arguments"] =
              a.tool_calls[i]["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
        }
      }
    }
    if (!c["finish_reason"].is_null()) a.finish_reason = c["finish_reason"];
  }
  return a;
}

// The calls without their random ids, for comparing a stream with a whole reply.
json without_ids(json calls) {
  for (auto& c : calls) c.erase("id");
  return calls;
}

class ToolCallsTest : public ServerTest {
 protected:
  ToolCallsTest() { engine_.max_len = 4096; }  // the tools are rendered into the prompt
  void start_with(const std::string& parser, const std::string& reasoning = "") {
    server::ServerOptions opts;
    opts.enable_auto_tool_choice = !parser.empty();
    opts.tool_call_parser = parser;
    opts.reasoning_parser = reasoning;
    start(opts);
  }
  // The reply whole and streamed; both must agree. Returns the whole reply's choice.
  json both(const json& body_whole, Assembled* streamed) {
    json body = body_whole;
    HttpResult r = post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    json choice = r.json_body()["choices"][0];
    body["stream"] = true;
    HttpResult s = post("/v1/chat/completions", body);
    EXPECT_EQ(s.status, 200) << s.body;
    *streamed = assemble(sse_events(s.body));
    const json& m = choice["message"];
    EXPECT_EQ(streamed->content, m["content"].is_null() ? "" : m["content"].get<std::string>());
    EXPECT_EQ(without_ids(streamed->tool_calls), without_ids(m["tool_calls"]));
    EXPECT_EQ(streamed->finish_reason, choice["finish_reason"]);
    return choice;
  }
};

TEST_F(ToolCallsTest, AutoNeedsTheFlagsAsInVllm) {
  start();
  const std::string msg = "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set";
  for (const json& extra : {json::object(), json{{"tool_choice", "auto"}}}) {  // tools alone mean auto
    HttpResult r = post("/v1/chat/completions", tool_body(false, extra));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json_body()["error"]["message"], msg);
  }
  // none passes the tools to the template and parses nothing; forced choices need no parser.
  engine_.reply = "<tool_call>{\"name\": \"get_time\"}</tool_call>";
  HttpResult none = post("/v1/chat/completions", tool_body(false, {{"tool_choice", "none"}}));
  ASSERT_EQ(none.status, 200) << none.body;
  EXPECT_EQ(none.json_body()["choices"][0]["message"]["content"], engine_.reply);
  EXPECT_EQ(none.json_body()["choices"][0]["message"]["tool_calls"], json::array());
  EXPECT_EQ(none.json_body()["choices"][0]["finish_reason"], "stop");
  engine_.reply = "[{\"name\": \"get_time\", \"parameters\": {}}]";
  EXPECT_EQ(post("/v1/chat/completions", tool_body(false, {{"tool_choice", "required"}})).status, 200);
}

TEST_F(ToolCallsTest, HermesCallsWholeAndStreamed) {
  start_with("hermes");
  engine_.reply = kHermesReply;
  Assembled s;
  json c = both(tool_body(false), &s);
  EXPECT_EQ(c["message"]["content"], "Let me check.\n");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 2u);
  const json& call = c["message"]["tool_calls"][0];
  EXPECT_EQ(call["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(call["id"].get<std::string>().size(), 14u + 32u);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"], json({{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}));
  EXPECT_EQ(c["message"]["tool_calls"][1]["function"], json({{"name", "get_time"}, {"arguments", "{}"}}));
  EXPECT_NE(c["message"]["tool_calls"][0]["id"], c["message"]["tool_calls"][1]["id"]);
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_NE(s.tool_calls[0]["id"], s.tool_calls[1]["id"]);
  // The markers may be special tokens: the engine was asked to keep them.
  auto reqs = engine_.requests();
  ASSERT_FALSE(reqs.empty());
  EXPECT_FALSE(reqs.back().params.skip_special_tokens);
  EXPECT_FALSE(reqs.back().params.structured_outputs);  // auto forces nothing
}

TEST_F(ToolCallsTest, AutoWithoutCallsOrWithMalformedOnesIsPlainContent) {
  start_with("hermes");
  for (const std::string reply : {"Just text.", "<tool_call>{\"name\": \"f\", \"arguments\": {oops}}</tool_call>"}) {
    engine_.reply = reply;
    HttpResult r = post("/v1/chat/completions", tool_body(false));
    ASSERT_EQ(r.status, 200) << r.body;
    json c = r.json_body()["choices"][0];
    EXPECT_EQ(c["message"]["content"], reply);
    EXPECT_EQ(c["message"]["tool_calls"], json::array());
    EXPECT_EQ(c["finish_reason"], "stop");
  }
  engine_.reply = "Just text.";
  Assembled s;
  both(tool_body(false), &s);
  EXPECT_EQ(s.finish_reason, "stop");
}

TEST_F(ToolCallsTest, ReasoningIsSplitOffBeforeToolParsing) {
  start_with("hermes", "deepseek_r1");
  engine_.reply = "I need the weather. <tool_call> is the tag.</think>\n\n<tool_call>\n{\"name\": \"get_time\", "
                  "\"arguments\": {}}\n</tool_call>";
  Assembled s;
  json c = both(tool_body(false), &s);
  EXPECT_EQ(c["message"]["reasoning_content"], "I need the weather. <tool_call> is the tag.");
  EXPECT_EQ(s.reasoning, "I need the weather. <tool_call> is the tag.");
  EXPECT_EQ(c["message"]["content"], "\n\n");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(c["finish_reason"], "tool_calls");
}

TEST_F(ToolCallsTest, OtherParsersThroughTheRoute) {
  start_with("llama3_json");
  engine_.reply = R"({"name": "get_weather", "parameters": {"city": "Oslo"}})";
  Assembled s;
  json c = both(tool_body(false), &s);
  EXPECT_TRUE(c["message"]["content"].is_null());
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"], json({{"name", "get_weather"}, {"arguments", R"({"city": "Oslo"})"}}));
  EXPECT_TRUE(engine_.requests().back().params.skip_special_tokens);  // llama3_json reads '{' as well
}

TEST_F(ToolCallsTest, DeepSeekV3ThroughTheRoute) {
  start_with("deepseek_v3");
  engine_.reply = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
                  "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  Assembled s;
  json c = both(tool_body(false), &s);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"], json({{"name", "get_time"}, {"arguments", "{}"}}));
  EXPECT_EQ(c["finish_reason"], "tool_calls");
}

TEST_F(ToolCallsTest, RequiredIsForcedAndParsed) {
  start();
  engine_.reply = R"([{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}])";
  Assembled s;
  json c = both(tool_body(false, {{"tool_choice", "required"}, {"parallel_tool_calls", false}}), &s);
  EXPECT_TRUE(c["message"]["content"].is_null());
  ASSERT_EQ(c["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"], json({{"name", "get_weather"}, {"arguments", R"({"city": "Rome"})"}}));
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  auto so = engine_.requests().back().params.structured_outputs;
  ASSERT_TRUE(so);
  EXPECT_EQ(so->kind, StructuredOutputsParams::Kind::kJson);
  json schema = json::parse(so->spec);
  EXPECT_EQ(schema["maxItems"], 1);
  EXPECT_EQ(schema["items"]["anyOf"].size(), 2u);
}

TEST_F(ToolCallsTest, NamedIsForcedAndItsOutputIsTheArguments) {
  start();
  engine_.reply = R"({"city": "Lima"})";
  json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  Assembled s;
  json c = both(tool_body(false, {{"tool_choice", named}}), &s);
  EXPECT_TRUE(c["message"]["content"].is_null());
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"], json({{"name", "get_weather"}, {"arguments", R"({"city": "Lima"})"}}));
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(engine_.requests().back().params.structured_outputs->spec, R"({"properties":{"city":{"type":"string"}},"type":"object"})");

  // Cut by max_tokens, the arguments do not parse: the text comes back as content.
  HttpResult r = post("/v1/chat/completions", tool_body(false, {{"tool_choice", named}, {"max_tokens", 5}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json cut = r.json_body()["choices"][0];
  EXPECT_EQ(cut["message"]["content"], R"({"cit)");
  EXPECT_EQ(cut["message"]["tool_calls"], json::array());
  EXPECT_EQ(cut["finish_reason"], "length");
  r = post("/v1/chat/completions", tool_body(true, {{"tool_choice", named}, {"max_tokens", 5}}));
  EXPECT_EQ(assemble(sse_events(r.body)).finish_reason, "length");
}

TEST_F(ToolCallsTest, StructuredOutputsReachTheEngineOnBothRoutes) {
  start();
  for (bool stream : {false, true}) {
    json chat = chat_body(stream);
    chat["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}};
    EXPECT_EQ(post("/v1/chat/completions", chat).status, 200);
    auto so = engine_.requests().back().params.structured_outputs;
    ASSERT_TRUE(so);
    EXPECT_EQ(so->kind, StructuredOutputsParams::Kind::kJson);
    EXPECT_EQ(so->spec, R"({"type":"object"})");

    json cmpl = {{"prompt", "hi"}, {"stream", stream}, {"guided_choice", {"yes", "no"}},
                 {"structured_outputs", {{"disable_any_whitespace", true}}}};
    EXPECT_EQ(post("/v1/completions", cmpl).status, 200);
    so = engine_.requests().back().params.structured_outputs;
    ASSERT_TRUE(so);
    EXPECT_EQ(so->kind, StructuredOutputsParams::Kind::kChoice);
    EXPECT_EQ(so->choices, (std::vector<std::string>{"yes", "no"}));
    EXPECT_FALSE(so->any_whitespace);
  }
  HttpResult bad = post("/v1/completions", json{{"prompt", "hi"}, {"guided_regex", "a"}, {"guided_json", {{"type", "object"}}}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("Only one kind of structured output"), std::string::npos) << bad.body;
}

TEST_F(ToolCallsTest, ToolMessagesReachTheTemplate) {
  start_with("hermes");
  json body = json::parse(R"({"messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})");
  body["tools"] = kTools;
  HttpResult r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string prompt = engine_.tokenizer().decode(engine_.requests().back().prompt_token_ids, false);
  // The arguments reach the template as an object, the tool result with its call id.
  EXPECT_NE(prompt.find(R"([assistant][calls:[{"function":{"arguments":{"city":"Paris"},"name":"get_weather"},"id":"c1","type":"function"}]])"),
            std::string::npos) << prompt;
  EXPECT_NE(prompt.find("[tool](c1)sunny\n"), std::string::npos) << prompt;
}

TEST(ToolCallOptions, AnUnknownParserOrAutoWithoutOneFailsAtStartup) {
  FakeEngine engine;
  FakeChatTemplate tmpl;
  server::ServerOptions opts;
  opts.served_model_name = "m";
  opts.tool_call_parser = "mistral";
  try {
    server::OpenAIServer s(engine, &tmpl, opts);
    ADD_FAILURE() << "an unknown parser was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hermes, llama3_json, deepseek_v3"), std::string::npos) << e.what();
  }
  opts.tool_call_parser = "";
  opts.enable_auto_tool_choice = true;
  EXPECT_THROW(server::OpenAIServer(engine, &tmpl, opts), Error);
}

}  // namespace
}  // namespace specula::testing
