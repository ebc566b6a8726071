// Prompt lookup: the longest recurring suffix n-gram, its most recent earlier occurrence, the
// tokens after it.
#include <gtest/gtest.h>

#include "spec_decode/ngram_proposer.h"

namespace specula {
namespace {

using V = std::vector<int32_t>;

TEST(NgramLookup, ProposesWhatFollowedTheLongestRecurringSuffix) {
  //                 0  1  2  3  4  5  6  7  8  9
  const V tokens = {1, 2, 3, 4, 5, 9, 2, 3, 4, 2, 3};
  // Suffix [2, 3] occurred at 1..2 (followed by 4, 5, 9) and 6..7 (followed by 4, 2, 3); with n
  // up to 3, [4, 2, 3] does not recur, so the longest match is [2, 3]; most recent: at 6..7.
  EXPECT_EQ(ngram_lookup(tokens, 1, 3, 3), (V{4, 2, 3}));
  EXPECT_EQ(ngram_lookup(tokens, 1, 3, 1), (V{4}));
  // A longer recurring suffix wins over a more recent shorter one.
  const V t2 = {7, 8, 9, 1, 5, 9, 6, 7, 8, 9};
  // [7, 8, 9] recurs at 0..2 (followed by 1, 5); [9] alone most recently at 5 (followed by 6).
  EXPECT_EQ(ngram_lookup(t2, 1, 4, 2), (V{1, 5}));
  EXPECT_EQ(ngram_lookup(t2, 1, 1, 2), (V{6, 7}));
}

TEST(NgramLookup, RespectsMinAndMaxAndTheEnd) {
  const V tokens = {5, 6, 7, 1, 6, 7};
  EXPECT_EQ(ngram_lookup(tokens, 2, 2, 4), (V{1, 6, 7}));  // fewer than k tokens follow
  EXPECT_TRUE(ngram_lookup(tokens, 3, 5, 4).empty());      // no recurring 3-gram
  EXPECT_TRUE(ngram_lookup(V{1, 2, 3}, 1, 3, 2).empty());  // nothing recurs
  EXPECT_TRUE(ngram_lookup(V{}, 1, 3, 2).empty());
  EXPECT_TRUE(ngram_lookup(tokens, 1, 3, 0).empty());
  // Repetition: the occurrence may overlap the suffix.
  EXPECT_EQ(ngram_lookup(V{4, 4, 4, 4}, 2, 3, 3), (V{4}));
  EXPECT_EQ(ngram_lookup(V{1, 2, 1, 2, 1, 2}, 2, 2, 3), (V{1, 2}));
}

TEST(NgramProposer, DraftsOnlyForRequestsThatSampled) {
  NgramProposer p(1, 3);
  const V a = {1, 2, 3, 1, 2}, b = {9, 9, 9};
  ProposeBatch batch;
  batch.depth = 2;
  ProposerRequest ra;
  ra.req_id = "a";
  ra.tokens = a;
  ra.sampled = true;
  ra.max_drafts = 2;
  ProposerRequest rb = ra;
  rb.req_id = "b";
  rb.tokens = b;
  rb.sampled = false;  // a prefill chunk
  ProposerRequest rc = ra;
  rc.req_id = "c";
  rc.max_drafts = 1;  // near max_model_len
  batch.requests = {ra, rb, rc};
  std::vector<std::vector<int32_t>> drafts;
  p.propose(batch, drafts);
  ASSERT_EQ(drafts.size(), 3u);
  EXPECT_EQ(drafts[0], (V{3, 1}));
  EXPECT_TRUE(drafts[1].empty());
  EXPECT_EQ(drafts[2], (V{3}));
  batch.depth = 0;
  p.propose(batch, drafts);
  for (const auto& d : drafts) EXPECT_TRUE(d.empty());
  EXPECT_EQ(p.draft_probs(), nullptr);  // deterministic drafts
}

}  // namespace
}  // namespace specula
