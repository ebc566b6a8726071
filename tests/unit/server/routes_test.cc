// The OpenAI routes end to end over HTTP, against the fake engine.
#include <gtest/gtest.h>

#include "server_fixture.h"

namespace specula::testing {
namespace {

json user(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }

TEST_F(ServerTest, HealthVersionModels) {
  server::ServerOptions opts;
  opts.model_root = "/models/fake";
  start(opts);
  auto health = get("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "");
  EXPECT_EQ(get("/version").json_body()["version"], "0.1.0");
  json models = get("/v1/models").json_body();
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "fake-model");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["owned_by"], "specula");
  EXPECT_EQ(models["data"][0]["root"], "/models/fake");
  EXPECT_EQ(models["data"][0]["max_model_len"], 128);
}

TEST_F(ServerTest, ErrorsHaveOpenAIsBodyAndStatus) {
  start();
  auto unknown_route = get("/v1/nothing");
  EXPECT_EQ(unknown_route.status, 404);
  EXPECT_EQ(unknown_route.json_body()["error"]["code"], 404);

  auto malformed = post("/v1/completions", std::string("{\"prompt\": \"x\""));
  EXPECT_EQ(malformed.status, 400);
  EXPECT_EQ(malformed.json_body()["error"]["type"], "BadRequestError");
  EXPECT_EQ(malformed.json_body()["error"]["code"], 400);

  auto not_object = post("/v1/chat/completions", std::string("[1, 2]"));
  EXPECT_EQ(not_object.status, 400);

  auto wrong_model = post("/v1/chat/completions", json{{"model", "gpt-4"}, {"messages", user("hi")}});
  EXPECT_EQ(wrong_model.status, 404);
  EXPECT_EQ(wrong_model.json_body(), json::parse(R"({"error": {"message": "The model `gpt-4` does not exist.",
      "type": "NotFoundError", "param": "model", "code": 404}})"));

  auto bad_param = post("/v1/completions", json{{"prompt", "x"}, {"temperature", -0.5}});
  EXPECT_EQ(bad_param.status, 400);
  EXPECT_EQ(bad_param.json_body()["error"]["param"], "temperature");

  auto too_long = post("/v1/completions", json{{"prompt", std::string(100, 'a')}, {"max_tokens", 50}});
  EXPECT_EQ(too_long.status, 400);
  std::string msg = too_long.json_body()["error"]["message"];
  EXPECT_NE(msg.find("128"), std::string::npos) << msg;   // max_model_len
  EXPECT_NE(msg.find("101"), std::string::npos) << msg;   // prompt tokens (with <s>)
  EXPECT_NE(msg.find("50"), std::string::npos) << msg;    // max_tokens

  auto bad_token = post("/v1/completions", json{{"prompt", {1, 999}}});
  EXPECT_EQ(bad_token.status, 400);
  EXPECT_EQ(bad_token.json_body()["error"]["param"], "prompt");

  auto template_error = post("/v1/chat/completions", json{{"messages", {{{"role", "raise"}, {"content", "x"}}}}});
  EXPECT_EQ(template_error.status, 400);
  EXPECT_NE(template_error.json_body()["error"]["message"].get<std::string>().find("template says no"), std::string::npos);

  auto engine_error = post("/v1/completions", json{{"prompt", "ERROR please"}});
  EXPECT_EQ(engine_error.status, 500);
  EXPECT_EQ(engine_error.json_body()["error"]["type"], "InternalServerError");
  EXPECT_TRUE(engine_.requests().size() >= 1);
}

