// main() of the suites that need a CUDA device (test_backend_cuda, test_<layer>_cuda). Their tests
// skip themselves where no device is visible; ctest would still print "Passed" for a suite that
// ran nothing, so a suite with skipped tests and no failure exits 77, which ctest reports as
// "Skipped", after a line that counts them. tools/gpu/run_tests.sh runs these suites on the GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  // The tensor-parallel tests run NCCL kernels that spin until their peers arrive: kernels must not
  // load lazily at their first launch (see cli/vllm_flags.cc), so load them all when CUDA starts.
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  ::testing::InitGoogleTest(&argc, argv);
  const int status = RUN_ALL_TESTS();
  const ::testing::UnitTest& run = *::testing::UnitTest::GetInstance();
  if (status != 0) return status;
  if (run.skipped_test_count() > 0) {
    std::printf("%d of %d tests skipped (no CUDA device visible), %d passed\n", run.skipped_test_count(),
                run.test_to_run_count(), run.successful_test_count());
    return 77;
  }
  return 0;
}
