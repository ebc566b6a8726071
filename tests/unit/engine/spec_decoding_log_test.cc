// The SpecDecoding log line: vLLM's fields, in vLLM's order and format, over one interval.
#include <gtest/gtest.h>

#include "engine/spec_decoding_log.h"

namespace specula {
namespace {

TEST(SpecDecodingLog, VllmShapeOverTheInterval) {
  EngineMetrics m;
  m.spec_num_speculative_tokens = 3;
  m.spec_adaptive = true;
  // Before the interval: 10 drafts already counted.
  m.spec_num_drafts = 10;
  m.spec_num_draft_tokens = 30;
  m.spec_num_accepted_tokens = 20;
  m.spec_accepted_per_pos = {9, 7, 4};
  m.spec_depth_steps = 5;
  m.spec_depth_sum = 15;
  SpecDecodingLog log;
  log.begin(m);
  // The interval: 100 drafts of 3 (one of them only 2 deep), 80/55/40 accepted per position.
  m.spec_num_drafts += 100;
  m.spec_num_draft_tokens += 299;
  m.spec_num_accepted_tokens += 175;
  m.spec_accepted_per_pos = {9 + 80, 7 + 55, 4 + 40};
  m.spec_depth_steps += 40;
  m.spec_depth_sum += 92;
  const std::optional<std::string> line = log.interval_line(10.0, m);
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line,
            "SpecDecoding metrics: Mean acceptance length: 2.75, Accepted throughput: 17.50 tokens/s, Drafted "
            "throughput: 29.90 tokens/s, Accepted: 175 tokens, Drafted: 299 tokens, Per-position acceptance rate: "
            "0.800, 0.550, 0.400, Avg Draft acceptance rate: 58.5%, Mean speculative depth: 2.30 (adaptive, k=3)");
  // Nothing new since: no line. Depth-0 steps only: a line saying so.
  EXPECT_FALSE(log.interval_line(10.0, m).has_value());
  m.spec_depth_steps += 7;
  const std::optional<std::string> idle = log.interval_line(10.0, m);
  ASSERT_TRUE(idle.has_value());
  EXPECT_EQ(*idle, "SpecDecoding metrics: no drafts in this interval, Mean speculative depth: 0.00 (adaptive, k=3)");
  // Speculation off: never a line.
  EngineMetrics off;
  SpecDecodingLog l2;
  l2.begin(off);
  off.spec_depth_steps = 3;
  EXPECT_FALSE(l2.interval_line(1.0, off).has_value());
}

TEST(SpecDecodingLog, PinnedDepthAndPositionsNeverReached) {
  EngineMetrics m;
  m.spec_num_speculative_tokens = 4;
  SpecDecodingLog log;
  log.begin(m);
  m.spec_num_drafts = 2;
  m.spec_num_draft_tokens = 8;
  m.spec_num_accepted_tokens = 1;
  m.spec_accepted_per_pos = {1};
  m.spec_depth_steps = 2;
  m.spec_depth_sum = 8;
  EXPECT_EQ(*log.interval_line(0.5, m),
            "SpecDecoding metrics: Mean acceptance length: 1.50, Accepted throughput: 2.00 tokens/s, Drafted "
            "throughput: 16.00 tokens/s, Accepted: 1 tokens, Drafted: 8 tokens, Per-position acceptance rate: 0.500, "
            "0.000, 0.000, 0.000, Avg Draft acceptance rate: 12.5%, Mean speculative depth: 4.00 (k=4)");
}

}  // namespace
}  // namespace specula
