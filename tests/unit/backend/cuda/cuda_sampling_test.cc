// The plain-row sampling kernel (a thread-block cluster per row, cuda_sampling.cu) against the
// one-block-per-row kernel on the same rows and uniforms: the same token for greedy and
// temperature rows, a maximum that repeats (the first index wins), rows with one finite logit and
// rows with none, vocabularies from 17 tokens (fewer than the cluster's blocks) to Qwen3's; the
// rows that keep their distribution (probs_out, a speculative draft's q) write the same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_engine_kernels.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

template <class T>
T* upload(const std::vector<T>& host) {
  T* dev = nullptr;
  check_cuda(cudaMalloc(&dev, sizeof(T) * host.size()), "test: cudaMalloc");
  check_cuda(cudaMemcpy(dev, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice), "test: upload");
  return dev;
}

TEST(CudaSampling, PlainRowClustersDrawWhatOneBlockPerRowDraws) {
  SKIP_WITHOUT_GPU();
  auto backend = make_cuda_backend(0);
  auto& gpu = dynamic_cast<CudaBackend&>(*backend);
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu.device_index()), "test");
  if (major < 9) GTEST_SKIP() << "thread-block clusters need sm_90";
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  constexpr int kRows = cuda::kMaxPlainClusterRows;
  for (int64_t vocab : {151936, 128256, 4099, 17}) {
    std::vector<float> logits = testing::random_floats(static_cast<size_t>(kRows * vocab), rng, 6.0f);
    float* row1 = logits.data() + vocab;
    row1[3] = row1[vocab - 2] = 50.0f;  // the maximum twice
    float* row2 = logits.data() + 2 * vocab;
    for (int64_t i = 0; i < vocab; ++i) row2[i] = i == vocab - 1 ? 1.0f : -INFINITY;  // one finite logit, last
    float* row3 = logits.data() + 3 * vocab;
    for (int64_t i = 0; i < vocab; ++i) row3[i] = -INFINITY;  // none
    float* d_logits = upload(logits);
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<cuda::SamplingRowDesc> descs(kRows);
      for (int r = 0; r < kRows; ++r) {
        cuda::SamplingRowDesc& d = descs[static_cast<size_t>(r)];
        d.logits_row = (r + trial) % kRows;
        d.greedy = (r + trial) % 3 == 0 ? 1 : 0;
        d.temperature = r % 2 ? 1.0f : 0.6f;
        d.uniform = trial == 0 ? 0.0 : trial == 1 ? std::nextafter(1.0, 0.0) : uniform(rng);
        if (r % 4 == 1 && d.logits_row != 3) d.probs_out_row = r;  // keeps q
        ASSERT_TRUE(cuda::sampling_row_is_plain(d, vocab));
      }
      cuda::SamplingRowDesc* d_descs = upload(descs);
      std::vector<cuda::SamplingRowResult> none(kRows);
      cuda::SamplingRowResult* d_cluster = upload(none);
      cuda::SamplingRowResult* d_block = upload(none);
      const std::vector<float> sentinel(static_cast<size_t>(kRows * vocab), -3.0f);
      float* d_cluster_probs = upload(sentinel);
      float* d_block_probs = upload(sentinel);
      check_cuda(cuda::launch_sample_plain_rows(d_logits, vocab, d_descs, kRows, d_cluster_probs, d_cluster,
                                                gpu.stream()),
                 "plain");
      check_cuda(cuda::launch_sample_rows(d_logits, vocab, d_descs, kRows, nullptr, nullptr, nullptr, d_block_probs,
                                          d_block, nullptr, 0, gpu.stream()),
                 "one block a row");
      check_cuda(cudaStreamSynchronize(gpu.stream()), "test: sync");
      std::vector<cuda::SamplingRowResult> cluster(kRows), block(kRows);
      check_cuda(cudaMemcpy(cluster.data(), d_cluster, sizeof(cuda::SamplingRowResult) * kRows, cudaMemcpyDeviceToHost),
                 "test: download");
      check_cuda(cudaMemcpy(block.data(), d_block, sizeof(cuda::SamplingRowResult) * kRows, cudaMemcpyDeviceToHost),
                 "test: download");
      for (int r = 0; r < kRows; ++r) {
        const cuda::SamplingRowDesc& d = descs[static_cast<size_t>(r)];
        EXPECT_EQ(cluster[r].token, block[r].token)
            << "vocab " << vocab << " trial " << trial << " logits row " << d.logits_row << " greedy " << d.greedy;
        if (d.logits_row == 1) {
          if (d.greedy) EXPECT_EQ(cluster[r].token, 3);
          else EXPECT_TRUE(cluster[r].token == 3 || cluster[r].token == vocab - 2) << cluster[r].token;
        }
        if (d.logits_row == 2) EXPECT_EQ(cluster[r].token, vocab - 1);
        if (d.logits_row == 3) EXPECT_EQ(cluster[r].token, d.greedy ? 0 : -1);
      }
      std::vector<float> cluster_probs(sentinel.size()), block_probs(sentinel.size());
      check_cuda(cudaMemcpy(cluster_probs.data(), d_cluster_probs, sizeof(float) * sentinel.size(),
                            cudaMemcpyDeviceToHost),
                 "test: download");
      check_cuda(cudaMemcpy(block_probs.data(), d_block_probs, sizeof(float) * sentinel.size(), cudaMemcpyDeviceToHost),
                 "test: download");
      EXPECT_TRUE(cluster_probs == block_probs) << "vocab " << vocab << " trial " << trial << ": q rows differ";
      int kept = 0;
      for (int r = 0; r < kRows; ++r) kept += cluster_probs[static_cast<size_t>(r) * vocab] != -3.0f ? 1 : 0;
      EXPECT_GT(kept, 0);
      cudaFree(d_cluster_probs);
      cudaFree(d_block_probs);
      cudaFree(d_descs);
      cudaFree(d_cluster);
      cudaFree(d_block);
    }
    cudaFree(d_logits);
  }
}

}  // namespace
}  // namespace specula
