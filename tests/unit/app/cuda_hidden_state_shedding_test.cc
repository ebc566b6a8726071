// hidden_state_shedding_test.cc on the device, with the proposers' CUDA graphs and greedy chains:
// fed again after a shed stretch, MTP and EAGLE-3 recover their acceptance (on the CPU 0.71 and
// 0.89 of drafts after the stretch). Not yet run on a GPU.
#include "unit/app/shedding_workload.h"
#include "unit/backend/cuda/cuda_test_util.h"

namespace specula {
namespace {

TEST(CudaHiddenStateShedding, Eagle3AcceptsAfterAShedStretch) {
  SKIP_WITHOUT_GPU();
  testing::expect_acceptance_survives_shedding("eagle3", "cuda");
}
TEST(CudaHiddenStateShedding, MtpAcceptsAfterAShedStretch) {
  SKIP_WITHOUT_GPU();
  testing::expect_acceptance_survives_shedding("mtp", "cuda");
}

}  // namespace
}  // namespace specula
