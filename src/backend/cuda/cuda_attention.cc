// CUDA backend: paged attention — argument checks, then the split-KV decode kernel for decode
// batches and for small verification batches (at most kMaxDecodeQueryLen rows per sequence), the
// varlen flash-attention kernel otherwise (which handles short rows too, so mixed prefill +
// decode batches need no split). MLA-form caches (no separate V) go to their own tensor-core
// kernel, for every batch shape.
//
// Only the host copies of the metadata are read here (to validate and to size the grids); the
// kernels read the device copies, so nothing here waits for the GPU.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_kernels.h"

namespace specula {
namespace {

bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data()) & 15u) == 0; }

// Every forward writes its attention metadata, and the cache rows of earlier steps, before its
// first launch that is not overlapped (the embedding's gather, or a graph's start), so the decode
// kernel may read them before it waits (PagedAttentionParams::metadata_before_wait).
// SPECULA_ATTENTION_METADATA_BEFORE_WAIT=0 reads them after the wait, for A/B runs.
bool attention_metadata_before_wait() {
  static const bool on = [] {
    const char* v = std::getenv("SPECULA_ATTENTION_METADATA_BEFORE_WAIT");
    return !(v && v[0] == '0');
  }();
  return on;
}

}  // namespace

void CudaBackend::paged_attention(const Tensor& q, const KVCacheLayer& cache, const AttentionMetadata& md, float scale,
                                  Tensor& out) {
  const char* op = "paged_attention";
  // MLA form (cache.v undefined or empty): the value of a key is the first Dv = out.size(-1) dims
  // of its K entry; its own kernel (cuda_attention_mla.cu) takes head dims up to 576.
  const bool mla = !cache.v.defined() || cache.v.numel() == 0;
  cuda_check::dtype(q, DType::kBF16, op, "q");
  cuda_check::dtype(out, DType::kBF16, op, "out");
  // The cache is bf16, or fp8 e4m3 with per-layer scales (decode and varlen kernels; MLA: bf16).
  const bool fp8 = !mla && cache.k.dtype() == DType::kF8E4M3;
  if (!fp8) cuda_check::dtype(cache.k, DType::kBF16, op, "cache.k");
  if (!mla) cuda_check::same_dtype(cache.k, cache.v, op, "cache.k", "cache.v");
  SPECULA_CHECK(!fp8 || (cache.k_scale > 0.0f && cache.v_scale > 0.0f),
                "paged_attention: the fp8 cache's scales must be positive (k {}, v {})", cache.k_scale, cache.v_scale);
  SPECULA_CHECK(q.ndim() == 3 && cache.k.ndim() == 4 && (mla || cache.v.ndim() == 4) && out.ndim() == 3,
                "paged_attention: q {} must be [T, Hq, D], out [T, Hq, Dv] and the cache [num_blocks, block_size, Hk, "
                "D] (got {})",
                q.describe(), cache.k.describe());
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t num_blocks = cache.k.size(0), block_size = cache.k.size(1), hk = cache.k.size(2);
  const int64_t dv = mla ? out.size(2) : cache.v.size(3);
  SPECULA_CHECK(cache.k.size(3) == d && (mla || (cache.v.size(0) == num_blocks && cache.v.size(1) == block_size &&
                                                 cache.v.size(2) == hk)),
                "paged_attention: cache.k {} / cache.v {} do not fit q {}", cache.k.describe(), cache.v.describe(),
                q.describe());
  SPECULA_CHECK(hk > 0 && hq % hk == 0, "paged_attention: {} query heads are not a multiple of {} kv heads", hq, hk);
  SPECULA_CHECK(out.ndim() == 3 && out.size(0) == t && out.size(1) == hq && out.size(2) == dv,
                "paged_attention: out {} must be [{}, {}, {}]", out.describe(), t, hq, dv);
  SPECULA_CHECK(md.block_size == block_size, "paged_attention: metadata block_size {} != cache block size {}",
                md.block_size, block_size);
  if (mla) {
    SPECULA_CHECK(d > 0 && d % cuda::kAttentionHeadDimGranule == 0 && d <= cuda::kMlaMaxHeadDim && dv > 0 &&
                      dv % cuda::kAttentionHeadDimGranule == 0 && dv <= std::min<int64_t>(d, cuda::kMlaMaxVHeadDim),
                  "paged_attention: MLA head dims (q/k {}, v {}) must be multiples of {}, with q/k up to {} and v up "
                  "to min(q/k, {}) on CUDA",
                  d, dv, cuda::kAttentionHeadDimGranule, cuda::kMlaMaxHeadDim, cuda::kMlaMaxVHeadDim);
  } else {
    for (int64_t dim : {d, dv}) {
      SPECULA_CHECK(dim > 0 && dim % cuda::kAttentionHeadDimGranule == 0 && dim <= cuda::kMaxAttentionHeadDim,
                    "paged_attention: head dim {} (q/k {}, v {}) must be a multiple of {} up to {} on CUDA", dim, d,
                    dv, cuda::kAttentionHeadDimGranule, cuda::kMaxAttentionHeadDim);
    }
  }
  SPECULA_CHECK(aligned16(q) && aligned16(out) && aligned16(cache.k) && (mla || aligned16(cache.v)),
                "paged_attention: q, out and the cache must be 16-byte aligned");

  // Validate the host copies of the metadata, and size the launch from them.
  const int64_t num_seqs = md.num_seqs;
  if (num_seqs == 0) return;
  const auto& qsl = md.query_start_loc_host;
  const auto& seq_lens = md.seq_lens_host;
  SPECULA_CHECK(static_cast<int64_t>(qsl.size()) == num_seqs + 1 && static_cast<int64_t>(seq_lens.size()) == num_seqs,
                "paged_attention: query_start_loc_host has {} entries and seq_lens_host {} for {} sequences",
                qsl.size(), seq_lens.size(), num_seqs);
  SPECULA_CHECK(qsl[0] == 0 && qsl[num_seqs] <= t,
                "paged_attention: query_start_loc must start at 0 and end within the {} rows of q", t);
  cuda_check::dtype(md.query_start_loc, DType::kI32, op, "md.query_start_loc");
  cuda_check::dtype(md.seq_lens, DType::kI32, op, "md.seq_lens");
  cuda_check::dtype(md.block_tables, DType::kI32, op, "md.block_tables");
  SPECULA_CHECK(md.query_start_loc.numel() >= num_seqs + 1 && md.seq_lens.numel() >= num_seqs,
                "paged_attention: md.query_start_loc {} / md.seq_lens {} are shorter than {} sequences",
                md.query_start_loc.describe(), md.seq_lens.describe(), num_seqs);
  SPECULA_CHECK(md.block_tables.ndim() == 2 && md.block_tables.size(0) >= num_seqs,
                "paged_attention: md.block_tables {} must be [num_seqs = {}, max_blocks]", md.block_tables.describe(),
                num_seqs);
  const int64_t max_blocks = md.block_tables.size(1);
  int64_t max_query_len = 0, max_seq_len = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t query_len = qsl[s + 1] - qsl[s], seq_len = seq_lens[s];
    SPECULA_CHECK(query_len >= 0 && query_len <= seq_len,
                  "paged_attention: sequence {} has {} query rows but only {} tokens", s, query_len, seq_len);
    SPECULA_CHECK((seq_len + block_size - 1) / block_size <= max_blocks,
                  "paged_attention: sequence {} needs {} blocks, block_tables has {} columns", s,
                  (seq_len + block_size - 1) / block_size, max_blocks);
    max_query_len = std::max(max_query_len, query_len);
    max_seq_len = std::max(max_seq_len, seq_len);
  }
  if (max_query_len == 0) return;

  cuda::PagedAttentionParams p;
  p.q = q.data();
  p.k_cache = cache.k.data();
  p.v_cache = mla ? nullptr : cache.v.data();
  p.out = out.data();
  p.query_start_loc = md.query_start_loc.data_as<int32_t>();
  p.seq_lens = md.seq_lens.data_as<int32_t>();
  p.block_tables = md.block_tables.data_as<int32_t>();
  p.num_seqs = static_cast<int>(num_seqs);
  p.max_blocks_per_seq = static_cast<int>(max_blocks);
  p.block_size = static_cast<int>(block_size);
  p.num_q_heads = static_cast<int>(hq);
  p.num_kv_heads = static_cast<int>(hk);
  p.head_dim = static_cast<int>(d);
  p.v_head_dim = static_cast<int>(dv);
  p.scale = scale;
  p.cache_fp8 = fp8;
  p.k_scale = fp8 ? cache.k_scale : 1.0f;
  p.v_scale = fp8 ? cache.v_scale : 1.0f;
  p.max_query_len = static_cast<int>(max_query_len);
  p.max_seq_len = static_cast<int>(max_seq_len);
  p.num_query_rows = qsl[num_seqs];
  p.sm_count = sm_count_;
  p.metadata_before_wait = attention_metadata_before_wait();

  if (mla) {
    const int splits = cuda::mla_num_splits(p, sm_count_);
    Tensor partial_out, partial_stats;
    if (splits > 1) {
      partial_out = scratch({p.num_query_rows, hq, splits, dv}, DType::kF32);
      partial_stats = scratch({p.num_query_rows, hq, splits, 2}, DType::kF32);
    }
    check_cuda(cuda::launch_mla_attention(p, splits, splits > 1 ? partial_out.data_as<float>() : nullptr,
                                          splits > 1 ? partial_stats.data_as<float>() : nullptr, stream_),
               "paged_attention (MLA)");
    return;
  }

  // Single-row batches always take the split-KV kernel. Short multi-row batches (verification)
  // take it while the flash kernel, which does not split keys, would have too few blocks to fill
  // the GPU (the common small-batch speculative case; measured on H100: batch 16 x 4 rows x 1024
  // keys with 8 kv heads, i.e. 128 flash blocks, ran 0.10 ms in the flash kernel and 0.16 ms
  // split), and the flash kernel otherwise.
  const int64_t flash_blocks = num_seqs * hk * ((max_query_len * (hq / hk) + 127) / 128);
  const bool split_kv = max_query_len == 1 ||
                        (max_query_len <= cuda::kMaxDecodeQueryLen && 2 * flash_blocks < sm_count_);
  if (split_kv) {
    // Splits merge inside the launch when they fit a cluster; more (long contexts with few
    // (sequence, head) pairs) keep their number and the merge kernel: cutting 32 splits of 4096
    // keys at batch 1 to 16 took 22 us a layer on the H100 against 15 us with the merge kernel.
    const int splits = cuda::decode_num_splits(p, sm_count_);
    const bool merge_in_cluster = splits > 1 && splits <= decode_cluster_splits_;
    Tensor partial_out, partial_stats;
    if (splits > 1 && !merge_in_cluster) {
      partial_out = scratch({p.num_query_rows, hq, splits, dv}, DType::kF32);
      partial_stats = scratch({p.num_query_rows, hq, splits, 2}, DType::kF32);
    }
    check_cuda(cuda::launch_decode_attention(p, splits, partial_out.defined() ? partial_out.data_as<float>() : nullptr,
                                             partial_stats.defined() ? partial_stats.data_as<float>() : nullptr,
                                             stream_),
               "paged_attention (decode)");
  } else {
    check_cuda(cuda::launch_prefill_attention(p, stream_), "paged_attention (prefill)");
  }
}

void CudaBackend::set_decode_cluster_splits(int splits) {
  SPECULA_CHECK(splits >= 0 && splits <= cuda::kMaxClusterSplits,
                "set_decode_cluster_splits: {} is outside 0..{}", splits, cuda::kMaxClusterSplits);
  decode_cluster_splits_ = splits;
}

}  // namespace specula
