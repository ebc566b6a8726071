// greedy_matches, the comparison of an engine's greedy tokens with a transformers fixture: token
// for token, except at a step whose reference margin makes it a near-tie for the engine's precision.
#include "unit/spec_decode/reference_fixture.h"

#include <gtest/gtest.h>

#include "test_paths.h"

namespace specula::testing {
namespace {

GreedyReference reference() {
  GreedyReference r;
  r.prompts = {{5, 6}};
  r.greedy = {{1, 2, 3, 4}};
  r.greedy_margins = {{0.2f, 0.004f, 0.3f, 0.2f}};
  return r;
}

TEST(GreedyMatches, LeavesTheReferenceOnlyAtANearTie) {
  const GreedyReference r = reference();
  EXPECT_TRUE(greedy_matches({1, 2, 3, 4}, r, 0, 0.0));
  EXPECT_TRUE(greedy_matches({1, 9, 8, 7}, r, 0, kBf16NearTie));  // step 1 is a near-tie for bf16
  EXPECT_FALSE(greedy_matches({1, 9, 8, 7}, r, 0, 0.0));          // but not for fp32
  EXPECT_FALSE(greedy_matches({1, 2, 9, 4}, r, 0, kBf16NearTie)); // step 2 is no near-tie
  EXPECT_FALSE(greedy_matches({1, 2, 3}, r, 0, kBf16NearTie));
  EXPECT_FALSE(greedy_matches({1, 2, 3, 4, 5}, r, 0, kBf16NearTie));
}

TEST(GreedyMatches, AFixtureWithoutMarginsIsComparedTokenForToken) {
  GreedyReference r = reference();
  r.greedy_margins.clear();
  EXPECT_TRUE(greedy_matches({1, 2, 3, 4}, r, 0, kBf16NearTie));
  EXPECT_FALSE(greedy_matches({1, 9, 8, 7}, r, 0, kBf16NearTie));
}

// The embedded target's fixture carries a margin for every greedy step, and its smallest is the
// step of the first prompt that bf16 flips on 4 GPUs (docs/PERFORMANCE.md, issue 20).
TEST(GreedyMatches, TheEmbeddedFixturesCarryTheirMargins) {
  for (const char* name : {"specula-tiny", "specula-tiny-draft", "specula-tiny-moe"}) {
    const GreedyReference r = read_greedy_reference(fixtures_dir() / "embedded" / name / "reference.safetensors");
    ASSERT_EQ(r.greedy_margins.size(), r.greedy.size()) << name;
    for (size_t i = 0; i < r.greedy.size(); ++i) {
      ASSERT_EQ(r.greedy_margins[i].size(), r.greedy[i].size()) << name << " prompt " << i;
      for (float m : r.greedy_margins[i]) EXPECT_TRUE(m >= 0.0f && m <= 2.0f) << name << " prompt " << i;
    }
  }
  const GreedyReference tiny =
      read_greedy_reference(fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors");
  EXPECT_LT(tiny.greedy_margins[0][6], kBf16NearTie);
}

}  // namespace
}  // namespace specula::testing
