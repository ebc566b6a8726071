// Structured outputs through the whole engine (LLMEngine::create on the embedded model): every
// constrained output is valid against a checker nobody here wrote (nlohmann::json, std::regex),
// greedy outputs are the same with each speculative method and with async scheduling, and bad
// constraints are errors at add_request.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "unit/app/structured_output_workload.h"

namespace specula::testing {
namespace {

TEST(StructuredOutputs, JsonSchemaGivesValidObjectsGreedyAndSampled) {
  for (bool sampled : {false, true}) {
    EngineRun r = run_requests(tiny_config(""), tool_workload(sampled, 8));
    for (const ChoiceResult& c : r.results) {
      EXPECT_EQ(c.finish, FinishReason::kStop) << c.text;
      expect_valid_tool_arguments(c.text);
    }
  }
}

TEST(StructuredOutputs, RegexChoiceJsonObjectAndGrammar) {
  std::vector<SamplingParams> params;
  for (int i = 0; i < 4; ++i) {
    params.push_back(constrained(Kind::kRegex, "[a-z]{2,5}-[0-9]{3}( ok)?", i % 2 == 1, i));
    SamplingParams choice = constrained(Kind::kChoice, "", i % 2 == 1, i);
    choice.structured_outputs->choices = {"positive", "negative", "neutral"};
    params.push_back(choice);
    params.push_back(constrained(Kind::kJsonObject, "", i % 2 == 1, i));
    params.push_back(constrained(Kind::kGrammar, R"g(root ::= "(" expr ")"
expr ::= term ([+*] term){0,3}
term ::= [0-9] | "(" expr ")")g",
                                 i % 2 == 1, i));
  }
  for (auto& p : params) p.max_tokens = 300;
  EngineRun r = run_requests(tiny_config(""), params);
  const std::regex pattern("[a-z]{2,5}-[0-9]{3}( ok)?");
  for (size_t i = 0; i < r.results.size(); ++i) {
    const ChoiceResult& c = r.results[i];
    switch (i % 4) {
      case 0:
        EXPECT_TRUE(std::regex_match(c.text, pattern)) << c.text;
        EXPECT_EQ(c.finish, FinishReason::kStop);
        break;
      case 1:
        EXPECT_TRUE(c.text == "positive" || c.text == "negative" || c.text == "neutral") << c.text;
        break;
      case 2:
        // json_object: an object, or cut by max_tokens as a prefix of one.
        if (c.finish == FinishReason::kStop) {
          nlohmann::json v;
          ASSERT_NO_THROW(v = nlohmann::json::parse(c.text)) << c.text;
          EXPECT_TRUE(v.is_object()) << c.text;
        } else {
          EXPECT_EQ(c.text.substr(0, 1), "{") << c.text;
        }
        break;
      case 3:
        EXPECT_EQ(c.finish, FinishReason::kStop) << c.text;
        EXPECT_EQ(c.text.front(), '(');
        EXPECT_EQ(c.text.back(), ')');
        break;
    }
  }
}

TEST(StructuredOutputs, GreedyOutputIsTheSameWithEverySpeculativeMethodAndAsync) {
  std::vector<SamplingParams> params = tool_workload(false, 6);
  // Free requests share the batch with the constrained ones.
  for (int i = 0; i < 3; ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 40;
    params.push_back(p);
  }
  const EngineRun plain = run_requests(tiny_config(""), params);
  for (const auto& [name, spec] : {std::pair{"draft_model", draft_spec(3)}, std::pair{"ngram", ngram_spec(3)}}) {
    for (bool async : {false, true}) {
      const EngineRun with = run_requests(tiny_config(spec), params, async);
      EXPECT_GT(with.metrics.spec_num_draft_tokens, 0) << name;
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(with.results[i].tokens, plain.results[i].tokens) << name << " async " << async << " request " << i;
        EXPECT_EQ(with.results[i].text, plain.results[i].text) << name << " request " << i;
      }
    }
  }
  const EngineRun async_plain = run_requests(tiny_config(""), params, true);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(async_plain.results[i].tokens, plain.results[i].tokens) << i;
}

TEST(StructuredOutputs, InvalidConstraintsAreErrorsAtAddRequest) {
  auto engine = create_engine(tiny_config(""));
  const auto prompts = tiny_prompts();
  auto expect_error = [&](SamplingParams p, const std::string& needle) {
    try {
      engine->add_request(NewRequest{"bad", prompts[0], std::move(p)});
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(constrained(Kind::kJson, "{not json", false, 0), "not valid JSON");
  expect_error(constrained(Kind::kJson, R"({"type": "object", "not": {"type": "string"}})", false, 0), "not");
  expect_error(constrained(Kind::kRegex, "(a)\\1", false, 0), "backreference");
  expect_error(constrained(Kind::kGrammar, "root ::= undefined_rule", false, 0), "undefined_rule");
  engine->shutdown();
}

}  // namespace
}  // namespace specula::testing
