#include "backend/cuda/cuda_token_sampler.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace specula {
namespace {

constexpr size_t kAlign = 16;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t results_bytes(int rows) { return align_up(sizeof(cuda::SamplingRowResult) * static_cast<size_t>(rows)); }
size_t top_bytes(int rows) {
  return sizeof(cuda::TopLogprob) * static_cast<size_t>(rows) * CudaTokenSampler::kMaxTopLogprobs;
}

}  // namespace

CudaTokenSampler::CudaTokenSampler(CudaBackend& backend, int max_rows, int64_t vocab)
    : backend_(backend), stream_(backend.stream()), max_rows_(max_rows), vocab_(vocab) {
  SPECULA_CHECK(max_rows > 0 && vocab > 0 && vocab < (int64_t{1} << 31),
                "CUDA sampler: needs positive max_rows ({}) and a vocabulary below 2^31 ({})", max_rows, vocab);
  // Counts rows only for rows with penalties or masked ids; more such rows than this in one call
  // run in several launches.
  count_rows_ = std::min(max_rows, kMaxCountRows);
  counts_ = backend.empty({count_rows_, vocab}, DType::kI32);  // read as uint32 flags + counts
  const size_t rbytes = results_bytes(max_rows) + top_bytes(max_rows);
  results_ = backend.empty({static_cast<int64_t>(rbytes)}, DType::kU8);
  check_cuda(cudaHostAlloc(&host_results_, rbytes, cudaHostAllocDefault), "CUDA sampler: pinned result buffer");
  ensure_upload_capacity(64 * 1024);
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, backend.device_index()),
             "CUDA sampler: compute capability");
  // SPECULA_PLAIN_ROW_CLUSTERS=0: one block a row instead, so that compute-sanitizer synccheck
  // can judge the rest (it reports barrier divergence in any clustered launch of more than a few
  // clusters, a kernel with none included: tools/gpu/synccheck_clusters.sh).
  const char* clusters = std::getenv("SPECULA_PLAIN_ROW_CLUSTERS");
  plain_row_clusters_ = major >= 9 && !(clusters && std::strcmp(clusters, "0") == 0);
  check_cuda(cudaEventCreateWithFlags(&results_copied_, cudaEventDisableTiming), "CUDA sampler: event");
  check_cuda(cudaEventCreateWithFlags(&rows_uploaded_, cudaEventDisableTiming), "CUDA sampler: event");
  check_cuda(cudaEventCreateWithFlags(&rows_read_, cudaEventDisableTiming), "CUDA sampler: event");
  const size_t descs = sizeof(cuda::SamplingRowDesc) * static_cast<size_t>(max_rows);
  check_cuda(cudaHostAlloc(&host_draws_, descs * kDrawSlots, cudaHostAllocDefault), "CUDA sampler: pinned draw slots");
  for (cudaEvent_t& e : draw_uploaded_)
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "CUDA sampler: event");
  draw_upload_ = backend.empty({static_cast<int64_t>(descs)}, DType::kU8);
}

CudaTokenSampler::~CudaTokenSampler() {
  backend_.synchronize();
  for (cudaEvent_t e : {results_copied_, rows_uploaded_, rows_read_})
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : draw_uploaded_)
    if (e) cudaEventDestroy(e);
  if (host_draws_) cudaFreeHost(host_draws_);
  if (host_results_) cudaFreeHost(host_results_);
  if (host_upload_) cudaFreeHost(host_upload_);
}

size_t CudaTokenSampler::device_bytes() const {
  return counts_.nbytes() + results_.nbytes() + upload_.nbytes() + draw_upload_.nbytes();
}

void CudaTokenSampler::ensure_upload_capacity(size_t bytes) {
  if (bytes <= upload_capacity_) return;
  const size_t capacity = std::max(bytes, 2 * upload_capacity_);
  // A launch's results are waited for before the next launch, and its upload copy precedes them in
  // the stream, so nothing still reads the old buffers.
  if (host_upload_) cudaFreeHost(host_upload_);
  host_upload_ = nullptr;
  check_cuda(cudaHostAlloc(&host_upload_, capacity, cudaHostAllocDefault), "CUDA sampler: pinned upload buffer");
  upload_ = backend_.empty({static_cast<int64_t>(capacity)}, DType::kU8);
  upload_capacity_ = capacity;
}

