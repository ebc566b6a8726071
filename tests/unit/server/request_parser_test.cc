#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/request_parser.h"

namespace specula::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// The ApiError a parse throws (status and param), or a failure when none.
ApiError parse_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an ApiError";
  return ApiError(0, "", "");
}

CompletionRequest completion(const json& body, RequestDefaults d = {}) { return parse_completion_request(body, d); }
ChatRequest chat(const json& body, RequestDefaults d = {}) {
  return parse_chat_request(body, ojson::parse(body.dump()), d);
}

TEST(RequestParser, CompletionPromptForms) {
  auto one = completion({{"prompt", "hi"}});
  ASSERT_EQ(one.prompts.size(), 1u);
  EXPECT_EQ(*one.prompts[0].text, "hi");
  EXPECT_EQ(*one.max_tokens, 16);  // OpenAI's completions default

  auto many = completion({{"prompt", {"a", "b", "c"}}});
  ASSERT_EQ(many.prompts.size(), 3u);
  EXPECT_EQ(*many.prompts[2].text, "c");

  auto ids = completion({{"prompt", {1, 2, 3}}});
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_FALSE(ids.prompts[0].text);
  EXPECT_EQ(ids.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));

  auto nested = completion({{"prompt", json::array({json::array({1, 2}), json::array({3})})}});
  ASSERT_EQ(nested.prompts.size(), 2u);
  EXPECT_EQ(nested.prompts[1].token_ids, (std::vector<int32_t>{3}));
}

TEST(RequestParser, LogitBiasIsParsedSortedAndBounded) {
  auto c = completion({{"prompt", "x"}, {"logit_bias", {{"50", -100}, {"7", 2.5}}}});
  EXPECT_EQ(c.params.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, 2.5f}, {50, -100.0f}}));
  for (const json& bad : {json{{"x", 1}}, json{{"-3", 1}}, json{{"7", 101}}, json{{"7", "big"}}, json{{"07", 1}, {"7", 2}}}) {
    ApiError e = parse_error([&] { completion({{"prompt", "x"}, {"logit_bias", bad}}); });
    EXPECT_EQ(e.status(), 400) << bad.dump();
    EXPECT_EQ(e.param(), "logit_bias") << bad.dump();
  }
}

TEST(RequestParser, FieldsTheServerDoesNotActOnAreListedForTheWarning) {
  auto c = parse_completion_request(json{{"prompt", "x"}, {"best_of", 2}, {"foo", 1}, {"temperature", 0.5}}, {});
  EXPECT_EQ(c.ignored_fields, (std::vector<std::string>{"best_of", "foo"}));
  auto c2 = chat(json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_completion_tokens", 3},
                            {"tools", json::array()}, {"prompt", "not a chat field"}});
  EXPECT_EQ(c2.ignored_fields, (std::vector<std::string>{"prompt"}));
  EXPECT_TRUE(parse_completion_request(json{{"prompt", "x"}, {"max_tokens", 2}}, {}).ignored_fields.empty());
}

TEST(RequestParser, CompletionPromptErrorsNameThePrompt) {
  for (json bad : {json::object(), json{{"prompt", ""}}, json{{"prompt", json::array()}}, json{{"prompt", 5}},
                   json{{"prompt", {"a", 1}}}, json{{"prompt", {1, -2}}}, json{{"prompt", {1, 2.5}}},
                   json{{"prompt", {json::array()}}}}) {
    ApiError e = parse_error([&] { completion(bad); });
    EXPECT_EQ(e.status(), 400) << bad.dump();
    EXPECT_EQ(e.param().value_or(""), "prompt") << bad.dump();
  }
}

TEST(RequestParser, SamplingFieldsMapOntoSamplingParams) {
  auto r = completion({{"prompt", "x"}, {"n", 3}, {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 40},
                       {"min_p", 0.1}, {"seed", 7}, {"presence_penalty", 0.5}, {"frequency_penalty", -0.5},
                       {"repetition_penalty", 1.2}, {"stop", "END"}, {"stop_token_ids", {5, 6}},
                       {"include_stop_str_in_output", true}, {"ignore_eos", true}, {"min_tokens", 2},
                       {"max_tokens", 20}, {"logprobs", 3}, {"skip_special_tokens", false}, {"user", "bob"},
                       {"some_unknown_field", {1, 2}}});
  const SamplingParams& p = r.params;
  EXPECT_EQ(p.n, 3);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.min_p, 0.1f);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.2f);
  EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.min_tokens, 2);
  EXPECT_EQ(*r.max_tokens, 20);
  EXPECT_EQ(*p.logprobs, 3);
  EXPECT_FALSE(p.skip_special_tokens);
}