TEST_F(ServerTest, ApiKeyGuardsV1AndTheTokenizerRoutes) {
  server::ServerOptions opts;
  opts.api_key = "sekrit";
  start(opts);
  // The tokenizer routes run the tokenizer and chat template on whatever arrives: guarded too.
  EXPECT_EQ(post("/tokenize", json{{"prompt", "x"}}).status, 401);
  EXPECT_EQ(post("/detokenize", json{{"tokens", {1, 2}}}).status, 401);
  EXPECT_EQ(post("/tokenize", json{{"prompt", "x"}}, {{"Authorization", "Bearer sekrit"}}).status, 200);
  // The scheme is case-insensitive (RFC 7235); the key is not, and a prefix of it is no key.
  EXPECT_EQ(get("/v1/models", {{"Authorization", "bearer sekrit"}}).status, 200);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "BEARER  sekrit "}}).status, 200);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearer SEKRIT"}}).status, 401);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearer sekri"}}).status, 401);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearer sekrit2"}}).status, 401);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Basic sekrit"}}).status, 401);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearersekrit"}}).status, 401);
  auto no_key = post("/v1/completions", json{{"prompt", "x"}});
  EXPECT_EQ(no_key.status, 401);
  EXPECT_EQ(no_key.json_body(), json::parse(R"({"error": "Unauthorized"})"));
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearer sekrit"}}).status, 200);
  EXPECT_EQ(post("/v1/completions", json{{"prompt", "x"}}, {{"Authorization", "Bearer sekrit"}}).status, 200);
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/metrics").status, 200);
}

TEST_F(ServerTest, ChatCompletion) {
  start();
  auto r = post("/v1/chat/completions",
                json{{"model", "fake-model"}, {"messages", user("hi")}, {"temperature", 0}, {"seed", 3},
                     {"chat_template_kwargs", {{"enable_thinking", false}}},
                     {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}, {"tool_choice", "none"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json_body();
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Hello!");
  EXPECT_FALSE(c["message"].contains("reasoning_content"));  // no reasoning parser
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["stop_reason"], nullptr);
  EXPECT_EQ(c["logprobs"], nullptr);

  // The template got the messages, tools and kwargs; tokenized without adding <s> again.
  auto reqs = engine_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  std::string prompt = engine_.tokenizer().decode(reqs[0].prompt_token_ids, false);
  EXPECT_EQ(prompt, "<s>[user]hi\n[tools:[{\"function\":{\"name\":\"f\"},\"type\":\"function\"}]][nothink][assistant]");
  EXPECT_EQ(reqs[0].params.seed, 3u);
  EXPECT_EQ(*reqs[0].params.max_tokens, 128 - static_cast<int>(reqs[0].prompt_token_ids.size()));
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", reqs[0].prompt_token_ids.size()}, {"completion_tokens", 6},
                              {"total_tokens", reqs[0].prompt_token_ids.size() + 6}}));
}