void CudaTokenSampler::check_logits(const Tensor& logits) const {
  SPECULA_CHECK(logits.defined() && logits.device() == Device::kCUDA && logits.dtype() == DType::kF32 &&
                    logits.ndim() == 2,
                "CUDA sampler: logits must be F32 [L, V] on the GPU, got {}", logits.describe());
  SPECULA_CHECK(logits.size(1) == vocab_, "CUDA sampler: logits {} have {} columns, the sampler was made for {}",
                logits.describe(), logits.size(1), vocab_);
}

void CudaTokenSampler::check_probs(const Tensor* probs, int32_t row, const char* what, size_t row_index) const {
  SPECULA_CHECK(probs != nullptr && probs->defined() && probs->device() == Device::kCUDA &&
                    probs->dtype() == DType::kF32 && probs->ndim() == 2 && probs->size(1) == vocab_ && row >= 0 &&
                    row < probs->size(0),
                "CUDA sampler: row {} uses {} row {} that is not there (F32 [R, {}] on the GPU needed, got {})",
                row_index, what, row, vocab_, probs ? probs->describe() : std::string("none"));
}

cuda::SamplingRowDesc CudaTokenSampler::draw_desc(const Tensor& logits, const TokenSamplingRow& r, size_t i) const {
  SPECULA_CHECK(r.logits_row >= 0 && r.logits_row < logits.size(0), "CUDA sampler: row {} reads logits row {} of {}", i,
                r.logits_row, logits.size(0));
  SPECULA_CHECK(r.greedy || r.temperature > 0.0f, "CUDA sampler: row {} samples at temperature {}", i, r.temperature);
  cuda::SamplingRowDesc d;
  d.logits_row = r.logits_row;
  d.greedy = r.greedy ? 1 : 0;
  d.temperature = r.temperature;
  d.top_k = r.top_k > 0 ? r.top_k : 0;
  d.top_p = r.top_p;
  d.min_p = r.min_p;
  d.uniform = r.uniform;
  return d;
}

namespace {
bool needs_counts(const TokenSamplingRow& r) {
  return r.repetition_penalty != 1.0f || r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f ||
         !r.masked_ids.empty() || !r.logit_bias.empty();
}
}  // namespace

std::vector<TokenSamplingResult> CudaTokenSampler::sample(const Tensor& logits, std::span<const TokenSamplingRow> rows,
                                                          const Tensor* draft_probs, Tensor* probs_out) {
  start_sample(logits, rows, draft_probs, probs_out);
  return finish_sample();
}

std::vector<TokenSamplingResult> CudaTokenSampler::finish_sample() {
  SPECULA_CHECK(started_, "internal error: CUDA sampler: finish_sample() without start_sample()");
  started_ = false;
  std::vector<TokenSamplingResult> out = finished_early_ ? std::move(*finished_early_) : read_results();
  finished_early_.reset();
  for (size_t i = 0; i < out.size(); ++i)
    SPECULA_CHECK(out[i].token >= 0, "sampling: every token is masked or the logits are not finite (row {})", i);
  return out;
}

void CudaTokenSampler::feed_started_tokens(Tensor& token_ids) {
  SPECULA_CHECK(can_feed_started(), "internal error: CUDA sampler: token feed without a started launch");
  SPECULA_CHECK(token_ids.device() == Device::kCUDA && token_ids.dtype() == DType::kI32,
                "internal error: CUDA sampler: token feed into {}", token_ids.describe());
  check_cuda(cuda::launch_feed_sampled_tokens(token_ids.data_as<int32_t>(), token_ids.numel(),
                                              static_cast<const cuda::SamplingRowResult*>(results_.data()), stream_),
             "CUDA sampler: token feed");
}

