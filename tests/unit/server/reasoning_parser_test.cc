#include <gtest/gtest.h>

#include "server/reasoning_parser.h"

namespace specula::server {
namespace {

using nlohmann::json;

ReasoningDelta whole(const std::string& name, const std::string& text, json kwargs = json::object()) {
  return ReasoningParser::create(name, kwargs)->parse_all(text);
}

// Streams `text` cut at every pair of positions; every cut must split exactly like the whole.
void expect_streaming_matches_whole(const std::string& name, const std::string& text, json kwargs = json::object()) {
  ReasoningDelta ref = whole(name, text, kwargs);
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      auto p = ReasoningParser::create(name, kwargs);
      ReasoningDelta acc;
      for (auto piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) {
        ReasoningDelta d = p->feed(piece);
        acc.reasoning += d.reasoning;
        acc.content += d.content;
      }
      ReasoningDelta tail = p->finish();
      acc.reasoning += tail.reasoning;
      acc.content += tail.content;
      ASSERT_EQ(acc.reasoning, ref.reasoning) << name << " cuts " << a << "," << b << " of " << text;
      ASSERT_EQ(acc.content, ref.content) << name << " cuts " << a << "," << b << " of " << text;
    }
  }
}

TEST(ReasoningParser, DeepSeekR1) {
  auto r = whole("deepseek_r1", "I think so.</think>\n\nYes.");
  EXPECT_EQ(r.reasoning, "I think so.");
  EXPECT_EQ(r.content, "\n\nYes.");
  r = whole("deepseek_r1", "<think>hm</think>ok");  // a <think> the model writes itself is dropped
  EXPECT_EQ(r.reasoning, "hm");
  EXPECT_EQ(r.content, "ok");
  r = whole("deepseek_r1", "still thinking");  // no </think>: all reasoning
  EXPECT_EQ(r.reasoning, "still thinking");
  EXPECT_EQ(r.content, "");
  r = whole("deepseek_r1", "a < b </thin");  // a cut-off tag at the end stays text
  EXPECT_EQ(r.reasoning, "a < b </thin");
}

TEST(ReasoningParser, Qwen3) {
  auto r = whole("qwen3", "<think>\nlet me see\n</think>\n\nAnswer");
  EXPECT_EQ(r.reasoning, "\nlet me see\n");
  EXPECT_EQ(r.content, "\n\nAnswer");
  r = whole("qwen3", "Plain answer </think> with no start tag");  // no <think>: no reasoning
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Plain answer </think> with no start tag");
  r = whole("qwen3", "<think>x</think>y", {{"enable_thinking", false}});
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "<think>x</think>y");
  r = whole("qwen3", "<think>unfinished");
  EXPECT_EQ(r.reasoning, "unfinished");
  EXPECT_EQ(r.content, "");
}

TEST(ReasoningParser, TagsCutAcrossDeltasSplitLikeTheWholeText) {
  for (const char* text : {"abc</think>def", "<think>abc</think>def", "</think>", "<think></think>", "x</thi</think>y",
                           "<thinking>no</think>", "  <think>a</think>b", "<th", "</think></think>z"}) {
    expect_streaming_matches_whole("deepseek_r1", text);
    expect_streaming_matches_whole("qwen3", text);
  }
}

TEST(ReasoningParser, Names) {
  EXPECT_TRUE(ReasoningParser::is_known("deepseek_r1"));
  EXPECT_TRUE(ReasoningParser::is_known("qwen3"));
  EXPECT_FALSE(ReasoningParser::is_known("granite"));
  EXPECT_EQ(ReasoningParser::create("granite", json::object()), nullptr);
}

}  // namespace
}  // namespace specula::server