TEST_F(ServerTest, ChatLengthLogprobsAndN) {
  start();
  auto r = post("/v1/chat/completions", json{{"messages", user("hi")}, {"max_tokens", 3}, {"n", 2},
                                              {"logprobs", true}, {"top_logprobs", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json_body();
  ASSERT_EQ(j["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const json& c = j["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["message"]["content"], "Hel");
    EXPECT_EQ(c["finish_reason"], "length");
    const json& content = c["logprobs"]["content"];
    ASSERT_EQ(content.size(), 3u);
    EXPECT_EQ(content[0]["token"], "H");
    EXPECT_DOUBLE_EQ(content[0]["logprob"].get<double>(), -0.25);
    EXPECT_EQ(content[0]["bytes"], json::array({72}));
    ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
    EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "I");
    EXPECT_DOUBLE_EQ(content[0]["top_logprobs"][1]["logprob"].get<double>(), -1.25);
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
}

TEST_F(ServerTest, ChatStreamIsShapedLikeOpenAI) {
  start();
  auto r = post("/v1/chat/completions", json{{"messages", user("hi")}, {"stream", true},
                                              {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r.status, 200);
  bool done = false;
  auto events = sse_events(r.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);
  // The role chunk first.
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(events[0]["choices"][0]["finish_reason"], nullptr);
  std::string text;
  std::string id = events[0]["id"];
  size_t finish_at = 0;
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["id"], id);
    if (events[i]["choices"].empty()) continue;
    text += events[i]["choices"][0]["delta"].value("content", "");
    if (!events[i]["choices"][0]["finish_reason"].is_null()) finish_at = i;
  }
  EXPECT_EQ(text, "Hello!");
  EXPECT_EQ(events[finish_at]["choices"][0]["finish_reason"], "stop");
  // The usage chunk last, with no choices.
  const json& last = events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 6);
  EXPECT_EQ(finish_at, events.size() - 2);
}

TEST_F(ServerTest, ChatStreamWithoutUsageEndsWithFinishThenDone) {
  start();
  auto r = post("/v1/chat/completions", json{{"messages", user("hi")}, {"stream", true}, {"n", 2}});
  bool done = false;
  auto events = sse_events(r.body, &done);
  EXPECT_TRUE(done);
  // One role chunk per choice, then deltas of both choices.
  EXPECT_EQ(events[0]["choices"][0]["index"], 0);
  EXPECT_EQ(events[1]["choices"][0]["index"], 1);
  EXPECT_EQ(events[1]["choices"][0]["delta"]["role"], "assistant");
  std::string texts[2];
  int finishes = 0;
  for (size_t i = 2; i < events.size(); ++i) {
    EXPECT_FALSE(events[i].contains("usage"));
    const json& c = events[i]["choices"][0];
    texts[c["index"].get<int>()] += c["delta"].value("content", "");
    finishes += !c["finish_reason"].is_null();
  }
  EXPECT_EQ(texts[0], "Hello!");
  EXPECT_EQ(texts[1], "Hello!");
  EXPECT_EQ(finishes, 2);
}

TEST_F(ServerTest, ReasoningParserSplitsStreamedAndWholeReplies) {
  server::ServerOptions opts;
  opts.reasoning_parser = "deepseek_r1";
  start(opts);
  engine_.reply = "So: 2+2=4.</think>\n\nFour.";
  auto whole = post("/v1/chat/completions", json{{"messages", user("2+2?")}}).json_body();
  EXPECT_EQ(whole["choices"][0]["message"]["reasoning_content"], "So: 2+2=4.");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "\n\nFour.");

  auto r = post("/v1/chat/completions", json{{"messages", user("2+2?")}, {"stream", true}});
  std::string reasoning, content;
  for (const auto& ev : sse_events(r.body)) {
    if (ev["choices"].empty()) continue;
    const json& delta = ev["choices"][0]["delta"];
    EXPECT_FALSE(delta.value("content", "").find("</") != std::string::npos) << delta.dump();
    reasoning += delta.value("reasoning_content", "");
    content += delta.value("content", "");
  }
  EXPECT_EQ(reasoning, "So: 2+2=4.");
  EXPECT_EQ(content, "\n\nFour.");
}

TEST_F(ServerTest, CompletionsWithSeveralPromptsAndN) {
  start();
  auto r = post("/v1/completions", json{{"prompt", {"a", "b"}}, {"n", 2}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json_body();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], "He");
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
  }
  // Two prompts of "<s>" + one byte each.
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 4}, {"completion_tokens", 8}, {"total_tokens", 12}}));
  auto reqs = engine_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_NE(reqs[0].request_id, reqs[1].request_id);
  EXPECT_EQ(reqs[0].params.n, 2);
}

TEST_F(ServerTest, CompletionsTokenPromptsEchoAndLogprobs) {
  start();
  auto r = post("/v1/completions", json{{"prompt", {72, 105}}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json_body();
  const json& c = j["choices"][0];
  EXPECT_EQ(c["text"], "HiHe");
  const json& lp = c["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"H", "i", "H", "e"}));
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2, 3}));
  EXPECT_EQ(lp["token_logprobs"][0], nullptr);  // the first prompt token has none
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][1].get<double>(), -0.25);
  EXPECT_EQ(lp["top_logprobs"][0], nullptr);
  EXPECT_EQ(lp["top_logprobs"][2], json({{"H", -0.25}}));
  auto reqs = engine_.requests();
  EXPECT_EQ(reqs[0].prompt_token_ids, (std::vector<int32_t>{72, 105}));  // token prompts go as given
  EXPECT_EQ(*reqs[0].params.prompt_logprobs, 1);                          // echo asks for prompt logprobs
}