void CudaTokenSampler::start_sample(const Tensor& logits, std::span<const TokenSamplingRow> rows,
                                    const Tensor* draft_probs, Tensor* probs_out) {
  check_logits(logits);
  SPECULA_CHECK(static_cast<int>(rows.size()) <= max_rows_, "CUDA sampler: {} rows, made for at most {}",
                rows.size(), max_rows_);
  // Batches of at most count_rows_ rows that need token counts.
  size_t with_counts = 0, cut = 0;
  for (; cut < rows.size(); ++cut) {
    if (needs_counts(rows[cut]) && ++with_counts > static_cast<size_t>(count_rows_)) break;
  }
  SPECULA_CHECK(!started_, "internal error: CUDA sampler: start_sample() twice");
  if (cut < rows.size()) {  // several launches, each waited for: the results are ready at once
    std::vector<TokenSamplingResult> out = sample(logits, rows.first(cut), draft_probs, probs_out);
    for (TokenSamplingResult& r : sample(logits, rows.subspan(cut), draft_probs, probs_out)) out.push_back(std::move(r));
    finished_early_ = std::move(out);
    started_ = true;
    return;
  }
  std::vector<cuda::SamplingRowDesc> descs(rows.size());
  std::vector<cuda::CountsDesc> counts;
  std::vector<int32_t> ids;
  for (size_t i = 0; i < rows.size(); ++i) {
    const TokenSamplingRow& r = rows[i];
    SPECULA_CHECK(r.top_logprobs <= kMaxTopLogprobs, "CUDA sampler: {} top logprobs asked, at most {} on the device",
                  r.top_logprobs, kMaxTopLogprobs);
    cuda::SamplingRowDesc& d = descs[i] = draw_desc(logits, r, i);
    d.repetition_penalty = r.repetition_penalty;
    d.frequency_penalty = r.frequency_penalty;
    d.presence_penalty = r.presence_penalty;
    d.top_n = r.top_logprobs;
    if (r.draft_token >= 0) {
      SPECULA_CHECK(!r.greedy, "CUDA sampler: row {} verifies a draft token greedily (compare with the argmax)", i);
      SPECULA_CHECK(r.draft_token < vocab_, "verification: draft token {} outside the vocab of {}", r.draft_token,
                    vocab_);
      check_probs(draft_probs, r.q_row, "draft probabilities", i);
      d.draft_token = r.draft_token;
      d.q_row = r.q_row;
      d.uniform_accept = r.uniform_accept;
      d.uniform_residual = r.uniform_residual;
    }
    if (r.probs_out_row >= 0) {
      // A greedy row's distribution is one-hot and a verification row has none of its own: the
      // caller keeps neither.
      SPECULA_CHECK(!r.greedy && r.draft_token < 0,
                    "CUDA sampler: row {} asks for its distribution but is {}", i, r.greedy ? "greedy" : "a verification");
      check_probs(probs_out, r.probs_out_row, "output probabilities", i);
      d.probs_out_row = r.probs_out_row;
    }
    const bool repetition = r.repetition_penalty != 1.0f;
    const bool penalties = repetition || r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f;
    if (needs_counts(r)) {
      d.counts_row = static_cast<int32_t>(counts.size());
      cuda::CountsDesc c;
      c.prompt_begin = static_cast<int32_t>(ids.size());
      if (repetition) ids.insert(ids.end(), r.prompt_ids.begin(), r.prompt_ids.end());
      c.output_begin = static_cast<int32_t>(ids.size());
      if (penalties) ids.insert(ids.end(), r.output_ids.begin(), r.output_ids.end());
      c.masked_begin = static_cast<int32_t>(ids.size());
      ids.insert(ids.end(), r.masked_ids.begin(), r.masked_ids.end());
      c.bias_begin = static_cast<int32_t>(ids.size());
      for (const auto& [id, bias] : r.logit_bias) {
        if (id < 0 || id >= vocab_) continue;  // as the host's math: a bias outside the vocabulary does nothing
        ids.push_back(id);
        ids.push_back(std::bit_cast<int32_t>(bias));
      }
      d.bias_begin = c.bias_begin;
      d.bias_count = (static_cast<int32_t>(ids.size()) - c.bias_begin) / 2;
      c.end = static_cast<int32_t>(ids.size());
      counts.push_back(c);
    }
    if (!r.allowed_mask.empty()) {
      SPECULA_CHECK(static_cast<int64_t>(r.allowed_mask.size()) == (vocab_ + 31) / 32,
                    "CUDA sampler: row {} has an allowed-token mask of {} words for a vocabulary of {}", i,
                    r.allowed_mask.size(), vocab_);
      d.allowed_begin = static_cast<int32_t>(ids.size());
      const size_t at = ids.size();
      ids.resize(at + r.allowed_mask.size());
      std::memcpy(ids.data() + at, r.allowed_mask.data(), r.allowed_mask.size() * sizeof(uint32_t));
    }
  }
  launch(logits, descs, counts, ids, draft_probs, probs_out);
  started_ = true;
}