TEST(RequestParser, GenerationConfigDefaultsApplyUnlessTheRequestSetsThem) {
  RequestDefaults d;
  d.generation.temperature = 0.6;
  d.generation.top_k = 20;
  auto unset = completion({{"prompt", "x"}}, d);
  EXPECT_FLOAT_EQ(unset.params.temperature, 0.6f);
  EXPECT_EQ(unset.params.top_k, 20);
  auto set = completion({{"prompt", "x"}, {"temperature", 0.0}, {"top_k", nullptr}}, d);
  EXPECT_FLOAT_EQ(set.params.temperature, 0.0f);
  EXPECT_EQ(set.params.top_k, 20);  // null means unset
}

TEST(RequestParser, OutOfRangeValuesAre400sNamingTheParameter) {
  struct Case {
    json body;
    const char* param;
  } cases[] = {
      {{{"n", 0}}, "n"},
      {{{"temperature", -1}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_p", 1.5}}, "top_p"},
      {{{"top_k", -2}}, "top_k"},
      {{{"min_p", 2}}, "min_p"},
      {{{"presence_penalty", 3}}, "presence_penalty"},
      {{{"frequency_penalty", -3}}, "frequency_penalty"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"min_tokens", -1}}, "min_tokens"},
      {{{"logprobs", 21}}, "logprobs"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"stop", {"a", ""}}}, "stop"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"logit_bias", {{"5", 1000}}}}, "logit_bias"},  // outside [-100, 100]
      {{{"prompt_logprobs", 1}, {"stream", true}}, "prompt_logprobs"},
  };
  for (const auto& c : cases) {
    json body = c.body;
    body["prompt"] = "x";
    ApiError e = parse_error([&] { completion(body); });
    EXPECT_EQ(e.status(), 400) << body.dump();
    EXPECT_EQ(e.param().value_or(""), c.param) << body.dump() << " -> " << e.what();
  }
}

TEST(RequestParser, WrongTypesAre400sNamingTheField) {
  for (const char* field : {"temperature", "n", "stream", "max_tokens", "seed", "stop", "top_p", "echo"}) {
    json body = {{"prompt", "x"}, {field, {{"nested", true}}}};
    ApiError e = parse_error([&] { completion(body); });
    EXPECT_EQ(e.status(), 400) << field;
    EXPECT_EQ(e.param().value_or(""), field);
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
  // A number in a string is not a number.
  EXPECT_EQ(parse_error([&] { completion({{"prompt", "x"}, {"temperature", "0.5"}}); }).param().value_or(""),
            "temperature");
  // 2.0 is an integer, 2.5 is not.
  EXPECT_EQ(completion({{"prompt", "x"}, {"n", 2.0}}).params.n, 2);
  EXPECT_EQ(parse_error([&] { completion({{"prompt", "x"}, {"n", 2.5}}); }).param().value_or(""), "n");
}

TEST(RequestParser, ChatFields) {
  auto r = chat({{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}},
                                                                 {{"type", "text"}, {"text", "b"}}}}}}},
                 {"max_tokens", 5}, {"max_completion_tokens", 9}, {"logprobs", true}, {"top_logprobs", 2},
                 {"stream", true}, {"stream_options", {{"include_usage", true}}},
                 {"chat_template_kwargs", {{"enable_thinking", false}}},
                 {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}});
  EXPECT_EQ(r.messages[0]["content"], "a\nb");  // text parts joined with newlines, as vLLM
  EXPECT_EQ(*r.max_tokens, 9);                  // max_completion_tokens wins
  EXPECT_STREQ(r.max_tokens_param, "max_completion_tokens");
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(*r.params.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(chat({{"messages", {{{"role", "user"}, {"content", "x"}}}}}).max_tokens);  // up to max_model_len
}

TEST(RequestParser, ChatKeepsTheClientsKeyOrderForTheTemplate) {
  std::string body = R"({"messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function","function":{"name":"f","parameters":{"zeta":1,"alpha":2}}}]})";
  auto r = parse_chat_request(json::parse(body), ojson::parse(body), {});
  EXPECT_EQ(r.tools.dump(), R"([{"type":"function","function":{"name":"f","parameters":{"zeta":1,"alpha":2}}}])");
}

TEST(RequestParser, ChatToolCallArgumentsBecomeObjects) {
  json body = {{"messages", {{{"role", "assistant"}, {"content", nullptr},
                              {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                               {"function", {{"name", "f"}, {"arguments", "{\"b\": 1, \"a\": 2}"}}}}}}}}}};
  auto r = chat(body);
  EXPECT_EQ(r.messages[0]["tool_calls"][0]["function"]["arguments"].dump(), R"({"b":1,"a":2})");
}