TEST_F(ServerTest, CompletionsStream) {
  start();
  auto r = post("/v1/completions", json{{"prompt", "x"}, {"stream", true}, {"max_tokens", 3},
                                         {"stream_options", {{"include_usage", true}}}, {"logprobs", 0}});
  bool done = false;
  auto events = sse_events(r.body, &done);
  EXPECT_TRUE(done);
  std::string text;
  json offsets = json::array();
  for (const auto& ev : events) {
    EXPECT_EQ(ev["object"], "text_completion");
    if (ev["choices"].empty()) continue;
    text += ev["choices"][0]["text"].get<std::string>();
    for (const auto& o : ev["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(text, "Hel");
  EXPECT_EQ(offsets, json({0, 1, 2}));  // offsets run on across chunks
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 3);
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, TokenizeAndDetokenize) {
  start();
  json t = post("/tokenize", json{{"prompt", "Hi"}}).json_body();
  EXPECT_EQ(t, json({{"count", 3}, {"max_model_len", 128}, {"tokens", {256, 72, 105}}, {"token_strs", nullptr}}));
  json no_special = post("/tokenize", json{{"prompt", "Hi"}, {"add_special_tokens", false}}).json_body();
  EXPECT_EQ(no_special["tokens"], json({72, 105}));
  json chat = post("/tokenize", json{{"messages", user("Hi")}, {"add_generation_prompt", false}}).json_body();
  EXPECT_EQ(engine_.tokenizer().decode(chat["tokens"].get<std::vector<int32_t>>(), false), "<s>[user]Hi\n");
  json d = post("/detokenize", json{{"tokens", {256, 72, 105}}}).json_body();
  EXPECT_EQ(d, json({{"prompt", "<s>Hi"}}));
  EXPECT_EQ(post("/detokenize", json{{"tokens", {1000}}}).status, 400);
  EXPECT_EQ(post("/detokenize", json{{"tokens", "x"}}).status, 400);
}

TEST_F(ServerTest, MetricsCountWhatTheServerMeasured) {
  start();
  ASSERT_EQ(post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}).status, 200);
  ASSERT_EQ(post("/v1/chat/completions", json{{"messages", user("x")}}).status, 200);
  auto m = get("/metrics");
  EXPECT_EQ(m.status, 200);
  const std::string labels = "{engine=\"0\",model_name=\"fake-model\"";
  for (const std::string& line : std::vector<std::string>{
           "vllm:time_to_first_token_seconds_count" + labels + "} 2.0",
           "vllm:e2e_request_latency_seconds_count" + labels + "} 2.0",
           "vllm:time_per_output_token_seconds_count" + labels + "} 6.0",  // (2-1) + (6-1) gaps
           "vllm:request_success_total" + labels + ",finished_reason=\"length\"} 1.0",
           "vllm:request_success_total" + labels + ",finished_reason=\"stop\"} 1.0",
           "vllm:request_generation_tokens_sum" + labels + "} 8.0",
           "vllm:prompt_tokens_total" + labels + "} 7.0"}) {
    EXPECT_NE(m.body.find(line + "\n"), std::string::npos) << "missing " << line << "\n" << m.body;
  }
}