void CudaTokenSampler::draw_on_device(const Tensor& logits, std::span<const TokenSamplingRow> rows, Tensor* probs_out,
                                      Tensor& tokens_out) {
  check_logits(logits);
  const int n = static_cast<int>(rows.size());
  SPECULA_CHECK(!started_, "internal error: CUDA sampler: a draw while a start_sample() is outstanding");
  SPECULA_CHECK(n <= max_rows_, "CUDA sampler: {} rows, made for at most {}", n, max_rows_);
  SPECULA_CHECK(tokens_out.device() == Device::kCUDA && tokens_out.dtype() == DType::kI32 && tokens_out.numel() == n,
                "internal error: CUDA sampler: {} draws into {}", n, tokens_out.describe());
  if (n == 0) return;
  // The slot's last upload must have run before its host memory is rewritten.
  const int slot = next_draw_slot_;
  next_draw_slot_ = (next_draw_slot_ + 1) % kDrawSlots;
  if (draw_slot_used_[slot])
    check_cuda(cudaEventSynchronize(draw_uploaded_[slot]), "CUDA sampler: waiting for a draw slot");
  auto* descs = static_cast<cuda::SamplingRowDesc*>(host_draws_) + static_cast<size_t>(slot) * max_rows_;
  bool plain = plain_row_clusters_ && n <= cuda::kMaxPlainClusterRows;
  for (int i = 0; i < n; ++i) {
    const TokenSamplingRow& r = rows[static_cast<size_t>(i)];
    SPECULA_CHECK(!needs_counts(r) && r.allowed_mask.empty() && r.top_logprobs < 0 && r.draft_token < 0,
                  "internal error: CUDA sampler: draw row {} needs more than its logits and settings", i);
    cuda::SamplingRowDesc d = draw_desc(logits, r, static_cast<size_t>(i));
    if (r.probs_out_row >= 0) {
      SPECULA_CHECK(!r.greedy, "CUDA sampler: row {} asks for its distribution but is greedy", i);
      check_probs(probs_out, r.probs_out_row, "output probabilities", static_cast<size_t>(i));
      d.probs_out_row = r.probs_out_row;
    }
    plain = plain && cuda::sampling_row_is_plain(d, vocab_);
    descs[i] = d;
  }
  auto* dev = static_cast<cuda::SamplingRowDesc*>(draw_upload_.data());
  check_cuda(cudaMemcpyAsync(dev, descs, sizeof(cuda::SamplingRowDesc) * static_cast<size_t>(n),
                             cudaMemcpyHostToDevice, stream_),
             "CUDA sampler: draw upload");
  check_cuda(cudaEventRecord(draw_uploaded_[slot], stream_), "CUDA sampler: recording a draw upload");
  draw_slot_used_[slot] = true;
  auto* results = static_cast<cuda::SamplingRowResult*>(results_.data());
  if (backend_.copy_stream() != stream_)  // results_ is rewritten: after the last results' copy
    check_cuda(cudaStreamWaitEvent(stream_, results_copied_, 0), "CUDA sampler: waiting for the last results' copy");
  if (plain) {
    check_cuda(cuda::launch_sample_plain_rows(logits.data_as<float>(), vocab_, dev, n,
                                              probs_out ? probs_out->data_as<float>() : nullptr, results, stream_),
               "CUDA sampler: drawing (plain rows)");
  } else {
    auto* top = reinterpret_cast<cuda::TopLogprob*>(static_cast<char*>(results_.data()) + results_bytes(max_rows_));
    check_cuda(cuda::launch_sample_rows(logits.data_as<float>(), vocab_, dev, n, nullptr, nullptr, nullptr,
                                        probs_out ? probs_out->data_as<float>() : nullptr, results, top,
                                        kMaxTopLogprobs, stream_),
               "CUDA sampler: drawing");
  }
  check_cuda(cuda::launch_copy_sampled_tokens(results, n, tokens_out.data_as<int32_t>(), stream_),
             "CUDA sampler: drawn tokens");
}

