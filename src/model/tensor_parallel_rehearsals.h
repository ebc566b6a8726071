// Which tensor-parallel steps run first as a rehearsal: once on every rank with the collectives
// off (Communicator::set_rehearsal; the activations and K/V entries it writes are garbage that the
// real run rewrites), before the real run. Inside a real forward a rank may not do anything that
// waits for its device's queue to drain: a peer's collective in that queue waits for this rank,
// so neither would ever finish. Two such things happen on a step's first run at new sizes:
//  - a device allocation, when the step needs more scratch than any before: its activations grow
//    with its tokens, logits rows, sequences, query rows and block-table width, and decode
//    attention's with sequences x width. Such a step is rehearsed at the longest lengths that
//    width allows (kAtLongest), so that later, longer steps of no larger size fit too;
//  - the first use of a library kernel: cuBLASLt loads a matmul's kernels when a matmul first
//    needs them (cuLibraryLoadData, whatever CUDA_MODULE_LOADING says), holding a lock that every
//    other rank's next cuBLASLt call then waits for. Its choice of kernel follows the matmul's
//    rows, by class (Backend::matmul_rows_class: cuBLASLt's plans per M bucket): a step whose
//    token count (every layer's matmuls) or logits rows (the lm_head's) are of a class not run
//    before. Nothing larger, it is rehearsed as it is (kAsIs): the arena never shrinks, and the
//    real run needs exactly the rehearsal's scratch. Keyed by the exact counts instead, a served
//    Qwen3-8B at TP 2 under prompts of varied lengths rehearsed 59 of its 71 eager forwards,
//    2.7 s of a 9.7 s benchmark; by class 18, 1.2 s (docs/PERFORMANCE.md). Not foreseen: a row count that its
//    bucket's algorithm cannot run gets a plan of its own (cuda_lt_common.h logs it). The counts
//    and their time are logged when the model goes.
// After the rehearsal the arenas are grown and the kernels loaded, and the real run waits for
// nothing but its peers.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <set>

#include "model/model.h"

namespace specula {

class TensorParallelRehearsals {
 public:
  enum class Kind { kNone, kAsIs, kAtLongest };
  // rows_class: Backend::matmul_rows_class of the model's backends (the default: every count is
  // its own class).
  explicit TensorParallelRehearsals(std::function<int64_t(int64_t)> rows_class = {}) : rows_class_(std::move(rows_class)) {}
  // Which rehearsal `step` needs; either way its sizes count as run from now on.
  Kind needed(const ForwardInput& step);

  // Steps asked about, how many of them needed a rehearsal (the extra forwards paid), and how
  // many of those at the longest lengths.
  int64_t steps() const { return steps_; }
  int64_t rehearsed() const { return rehearsed_; }
  int64_t rehearsed_at_longest() const { return at_longest_; }
  // Wall time the rehearsals took, each with the synchronisation it ends in (the host waits for
  // every rank's device): what they cost a run beyond their forwards' counts.
  void add_seconds(double seconds) { seconds_ += seconds; }
  double seconds() const { return seconds_; }

 private:
  int64_t steps_ = 0, rehearsed_ = 0, at_longest_ = 0;
  double seconds_ = 0.0;
  // tokens, logits rows, sequences, query rows, table width, sequences x width
  std::array<int64_t, 6> largest_{};
  std::function<int64_t(int64_t)> rows_class_;
  std::set<int64_t> tokens_run_, logits_rows_run_;  // row classes
};

}  // namespace specula
