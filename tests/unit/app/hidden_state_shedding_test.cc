// EAGLE-3 and MTP after a stretch of steps shed at depth 0 (shedding_workload.h), on the CPU: fed
// again, they recover, although the stretch's positions have no entries of their own in their
// cache. The first steps after the stretch accept far fewer drafts (eagle3: 2 of 18 in the
// first three steps against 18 of 18 fed; on the H100 the adaptive depth's one-step probes after
// such stretches accepted 0 of 25 and 0 of 40), which is why the adaptive depth feeds them while
// it measures. cuda_hidden_state_shedding_test.cc is this test on the device.
#include "unit/app/shedding_workload.h"

namespace specula {
namespace {

TEST(HiddenStateShedding, Eagle3AcceptsAfterAShedStretch) {
  testing::expect_acceptance_survives_shedding("eagle3", "cpu");
}
TEST(HiddenStateShedding, MtpAcceptsAfterAShedStretch) { testing::expect_acceptance_survives_shedding("mtp", "cpu"); }

}  // namespace
}  // namespace specula