std::vector<TokenSamplingResult> CudaTokenSampler::logprobs_of(const Tensor& logits, std::span<const int32_t> rows,
                                                               std::span<const int32_t> targets, int top_n) {
  check_logits(logits);
  SPECULA_CHECK(rows.size() == targets.size(), "CUDA sampler: {} rows and {} targets", rows.size(), targets.size());
  SPECULA_CHECK(top_n >= 0 && top_n <= kMaxTopLogprobs, "CUDA sampler: top {} logprobs, at most {} on the device",
                top_n, kMaxTopLogprobs);
  std::vector<TokenSamplingResult> out;
  out.reserve(rows.size());
  for (size_t first = 0; first < rows.size(); first += static_cast<size_t>(max_rows_)) {
    const size_t n = std::min(rows.size() - first, static_cast<size_t>(max_rows_));
    std::vector<cuda::SamplingRowDesc> descs(n);
    for (size_t i = 0; i < n; ++i) {
      const int32_t row = rows[first + i], target = targets[first + i];
      SPECULA_CHECK(row >= 0 && row < logits.size(0), "CUDA sampler: logits row {} of {}", row, logits.size(0));
      SPECULA_CHECK(target >= 0 && target < vocab_, "logprobs: token {} outside the vocab of {}", target, vocab_);
      descs[i].logits_row = row;
      descs[i].target = target;
      descs[i].top_n = top_n;
    }
    std::vector<TokenSamplingResult> part = run(logits, descs, {}, {});
    for (TokenSamplingResult& r : part) out.push_back(std::move(r));
  }
  return out;
}

std::vector<TokenSamplingResult> CudaTokenSampler::run(const Tensor& logits,
                                                       const std::vector<cuda::SamplingRowDesc>& rows,
                                                       const std::vector<cuda::CountsDesc>& counts,
                                                       const std::vector<int32_t>& ids,
                                                       const Tensor* draft_probs, Tensor* probs_out) {
  launch(logits, rows, counts, ids, draft_probs, probs_out);
  return read_results();
}

void CudaTokenSampler::launch(const Tensor& logits, const std::vector<cuda::SamplingRowDesc>& rows,
                              const std::vector<cuda::CountsDesc>& counts, const std::vector<int32_t>& ids,
                              const Tensor* draft_probs, Tensor* probs_out) {
  const int n = static_cast<int>(rows.size());
  launched_top_n_.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) launched_top_n_[i] = rows[i].top_n;
  if (n == 0) return;
  const size_t rows_at = 0, counts_at = align_up(sizeof(cuda::SamplingRowDesc) * rows.size());
  const size_t ids_at = counts_at + align_up(sizeof(cuda::CountsDesc) * counts.size());
  const size_t bytes = ids_at + sizeof(int32_t) * ids.size();
  ensure_upload_capacity(bytes);
  char* host = static_cast<char*>(host_upload_);
  std::memcpy(host + rows_at, rows.data(), sizeof(cuda::SamplingRowDesc) * rows.size());
  if (!counts.empty()) std::memcpy(host + counts_at, counts.data(), sizeof(cuda::CountsDesc) * counts.size());
  if (!ids.empty()) std::memcpy(host + ids_at, ids.data(), sizeof(int32_t) * ids.size());
  char* dev = static_cast<char*>(upload_.data());
  // The upload runs on the copy stream while the forward before it does, behind only the last
  // launch's kernels (the readers of upload_); the kernels below wait for it and for the last
  // results' copy (the readers of results_).
  cudaStream_t copies = backend_.copy_stream();
  if (copies != stream_) check_cuda(cudaStreamWaitEvent(copies, rows_read_, 0), "CUDA sampler: ordering the upload");
  check_cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, copies), "CUDA sampler: upload");
  if (copies != stream_) {
    check_cuda(cudaEventRecord(rows_uploaded_, copies), "CUDA sampler: recording the upload");
    check_cuda(cudaStreamWaitEvent(stream_, rows_uploaded_, 0), "CUDA sampler: waiting for the upload");
    check_cuda(cudaStreamWaitEvent(stream_, results_copied_, 0), "CUDA sampler: waiting for the last results' copy");
  }

  if (!counts.empty()) {
    check_cuda(cudaMemsetAsync(counts_.data(), 0, counts.size() * static_cast<size_t>(vocab_) * sizeof(uint32_t),
                               stream_),
               "CUDA sampler: clearing counts");
    check_cuda(cuda::launch_build_token_counts(reinterpret_cast<const cuda::CountsDesc*>(dev + counts_at),
                                               reinterpret_cast<const int32_t*>(dev + ids_at),
                                               static_cast<int>(counts.size()), counts_.data_as<uint32_t>(), vocab_,
                                               stream_),
               "CUDA sampler: token counts");
  }
  char* res_dev = static_cast<char*>(results_.data());
  auto* top_dev = reinterpret_cast<cuda::TopLogprob*>(res_dev + results_bytes(max_rows_));
  // A few rows that only draw: a cluster of blocks per row rather than one SM per row.
  const bool plain = plain_row_clusters_ && counts.empty() && n <= cuda::kMaxPlainClusterRows &&
                     std::all_of(rows.begin(), rows.end(),
                                 [&](const cuda::SamplingRowDesc& d) { return cuda::sampling_row_is_plain(d, vocab_); });
  if (plain) {
    check_cuda(cuda::launch_sample_plain_rows(logits.data_as<float>(), vocab_,
                                              reinterpret_cast<const cuda::SamplingRowDesc*>(dev + rows_at), n,
                                              probs_out ? probs_out->data_as<float>() : nullptr,
                                              reinterpret_cast<cuda::SamplingRowResult*>(res_dev), stream_),
               "CUDA sampler: sampling (plain rows)");
  } else {
    check_cuda(cuda::launch_sample_rows(logits.data_as<float>(), vocab_,
                                        reinterpret_cast<const cuda::SamplingRowDesc*>(dev + rows_at), n,
                                        counts_.data_as<uint32_t>(), reinterpret_cast<const int32_t*>(dev + ids_at),
                                        draft_probs ? draft_probs->data_as<float>() : nullptr,
                                        probs_out ? probs_out->data_as<float>() : nullptr,
                                        reinterpret_cast<cuda::SamplingRowResult*>(res_dev), top_dev,
                                        kMaxTopLogprobs, stream_),
               "CUDA sampler: sampling");
  }
  check_cuda(cudaEventRecord(rows_read_, stream_), "CUDA sampler: recording the sampling");
  // The results come back on the copy stream: the step's next kernel (a draft chain, the next
  // forward) does not wait for the copy.
  cudaStream_t readback = backend_.copy_stream_after_work();
  char* res_host = static_cast<char*>(host_results_);
  check_cuda(cudaMemcpyAsync(res_host, res_dev, sizeof(cuda::SamplingRowResult) * rows.size(), cudaMemcpyDeviceToHost,
                             readback),
             "CUDA sampler: results");
  const bool any_top = std::any_of(rows.begin(), rows.end(), [](const cuda::SamplingRowDesc& d) { return d.top_n > 0; });
  auto* top_host = reinterpret_cast<cuda::TopLogprob*>(res_host + results_bytes(max_rows_));
  if (any_top) {
    check_cuda(cudaMemcpyAsync(top_host, top_dev, top_bytes(n), cudaMemcpyDeviceToHost, readback),
               "CUDA sampler: top logprobs");
  }
  check_cuda(cudaEventRecord(results_copied_, readback), "CUDA sampler: recording the results' copy");
}

