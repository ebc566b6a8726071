// EAGLE-3 and MTP after a stretch of steps shed at depth 0 (shedding_workload.h), on the CPU: the
// drafts after the stretch are accepted nearly as often as those of a proposer that saw every
// step, although the stretch's positions have no entries of their own in its cache. (On the H100
// the adaptive depth's probes after such stretches accepted 0 of 25 and 0 of 40 drafts:
// cuda_hidden_state_shedding_test.cc is this test on the device.)
#include "unit/app/shedding_workload.h"

namespace specula {
namespace {

TEST(HiddenStateShedding, Eagle3AcceptsAfterAShedStretch) {
  testing::expect_acceptance_survives_shedding("eagle3", "cpu");
}
TEST(HiddenStateShedding, MtpAcceptsAfterAShedStretch) { testing::expect_acceptance_survives_shedding("mtp", "cpu"); }

}  // namespace
}  // namespace specula
