#include <gtest/gtest.h>

#include "engine/output_processor.h"
#include "engine_fakes.h"

namespace specula {
namespace {

using testing::FakeTokenizer;

class OutputProcessorTest : public ::testing::Test {
 protected:
  FakeTokenizer tok;
  OutputProcessor op{tok};

  std::shared_ptr<RequestStream> add(const std::string& id, SamplingParams p, int n = 1, int prompt_len = 3) {
    auto stream = std::make_shared<RequestStream>();
    std::vector<std::string> children;
    if (n == 1) children.push_back(id);
    for (int i = 0; n > 1 && i < n; ++i) children.push_back(id + "#" + std::to_string(i));
    op.add_request(id, children, prompt_len, std::make_shared<const SamplingParams>(p), stream);
    return stream;
  }
  static EngineCoreOutput out(const std::string& id, std::vector<int32_t> tokens,
                              RequestStatus status = RequestStatus::kRunning, StopReason reason = {}) {
    EngineCoreOutput o;
    o.req_id = id;
    o.new_token_ids = std::move(tokens);
    o.status = status;
    o.stop_reason = std::move(reason);
    return o;
  }
  static RequestOutput pop(RequestStream& s) {
    RequestOutput o;
    EXPECT_TRUE(s.pop(&o, std::chrono::milliseconds(0)));
    return o;
  }
  int32_t id(const std::string& piece) { return *tok.token_to_id(piece); }
};

TEST_F(OutputProcessorTest, StreamsDetokenizedText) {
  auto s = add("r", {});
  op.process({out("r", {id("ab"), id(" ")})});
  RequestOutput o = pop(*s);
  ASSERT_EQ(o.choices.size(), 1u);
  EXPECT_EQ(o.choices[0].text, "ab ");
  EXPECT_EQ(o.choices[0].token_ids, (std::vector<int32_t>{id("ab"), id(" ")}));
  EXPECT_FALSE(o.finished);
  op.process({out("r", {id("cd")}, RequestStatus::kFinishedLength)});
  o = pop(*s);
  EXPECT_EQ(o.choices[0].text, "cd");
  EXPECT_EQ(o.choices[0].finish_reason, FinishReason::kLength);
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(op.num_requests(), 0u);
}

TEST_F(OutputProcessorTest, HoldsBackIncompleteUtf8) {
  auto s = add("r", {});
  op.process({out("r", {id("a"), 40})});
  EXPECT_EQ(pop(*s).choices[0].text, "a");
  op.process({out("r", {41})});
  EXPECT_EQ(pop(*s).choices[0].text, "\xc3\xa9");
}

TEST_F(OutputProcessorTest, StopStringAcrossTokenBoundariesIsHeldBackThenCut) {
  SamplingParams p;
  p.stop = {"STOP"};
  auto s = add("r", p);
  EXPECT_TRUE(op.process({out("r", {id("a"), id("ST")})}).empty());
  RequestOutput o = pop(*s);
  EXPECT_EQ(o.choices[0].text, "a");  // "ST" could start "STOP": held back
  std::vector<std::string> stopped = op.process({out("r", {id("OP"), id("b")})});
  EXPECT_EQ(stopped, std::vector<std::string>{"r"});  // the scheduler must finish it
  o = pop(*s);
  EXPECT_EQ(o.choices[0].text, "");
  EXPECT_EQ(o.choices[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(std::get<std::string>(o.choices[0].stop_reason), "STOP");
  // Tokens after the one completing the stop string are dropped.
  EXPECT_EQ(o.choices[0].token_ids, std::vector<int32_t>{id("OP")});
  EXPECT_TRUE(o.finished);
}

TEST_F(OutputProcessorTest, HeldBackTextIsReleasedWhenTheStopStringDoesNotComplete) {
  SamplingParams p;
  p.stop = {"STOP"};
  auto s = add("r", p);
  op.process({out("r", {id("ST")})});
  EXPECT_EQ(pop(*s).choices[0].text, "");
  op.process({out("r", {id("a")})});
  EXPECT_EQ(pop(*s).choices[0].text, "STa");
  op.process({out("r", {id("ST")}, RequestStatus::kFinishedLength)});
  EXPECT_EQ(pop(*s).choices[0].text, "ST");  // finished: nothing left to hold back for
}

TEST_F(OutputProcessorTest, StopStringInsideATokenCutsTheRestOfIt) {
  SamplingParams p;
  p.stop = {"bc"};
  auto s = add("r", p);
  op.process({out("r", {id("ab"), id("cd")})});
  RequestOutput o = pop(*s);
  EXPECT_EQ(o.choices[0].text, "a");
  EXPECT_EQ(std::get<std::string>(o.choices[0].stop_reason), "bc");

  p.stop = {"y"};
  p.include_stop_str_in_output = true;
  auto s2 = add("r2", p);
  op.process({out("r2", {id("a"), id("xyz")})});
  o = pop(*s2);
  EXPECT_EQ(o.choices[0].text, "axy");
  EXPECT_EQ(o.choices[0].finish_reason, FinishReason::kStop);
}

TEST_F(OutputProcessorTest, EarliestOfSeveralStopStringsWins) {
  SamplingParams p;
  p.stop = {"cd", "b"};
  auto s = add("r", p);
  op.process({out("r", {id("ab"), id("cd")})});
  RequestOutput o = pop(*s);
  EXPECT_EQ(o.choices[0].text, "a");
  EXPECT_EQ(std::get<std::string>(o.choices[0].stop_reason), "b");
}

TEST_F(OutputProcessorTest, StopStringsWaitForMinTokens) {
  SamplingParams p;
  p.stop = {"a"};
  p.min_tokens = 2;
  auto s = add("r", p);
  op.process({out("r", {id("a")})});
  RequestOutput o = pop(*s);
  EXPECT_FALSE(o.finished);
  EXPECT_EQ(o.choices[0].text, "a");  // a stop string, but before min_tokens
  op.process({out("r", {id("b"), id("a")})});
  o = pop(*s);
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.choices[0].text, "b");  // the whole text is "ab"
}

TEST_F(OutputProcessorTest, EosAndStopTokenTextIsLeftOutUnlessAsked) {
  auto s = add("eos", {});
  op.process({out("eos", {id("a"), FakeTokenizer::kEos}, RequestStatus::kFinishedStopped)});
  RequestOutput o = pop(*s);
  EXPECT_EQ(o.choices[0].text, "a");
  EXPECT_EQ(o.choices[0].token_ids.size(), 2u);
  EXPECT_EQ(o.choices[0].finish_reason, FinishReason::kStop);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(o.choices[0].stop_reason));

  auto s2 = add("st", {});
  op.process({out("st", {id("a"), id("cd")}, RequestStatus::kFinishedStopped, id("cd"))});
  o = pop(*s2);
  EXPECT_EQ(o.choices[0].text, "a");
  EXPECT_EQ(std::get<int32_t>(o.choices[0].stop_reason), id("cd"));

  SamplingParams inc;
  inc.include_stop_str_in_output = true;
  auto s3 = add("inc", inc);
  op.process({out("inc", {id("a"), id("cd")}, RequestStatus::kFinishedStopped, id("cd"))});
  EXPECT_EQ(pop(*s3).choices[0].text, "acd");
}

TEST_F(OutputProcessorTest, SpecialTokensAreSkippedUnlessAsked) {
  SamplingParams keep;
  keep.skip_special_tokens = false;
  auto s = add("r", keep);
  op.process({out("r", {FakeTokenizer::kBos, id("a")})});
  EXPECT_EQ(pop(*s).choices[0].text, "<bos>a");
  auto s2 = add("r2", {});
  op.process({out("r2", {FakeTokenizer::kBos, id("a")})});
  EXPECT_EQ(pop(*s2).choices[0].text, "a");
}

TEST_F(OutputProcessorTest, JoinsChoicesOfOneRequest) {
  SamplingParams p;
  p.n = 2;
  auto s = add("r", p, 2);
  op.process({out("r#0", {id("a")}), out("r#1", {id("b")})});
  RequestOutput o = pop(*s);
  ASSERT_EQ(o.choices.size(), 2u);
  EXPECT_EQ(o.choices[0].index, 0);
  EXPECT_EQ(o.choices[1].index, 1);
  EXPECT_EQ(o.choices[1].text, "b");
  op.process({out("r#1", {id("c")}, RequestStatus::kFinishedLength)});
  o = pop(*s);
  ASSERT_EQ(o.choices.size(), 1u);
  EXPECT_EQ(o.choices[0].index, 1);
  EXPECT_FALSE(o.finished);
  op.process({out("r#0", {id("d")}, RequestStatus::kFinishedLength)});
  EXPECT_TRUE(pop(*s).finished);
}

TEST_F(OutputProcessorTest, PassesLogprobsAndAssemblesPromptLogprobs) {
  SamplingParams p;
  p.logprobs = 1;
  p.prompt_logprobs = 0;
  auto s = add("r", p, 1, /*prompt_len=*/4);
  EngineCoreOutput chunk1 = out("r", {});
  chunk1.prompt_logprobs = PromptLogprobsChunk{0, {std::nullopt, PositionLogprobs{{5, -1.0f, 2}, {}}}};
  op.process({chunk1});
  RequestOutput none;
  EXPECT_FALSE(s->pop(&none, std::chrono::milliseconds(0)));  // a prefill chunk: nothing to say yet
  EngineCoreOutput chunk2 = out("r", {id("a")});
  chunk2.prompt_logprobs = PromptLogprobsChunk{2, {PositionLogprobs{{6, -2.0f, 3}, {}}, PositionLogprobs{{7, -3.0f, 1}, {}}}};
  chunk2.new_logprobs = {PositionLogprobs{{id("a"), -0.5f, 1}, {{id("a"), -0.5f, 1}}}};
  chunk2.num_cached_tokens = 0;
  op.process({chunk2});
  RequestOutput o = pop(*s);
  ASSERT_TRUE(o.prompt_logprobs.has_value());
  ASSERT_EQ(o.prompt_logprobs->size(), 4u);
  EXPECT_FALSE((*o.prompt_logprobs)[0].has_value());
  EXPECT_EQ((*o.prompt_logprobs)[1]->chosen.token_id, 5);
  EXPECT_EQ((*o.prompt_logprobs)[3]->chosen.logprob, -3.0f);
  ASSERT_EQ(o.choices[0].logprobs.size(), 1u);
  EXPECT_EQ(o.choices[0].logprobs[0].chosen.logprob, -0.5f);
  op.process({out("r", {id("b")})});
  EXPECT_FALSE(pop(*s).prompt_logprobs.has_value());  // only on the first output
}

TEST_F(OutputProcessorTest, AbortAndFailEndTheStream) {
  SamplingParams p;
  p.n = 2;
  auto s = add("r", p, 2);
  op.process({out("r#0", {id("a")}, RequestStatus::kFinishedLength)});
  pop(*s);
  op.abort("r");
  RequestOutput o = pop(*s);
  EXPECT_TRUE(o.finished);
  ASSERT_EQ(o.choices.size(), 1u);  // only the unfinished choice
  EXPECT_EQ(o.choices[0].index, 1);
  EXPECT_EQ(o.choices[0].finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(s->done());
  EXPECT_FALSE(op.has_request("r"));

  auto s2 = add("f", {});
  op.fail("f", "boom");
  o = pop(*s2);
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.error, std::optional<std::string>("boom"));
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

TEST_F(OutputProcessorTest, PromptLogprobsWaitUntilComplete) {
  SamplingParams p;
  p.n = 2;
  p.prompt_logprobs = 0;
  auto s = add("r", p, 2, /*prompt_len=*/3);
  // Choice 1 (prompt from the cache) samples while choice 0 has computed only position 1.
  EngineCoreOutput c0 = out("r#0", {});
  c0.prompt_logprobs = PromptLogprobsChunk{0, {std::nullopt, PositionLogprobs{{5, -1.0f, 1}, {}}}};
  op.process({c0, out("r#1", {id("a")})});
  EXPECT_FALSE(pop(*s).prompt_logprobs.has_value());
  EngineCoreOutput c1 = out("r#0", {id("b")});
  c1.prompt_logprobs = PromptLogprobsChunk{2, {PositionLogprobs{{6, -2.0f, 1}, {}}}};
  op.process({c1});
  RequestOutput o = pop(*s);
  ASSERT_TRUE(o.prompt_logprobs.has_value());
  EXPECT_EQ((*o.prompt_logprobs)[2]->chosen.token_id, 6);
}

}  // namespace
}  // namespace specula