// A number beyond any double is not a parse_error but nlohmann's out_of_range (406); it escaped
// parse_limited and the route answered 500 (found by tests/fuzz/request_parser_fuzz).
TEST(RequestParser, NumberOverflowInTheBodyIsA400) {
  const std::string body = R"({"prompt": "x", "max_tokens": "ten", "temperature": -1, "top_p": 1e400})";
  ApiError e = parse_error([&] { fields::parse_limited<json>(body, "the request body"); });
  EXPECT_EQ(e.status(), 400);
  EXPECT_NE(std::string(e.what()).find("Invalid JSON in the request body"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("number overflow"), std::string::npos) << e.what();
  EXPECT_EQ(parse_error([&] { fields::parse_limited<ojson>("[-1e999]", "the request body"); }).status(), 400);
  // Tool call arguments that do not parse stay the client's string, overflow included.
  EXPECT_TRUE(fields::parse_limited<ojson>("{\"a\": 1e400}", "tool call arguments", false).is_discarded());
  json args = {{"messages", {{{"role", "assistant"}, {"content", nullptr},
                              {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                               {"function", {{"name", "f"}, {"arguments", "{\"a\": 1e400}"}}}}}}}}}};
  EXPECT_EQ(chat(args).messages[0]["tool_calls"][0]["function"]["arguments"], "{\"a\": 1e400}");
}

TEST(RequestParser, ChatErrors) {
  EXPECT_EQ(parse_error([&] { chat(json::object()); }).param().value_or(""), "messages");
  EXPECT_EQ(parse_error([&] { chat({{"messages", "hi"}}); }).param().value_or(""), "messages");
  EXPECT_EQ(parse_error([&] { chat({{"messages", json::array()}}); }).param().value_or(""), "messages");
  EXPECT_EQ(parse_error([&] { chat({{"messages", {{{"content", "no role"}}}}}); }).param().value_or(""), "messages");
  json msg = {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}};
  EXPECT_EQ(parse_error([&] { chat({{"messages", msg}}); }).param().value_or(""), "messages");
  json ok = {{{"role", "user"}, {"content", "x"}}};
  EXPECT_EQ(parse_error([&] { chat({{"messages", ok}, {"top_logprobs", 2}}); }).param().value_or(""), "top_logprobs");
  EXPECT_EQ(parse_error([&] { chat({{"messages", ok}, {"continue_final_message", true}}); }).param().value_or(""),
            "continue_final_message");
  EXPECT_EQ(parse_error([&] { chat({{"messages", ok}, {"max_completion_tokens", 0}}); }).param().value_or(""),
            "max_completion_tokens");
  EXPECT_EQ(parse_error([&] { chat({{"messages", ok}, {"tool_choice", "required"}}); }).param().value_or(""),
            "tool_choice");
}

TEST(RequestParser, MaxTokensAgainstTheContextStatesBothNumbers) {
  CommonRequest req;
  req.max_tokens = 100;
  ApiError e = parse_error([&] { resolve_max_tokens(req, std::nullopt, 50, 128); });
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param().value_or(""), "max_tokens");
  std::string msg = e.what();
  EXPECT_NE(msg.find("128"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100"), std::string::npos) << msg;
  EXPECT_NE(msg.find("50"), std::string::npos) << msg;

  ApiError too_long = parse_error([&] { resolve_max_tokens(CommonRequest{}, std::nullopt, 128, 128); });
  EXPECT_NE(std::string(too_long.what()).find("128"), std::string::npos);

  EXPECT_EQ(resolve_max_tokens(CommonRequest{}, std::nullopt, 28, 128), 100);  // unset: the rest of the context
  EXPECT_EQ(resolve_max_tokens(CommonRequest{}, 30, 28, 128), 30);             // generation_config max_new_tokens
  EXPECT_EQ(resolve_max_tokens(req, std::nullopt, 28, 128), 100);
}

TEST(ApiErrorBody, HasOpenAIsShape) {
  json body = bad_request("bad temperature", "temperature").body();
  EXPECT_EQ(body, json::parse(R"({"error": {"message": "bad temperature", "type": "BadRequestError",
                                             "param": "temperature", "code": 400}})"));
  EXPECT_EQ(not_found("no").body()["error"]["param"], nullptr);
  EXPECT_EQ(not_found("no").body()["error"]["type"], "NotFoundError");
}

}  // namespace
}  // namespace specula::server
