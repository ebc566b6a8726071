// TensorParallelRehearsals: a step is rehearsed at the longest lengths when any of its sizes is
// larger than every step's before (its scratch may grow), as it is when only its matmul row counts
// are of a class that has not run before (a library may load a kernel for them); never twice for
// the same sizes.
#include "model/tensor_parallel_rehearsals.h"

#include <gtest/gtest.h>

#include <vector>

namespace specula {
namespace {

using Kind = TensorParallelRehearsals::Kind;

// A step of `seqs` sequences with `tokens` rows, `logits` logits rows, its longest query and a
// block table `width` blocks wide.
ForwardInput step(int tokens, int logits, int seqs, int max_query, int width) {
  ForwardInput in;
  in.token_ids = Tensor::from_i32(std::vector<int32_t>(static_cast<size_t>(tokens), 1));
  in.logits_indices = Tensor::from_i32(std::vector<int32_t>(static_cast<size_t>(logits), 0));
  in.attn.num_seqs = seqs;
  in.attn.max_query_len = max_query;
  in.attn.block_tables = Tensor::from_i32(std::vector<int32_t>(static_cast<size_t>(seqs * width), 0), {seqs, width});
  return in;
}

TEST(TensorParallelRehearsals, FirstStepOfEachSizeOnly) {
  TensorParallelRehearsals r;
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(128, 1, 1, 128, 16)));  // the first prefill
  EXPECT_EQ(Kind::kAsIs, r.needed(step(1, 1, 1, 1, 16)));  // the first decode step: new rows, nothing larger
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Kind::kNone, r.needed(step(1, 1, 1, 1, 16)));
  EXPECT_EQ(Kind::kNone, r.needed(step(128, 1, 1, 128, 16)));
  EXPECT_EQ(r.steps(), 8);
  EXPECT_EQ(r.rehearsed(), 2);
  EXPECT_EQ(r.rehearsed_at_longest(), 1);
}

TEST(TensorParallelRehearsals, NewRowCountsThoughNothingGrows) {
  TensorParallelRehearsals r;
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(64, 8, 8, 8, 32)));
  EXPECT_EQ(Kind::kAsIs, r.needed(step(16, 4, 4, 4, 32)));  // fewer verification rows: 16 and 4 never ran
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(16, 16, 4, 4, 32)));  // every row's logits: more logits rows than before
  EXPECT_EQ(Kind::kAsIs, r.needed(step(4, 4, 4, 1, 32)));    // 4 token rows: 4 ran as logits rows only
  EXPECT_EQ(Kind::kNone, r.needed(step(16, 8, 2, 8, 8)));   // counts that ran, fewer sequences, a narrower table
}

TEST(TensorParallelRehearsals, AnySizeLargerThanBefore) {
  TensorParallelRehearsals r;
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(8, 8, 8, 1, 16)));
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(8, 8, 8, 1, 17)));  // a wider block table: longer sequences' scratch
  EXPECT_EQ(Kind::kNone, r.needed(step(8, 8, 8, 1, 17)));
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(8, 8, 4, 2, 17)));  // a longer query (and new rows over 4 sequences)
  EXPECT_EQ(Kind::kNone, r.needed(step(8, 8, 4, 2, 17)));
}

// Sequences and width at their maxima in different steps: a step with both needs more decode
// attention scratch than either (every sequence split over the whole width).
TEST(TensorParallelRehearsals, MoreSequencesTimesWidthThanBefore) {
  TensorParallelRehearsals r;
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(64, 64, 64, 1, 2)));   // 64 short sequences
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(1, 1, 1, 1, 256)));    // one long one
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(64, 64, 64, 1, 8)));   // no size past its largest, but 64 x 8 blocks
  EXPECT_EQ(Kind::kNone, r.needed(step(64, 64, 64, 1, 4)));  // 64 x 4 blocks: within what ran
}

// Row counts of one class (cuBLASLt's M buckets on CUDA) load no kernel after the first: a served
// model's prefill and mixed steps have a new token count nearly every step.
TEST(TensorParallelRehearsals, RowCountsOfAClassThatRan) {
  TensorParallelRehearsals r([](int64_t rows) { return rows <= 16 ? rows : int64_t{1} << (64 - __builtin_clzll(rows - 1)); });
  EXPECT_EQ(Kind::kAtLongest, r.needed(step(300, 3, 3, 200, 32)));  // class 512
  EXPECT_EQ(Kind::kNone, r.needed(step(290, 3, 3, 200, 32)));        // 290: class 512 too
  EXPECT_EQ(Kind::kAsIs, r.needed(step(200, 3, 3, 100, 32)));        // class 256
  EXPECT_EQ(Kind::kNone, r.needed(step(129, 3, 3, 100, 32)));
  EXPECT_EQ(Kind::kAsIs, r.needed(step(17, 2, 2, 15, 32)));          // class 32, 2 logits rows
  EXPECT_EQ(Kind::kAsIs, r.needed(step(16, 2, 2, 15, 32)));          // 16 and below are exact
  EXPECT_EQ(Kind::kAsIs, r.needed(step(15, 2, 2, 14, 32)));
  EXPECT_EQ(r.rehearsed(), 5);
}

}  // namespace
}  // namespace specula
