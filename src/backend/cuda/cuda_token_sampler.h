// TokenSampler on the GPU (backend/token_sampler.h): the host side of cuda_sampling.cu.
//
// Per call: the rows' settings (and, for rows with penalties or masked ids, their id lists) go up
// in ONE pinned host-to-device copy; the counts kernel and the sampling kernel run; the results
// (token, and logprobs where asked for) come back in pinned memory and the call synchronises
// once. Both copies run on the backend's copy stream (CudaBackend::copy_stream), ordered by
// events, so that the compute stream's kernels run back to back. The logits themselves never
// leave the device, nor do the final distributions rows may write (probs_out_row: the
// speculative draft's q).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "backend/cuda/cuda_engine_kernels.h"
#include "backend/token_sampler.h"
#include "core/tensor.h"

namespace specula {

class CudaBackend;

class CudaTokenSampler final : public TokenSampler {
 public:
  static constexpr int kMaxTopLogprobs = 64;
  static constexpr int kMaxCountRows = 64;  // rows with penalties / masked ids per launch

  CudaTokenSampler(CudaBackend& backend, int max_rows, int64_t vocab);
  ~CudaTokenSampler() override;
  CudaTokenSampler(const CudaTokenSampler&) = delete;
  CudaTokenSampler& operator=(const CudaTokenSampler&) = delete;

  int max_top_logprobs() const override { return kMaxTopLogprobs; }
  std::vector<TokenSamplingResult> sample(const Tensor& logits, std::span<const TokenSamplingRow> rows,
                                          const Tensor* draft_probs = nullptr, Tensor* probs_out = nullptr) override;
  void start_sample(const Tensor& logits, std::span<const TokenSamplingRow> rows, const Tensor* draft_probs = nullptr,
                    Tensor* probs_out = nullptr) override;
  std::vector<TokenSamplingResult> finish_sample() override;
  bool can_feed_started() const override { return started_ && !finished_early_; }
  void feed_started_tokens(Tensor& token_ids) override;
  void draw_on_device(const Tensor& logits, std::span<const TokenSamplingRow> rows, Tensor* probs_out,
                      Tensor& tokens_out) override;
  std::vector<TokenSamplingResult> logprobs_of(const Tensor& logits, std::span<const int32_t> rows,
                                               std::span<const int32_t> targets, int top_n) override;
  size_t device_bytes() const override;

 private:
  // Uploads, launches and reads back one batch of at most max_rows_ rows: launch() queues the work
  // and the results' copy into pinned memory, read_results() waits for it and decodes them.
  std::vector<TokenSamplingResult> run(const Tensor& logits, const std::vector<cuda::SamplingRowDesc>& rows,
                                       const std::vector<cuda::CountsDesc>& counts,
                                       const std::vector<int32_t>& ids, const Tensor* draft_probs = nullptr,
                                       Tensor* probs_out = nullptr);
  void launch(const Tensor& logits, const std::vector<cuda::SamplingRowDesc>& rows,
              const std::vector<cuda::CountsDesc>& counts, const std::vector<int32_t>& ids,
              const Tensor* draft_probs, Tensor* probs_out);
  std::vector<TokenSamplingResult> read_results();
  void check_logits(const Tensor& logits) const;
  // Row i's draw settings (logits row, greedy or temperature and filters, its uniform), checked.
  cuda::SamplingRowDesc draw_desc(const Tensor& logits, const TokenSamplingRow& r, size_t i) const;
  void check_probs(const Tensor* probs, int32_t row, const char* what, size_t row_index) const;
  void ensure_upload_capacity(size_t bytes);

  CudaBackend& backend_;
  cudaStream_t stream_;
  bool plain_row_clusters_ = false;  // sm_90+: launch_sample_plain_rows for a few plain rows
  int max_rows_;
  int count_rows_;
  int64_t vocab_;
  Tensor counts_;       // [count_rows, V] of 32-bit flags + counts (stored as I32)
  Tensor results_;      // SamplingRowResult [max_rows] then TopLogprob [max_rows, kMaxTopLogprobs]
  Tensor upload_;       // row descriptors, counts descriptors, ids
  void* host_results_ = nullptr;  // pinned mirror of results_
  cudaEvent_t results_copied_ = nullptr;  // recorded after the copy into host_results_ (copy stream)
  cudaEvent_t rows_uploaded_ = nullptr;   // recorded after the upload into upload_ (copy stream)
  cudaEvent_t rows_read_ = nullptr;       // recorded after the kernels that read upload_
  void* host_upload_ = nullptr;   // pinned staging for upload_
  size_t upload_capacity_ = 0;
  std::vector<int32_t> launched_top_n_;  // per row of the launched batch (read_results decodes it)
  bool started_ = false;                 // start_sample() ran, finish_sample() not yet
  std::optional<std::vector<TokenSamplingResult>> finished_early_;  // a start_sample() that had to wait
  // draw_on_device's row descriptors: a ring of pinned host slots (each reused only once the copy
  // out of it ran: an event a slot), all uploaded into one device buffer (stream-ordered).
  static constexpr int kDrawSlots = 8;
  void* host_draws_ = nullptr;
  cudaEvent_t draw_uploaded_[kDrawSlots] = {};
  bool draw_slot_used_[kDrawSlots] = {};
  int next_draw_slot_ = 0;
  Tensor draw_upload_;  // SamplingRowDesc [max_rows]
};

}  // namespace specula