std::vector<TokenSamplingResult> CudaTokenSampler::read_results() {
  const int n = static_cast<int>(launched_top_n_.size());
  if (n == 0) return {};
  // The results' copy only: under async scheduling the next step's forward is queued behind it.
  check_cuda(cudaEventSynchronize(results_copied_), "CUDA sampler: waiting for the results");
  const char* res_host = static_cast<const char*>(host_results_);
  const auto* top_host = reinterpret_cast<const cuda::TopLogprob*>(res_host + results_bytes(max_rows_));
  const auto* results = reinterpret_cast<const cuda::SamplingRowResult*>(res_host);
  std::vector<TokenSamplingResult> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const cuda::SamplingRowResult& r = results[i];
    TokenSamplingResult& o = out[static_cast<size_t>(i)];
    o.token = r.token;
    o.accepted = r.accepted != 0;
    if (launched_top_n_[static_cast<size_t>(i)] < 0 || r.token < 0) continue;
    o.has_logprobs = true;
    o.logprob = r.logprob;
    o.rank = r.rank;
    std::vector<cuda::TopLogprob> top(top_host + static_cast<size_t>(i) * kMaxTopLogprobs,
                                      top_host + static_cast<size_t>(i) * kMaxTopLogprobs + r.num_top);
    // Most likely first, ties by lower id: the host sampler's order, on the raw logits.
    std::sort(top.begin(), top.end(), [](const cuda::TopLogprob& a, const cuda::TopLogprob& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
    });
    o.top.reserve(top.size());
    for (const cuda::TopLogprob& t : top)
      o.top.push_back({t.token, static_cast<float>(static_cast<double>(t.logit) - r.lse)});
  }
  return out;
}

}  // namespace specula
