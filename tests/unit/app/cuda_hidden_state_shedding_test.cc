// hidden_state_shedding_test.cc on the device, with the proposers' CUDA graphs and greedy chains:
// on the H100 the adaptive depth's probes after shed stretches accepted 0 of 25 (eagle3) and 0 of
// 40 (mtp) drafts where the CPU accepts 0.70 and 0.89 of them. Not yet run on a GPU.
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