// A body nested far deeper than any real request is a 400 on every route that parses JSON, never a
// crash (copying or converting such a value recursed once per level and exhausted the stack).
TEST_F(ServerTest, DeeplyNestedJsonIsA400OnEveryRoute) {
  start();
  for (int depth : {20000, 100000}) {
    const std::string deep = std::string(depth, '[') + std::string(depth, ']');
    const std::vector<std::pair<std::string, std::string>> bodies = {
        {"/tokenize", R"({"prompt": "x", "extra": )" + deep + "}"},
        {"/tokenize", R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"k": )" + deep + "}}"},
        {"/detokenize", R"({"tokens": )" + deep + "}"},
        {"/v1/completions", R"({"prompt": "x", "max_tokens": 2, "extra": )" + deep + "}"},
        {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi", "x": )" + deep + "}]}"},
        {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "tools": )" + deep + "}"},
    };
    for (const auto& [path, body] : bodies) {
      HttpResult r = post(path, body);
      EXPECT_EQ(r.status, 400) << path << " depth " << depth;
      EXPECT_NE(r.body.find("nested deeper than"), std::string::npos) << r.body;
    }
  }
  // Tool call arguments arrive as a JSON string and are parsed for the template: bounded too.
  const std::string deep_args = std::string(5000, '[') + std::string(5000, ']');
  json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}},
                             {{"role", "assistant"}, {"content", ""},
                              {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                               {"function", {{"name", "f"}, {"arguments", deep_args}}}}}}},
                             {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}}},
               {"max_tokens", 2}};
  EXPECT_EQ(post("/v1/chat/completions", chat).status, 400);
  EXPECT_EQ(get("/health").status, 200);  // still serving
}

// -1 (every token of the vocabulary) is allowed only when --max-logprobs is -1 itself.
TEST_F(ServerTest, LogitBiasReachesTheEngineAndIdsOutsideTheVocabularyAre400) {
  start();
  EXPECT_EQ(post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}, {"logit_bias", {{"5", 3.0}}}}).status, 200);
  ASSERT_FALSE(engine_.requests().empty());
  EXPECT_EQ(engine_.requests().back().params.logit_bias, (std::vector<std::pair<int32_t, float>>{{5, 3.0f}}));
  HttpResult r = post("/v1/chat/completions", json{{"messages", user("hi")}, {"logit_bias", {{"99999999", 1.0}}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.json_body()["error"]["param"], "logit_bias");
}

TEST_F(ServerTest, WholeVocabularyLogprobsNeedAnUncappedServer) {
  start();
  HttpResult r = post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}, {"prompt_logprobs", -1}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.json_body()["error"]["param"], "prompt_logprobs");
  r = post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}, {"logprobs", -1}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.json_body()["error"]["param"], "logprobs");
  stop();
  server::ServerOptions opts;
  opts.defaults.max_logprobs = -1;
  start(opts);
  EXPECT_EQ(post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}, {"prompt_logprobs", -1}}).status, 200);
}

TEST_F(ServerTest, ChatTemplateKwargsCannotReplaceValidatedFields) {
  start();
  for (const char* key : {"messages", "tools", "add_generation_prompt", "continue_final_message"}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2},
                 {"chat_template_kwargs", {{key, json::array()}}}};
    HttpResult r = post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << key;
    EXPECT_EQ(r.json_body()["error"]["param"], "chat_template_kwargs") << key;
    body.erase("max_tokens");
    EXPECT_EQ(post("/tokenize", body).status, 400) << key;
  }
  json ok = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2},
             {"chat_template_kwargs", {{"enable_thinking", false}}}};
  EXPECT_EQ(post("/v1/chat/completions", ok).status, 200);
}

TEST_F(ServerTest, BodiesPastTheLimitAre413AndHugePromptsFailBeforeTokenizing) {
  server::ServerOptions opts;
  opts.max_request_body_bytes = 1 << 20;
  start(opts);
  EXPECT_EQ(post("/tokenize", json{{"prompt", std::string(2 << 20, 'a')}}).status, 413);
  // Within the body limit, but more bytes than max_model_len tokens can cover.
  HttpResult r = post("/v1/completions", json{{"prompt", std::string(900000, 'a')}, {"max_tokens", 2}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("maximum context length"), std::string::npos) << r.body;
  EXPECT_EQ(post("/tokenize", json{{"prompt", std::string(900000, 'a')}}).status, 400);
}

TEST_F(ServerTest, ASecondServerOnABusyPortFailsToStart) {
  start();
  server::ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = port_;
  opts.served_model_name = "fake-model";
  opts.access_log = false;
  server::OpenAIServer second(engine_, &template_, opts);
  EXPECT_THROW(second.bind(), Error);
}

}  // namespace
}  // namespace specula::testing
