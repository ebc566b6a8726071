// CPU backend: the paged KV cache (write) and causal GQA attention over it.
//
// Cache layout per layer: K and V are [num_blocks, block_size, num_kv_heads, head_dim]; a token at
// position j of sequence s lives in block block_tables[s, j / block_size], slot j % block_size.
// See backend/attention_metadata.h for how query rows map to sequences and positions.
//
// MLA form (cache.v undefined or empty): each K entry is DeepSeek's [latent | roped key] and the
// value of a key is the first Dv dims of its own K entry, so V is read from the K cache with K's
// row stride; nothing is stored twice.
//
// An F8_E4M3 cache (--kv-cache-dtype fp8) holds K / k_scale and V / v_scale: rows are rounded
// once on the way in and widened (times the scale) row by row on the way out.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace specula {
namespace {

bool mla_form(const KVCacheLayer& cache) { return !cache.v.defined() || cache.v.numel() == 0; }

void check_cache_dtype(const Tensor& cache, const char* op, const char* param) {
  SPECULA_CHECK(cache.is_cpu() && (cache.dtype() == DType::kF32 || cache.dtype() == DType::kF8E4M3),
                "{}: {} {} must be F32 or F8_E4M3 on cpu", op, param, cache.describe());
}

// Every e4m3 byte's value, so that widening a row is a table lookup a element.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// Rows of one cache tensor as fp32: an F32 cache is read in place, an F8_E4M3 one widened into
// the caller's buffer.
class CacheRows {
 public:
  CacheRows(const Tensor& cache, float scale)
      : f32_(cache.dtype() == DType::kF32 ? cache.data_as<float>() : nullptr),
        fp8_(cache.dtype() == DType::kF8E4M3 ? cache.data_as<uint8_t>() : nullptr),
        scale_(scale) {}
  // n floats from element `offset` of the cache.
  const float* row(int64_t offset, int64_t n, float* buffer) const {
    if (f32_ != nullptr) return f32_ + offset;
    const std::array<float, 256>& values = e4m3_values();
    for (int64_t i = 0; i < n; ++i) buffer[i] = values[fp8_[offset + i]] * scale_;
    return buffer;
  }

 private:
  const float* f32_;
  const uint8_t* fp8_;
  float scale_;
};

}  // namespace

void CpuBackend::write_kv_cache(const Tensor& k, const Tensor& v, KVCacheLayer& cache, const Tensor& slot_mapping) {
  const bool mla = mla_form(cache);
  cpu_check::f32(k, "write_kv_cache", "k");
  check_cache_dtype(cache.k, "write_kv_cache", "cache.k");
  cpu_check::index_vector(slot_mapping, DType::kI64, "write_kv_cache", "slot_mapping");
  SPECULA_CHECK(cache.k.ndim() == 4, "write_kv_cache: cache.k {} must be [num_blocks, block_size, Hk, D]",
                cache.k.describe());
  if (!mla) {
    cpu_check::f32(v, "write_kv_cache", "v");
    SPECULA_CHECK(cache.v.dtype() == cache.k.dtype(), "write_kv_cache: cache.k {} and cache.v {} differ in dtype",
                  cache.k.describe(), cache.v.describe());
    SPECULA_CHECK(cache.v.ndim() == 4 && cache.k.size(0) == cache.v.size(0) && cache.k.size(1) == cache.v.size(1) &&
                      cache.k.size(2) == cache.v.size(2),
                  "write_kv_cache: cache.k {} and cache.v {} must be [num_blocks, block_size, Hk, D]",
                  cache.k.describe(), cache.v.describe());
  }
  const int64_t num_slots = cache.k.size(0) * cache.k.size(1);
  const int64_t k_row = cache.k.size(2) * cache.k.size(3), v_row = mla ? 0 : cache.v.size(2) * cache.v.size(3);
  SPECULA_CHECK(k.ndim() >= 1 && (mla || (v.ndim() >= 1 && k.size(0) == v.size(0))),
                "write_kv_cache: k {} and v {} differ in rows", k.describe(), v.describe());
  const int64_t t = k.size(0);
  SPECULA_CHECK(k.numel() == t * k_row && (mla || v.numel() == t * v_row),
                "write_kv_cache: k {} / v {} rows must match the cache's [Hk, D] ({} / {})", k.describe(),
                v.describe(), cache.k.describe(), cache.v.describe());
  SPECULA_CHECK(slot_mapping.size(0) >= t, "write_kv_cache: slot_mapping {} has fewer than {} rows",
                slot_mapping.describe(), t);
  const int64_t* slots = slot_mapping.data_as<int64_t>();
  for (int64_t i = 0; i < t; ++i) {
    SPECULA_CHECK(slots[i] >= -1 && slots[i] < num_slots,
                  "write_kv_cache: slot {} at row {} is outside the cache's {} slots", slots[i], i, num_slots);
  }
  const float* kp = k.data_as<float>();
  const float* vp = mla ? nullptr : v.data_as<float>();
  if (cache.k.dtype() == DType::kF8E4M3) {
    SPECULA_CHECK(cache.k_scale > 0.0f && cache.v_scale > 0.0f,
                  "write_kv_cache: the fp8 cache's scales must be positive (k {}, v {})", cache.k_scale,
                  cache.v_scale);
    uint8_t* ck = cache.k.data_as<uint8_t>();
    uint8_t* cv = mla ? nullptr : cache.v.data_as<uint8_t>();
    const float inv_k = 1.0f / cache.k_scale, inv_v = 1.0f / cache.v_scale;
    for (int64_t i = 0; i < t; ++i) {
      if (slots[i] < 0) continue;
      for (int64_t c = 0; c < k_row; ++c) ck[slots[i] * k_row + c] = f32_to_f8e4m3(kp[i * k_row + c] * inv_k);
      for (int64_t c = 0; c < v_row; ++c) cv[slots[i] * v_row + c] = f32_to_f8e4m3(vp[i * v_row + c] * inv_v);
    }
    return;
  }
  float* ck = cache.k.data_as<float>();
  float* cv = mla ? nullptr : cache.v.data_as<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (t * (k_row + v_row) > 65536)
  for (int64_t i = 0; i < t; ++i) {
    if (slots[i] < 0) continue;  // padding, or a token whose K/V is not kept
    std::memcpy(ck + slots[i] * k_row, kp + i * k_row, k_row * sizeof(float));
    if (!mla) std::memcpy(cv + slots[i] * v_row, vp + i * v_row, v_row * sizeof(float));
  }
}

void CpuBackend::paged_attention(const Tensor& q, const KVCacheLayer& cache, const AttentionMetadata& md, float scale,
                                 Tensor& out) {
  const bool mla = mla_form(cache);
  cpu_check::f32(q, "paged_attention", "q");
  cpu_check::f32(out, "paged_attention", "out");
  check_cache_dtype(cache.k, "paged_attention", "cache.k");
  SPECULA_CHECK(mla || cache.v.dtype() == cache.k.dtype(), "paged_attention: cache.k {} and cache.v {} differ in dtype",
                cache.k.describe(), cache.v.describe());
  SPECULA_CHECK(q.ndim() == 3 && cache.k.ndim() == 4 && (mla || cache.v.ndim() == 4) && out.ndim() == 3,
                "paged_attention: q {} must be [T, Hq, D], out [T, Hq, Dv] and the cache [num_blocks, block_size, "
                "Hk, D]", q.describe());
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t num_blocks = cache.k.size(0), block_size = cache.k.size(1), hk = cache.k.size(2);
  // MLA: V is the first Dv dims of each K entry (Dv from out); otherwise its own cache.
  const int64_t dv = mla ? out.size(2) : cache.v.size(3);
  SPECULA_CHECK(cache.k.size(3) == d, "paged_attention: cache.k {} does not fit q {}", cache.k.describe(),
                q.describe());
  SPECULA_CHECK(mla ? dv <= d
                    : (cache.v.size(0) == num_blocks && cache.v.size(1) == block_size && cache.v.size(2) == hk),
                "paged_attention: cache.v {} does not fit cache.k {} (MLA form: out {} may have at most D = {} dims)",
                cache.v.describe(), cache.k.describe(), out.describe(), d);
  SPECULA_CHECK(hk > 0 && hq % hk == 0, "paged_attention: {} query heads are not a multiple of {} kv heads", hq, hk);
  SPECULA_CHECK(out.ndim() == 3 && out.size(0) == t && out.size(1) == hq && out.size(2) == dv,
                "paged_attention: out {} must be [{}, {}, {}]", out.describe(), t, hq, dv);
  SPECULA_CHECK(md.block_size == block_size, "paged_attention: metadata block_size {} != cache block size {}",
                md.block_size, block_size);

  // Validate the metadata once, up front (the threaded loop below must not throw).
  const int64_t num_seqs = md.num_seqs;
  const auto& qsl = md.query_start_loc_host;
  const auto& seq_lens = md.seq_lens_host;
  SPECULA_CHECK(static_cast<int64_t>(qsl.size()) == num_seqs + 1 && static_cast<int64_t>(seq_lens.size()) == num_seqs,
                "paged_attention: query_start_loc_host has {} entries and seq_lens_host {} for {} sequences",
                qsl.size(), seq_lens.size(), num_seqs);
  SPECULA_CHECK(num_seqs == 0 || (qsl[0] == 0 && qsl[num_seqs] <= t),
                "paged_attention: query_start_loc must start at 0 and end within the {} rows of q", t);
  const Tensor& bt = md.block_tables;
  SPECULA_CHECK(num_seqs == 0 || (bt.is_cpu() && bt.dtype() == DType::kI32 && bt.ndim() == 2 && bt.size(0) >= num_seqs),
                "paged_attention: block_tables {} must be an I32 [num_seqs, max_blocks] CPU tensor", bt.describe());
  const int64_t max_blocks = num_seqs == 0 ? 0 : bt.size(1);
  const int32_t* tables = num_seqs == 0 ? nullptr : bt.data_as<int32_t>();
  int64_t longest = 0;
  std::vector<int32_t> row_seq(num_seqs == 0 ? 0 : qsl[num_seqs]);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t query_len = qsl[s + 1] - qsl[s], seq_len = seq_lens[s];
    SPECULA_CHECK(query_len >= 0 && query_len <= seq_len,
                  "paged_attention: sequence {} has {} query rows but only {} tokens", s, query_len, seq_len);
    const int64_t blocks = (seq_len + block_size - 1) / block_size;
    SPECULA_CHECK(blocks <= max_blocks, "paged_attention: sequence {} needs {} blocks, block_tables has {} columns", s,
                  blocks, max_blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t id = tables[s * max_blocks + b];
      SPECULA_CHECK(id >= 0 && id < num_blocks, "paged_attention: sequence {} block {} is id {}, outside [0, {})", s,
                    b, id, num_blocks);
    }
    for (int64_t r = qsl[s]; r < qsl[s + 1]; ++r) row_seq[r] = static_cast<int32_t>(s);
    longest = std::max(longest, seq_len);
  }

  const int64_t rows = static_cast<int64_t>(row_seq.size());
  const int64_t group = hq / hk;  // query heads sharing one kv head (GQA)
  const float* qp = q.data_as<float>();
  const CacheRows kc(cache.k, cache.k_scale);
  const CacheRows vc(mla ? cache.k : cache.v, mla ? cache.k_scale : cache.v_scale);
  const int64_t v_stride = mla ? d : dv;  // elements between consecutive heads' V entries
  float* op = out.data_as<float>();

  // One task per (query row, query head): scores over that row's causal prefix, a stable softmax
  // (subtract the max before exp; all fp32), then the probability-weighted sum of V rows.
#pragma omp parallel num_threads(threads_) if (rows * hq * longest * d > 65536)
  {
    std::vector<float> probs(static_cast<size_t>(longest));
    std::vector<float> widened(static_cast<size_t>(std::max(d, dv)));  // an fp8 row as fp32
#pragma omp for schedule(dynamic, 4)
    for (int64_t task = 0; task < rows * hq; ++task) {
      const int64_t row = task / hq, head = task % hq, kv_head = head / group;
      const int64_t s = row_seq[row];
      const int64_t query_len = qsl[s + 1] - qsl[s];
      const int64_t position = seq_lens[s] - query_len + (row - qsl[s]);
      const int64_t num_keys = position + 1;  // causal: keys 0..position
      const int32_t* table = tables + s * max_blocks;
      const float* qv = qp + (row * hq + head) * d;

      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < num_keys; ++j) {
        const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
        const float* kv = kc.row((slot * hk + kv_head) * d, d, widened.data());
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)  // lets the compiler vectorise the sum (reassociating it)
        for (int64_t i = 0; i < d; ++i) dot += qv[i] * kv[i];
        probs[j] = dot * scale;
        max_score = std::max(max_score, probs[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < num_keys; ++j) {
        probs[j] = std::exp(probs[j] - max_score);
        sum += probs[j];
      }
      const float inv_sum = 1.0f / sum;  // sum >= 1: the max term contributes exp(0)

      float* o = op + (row * hq + head) * dv;
      std::memset(o, 0, dv * sizeof(float));
      for (int64_t j = 0; j < num_keys; ++j) {
        const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
        const float* vv = vc.row((slot * hk + kv_head) * v_stride, dv, widened.data());
        const float p = probs[j] * inv_sum;
        for (int64_t i = 0; i < dv; ++i) o[i] += p * vv[i];
      }
    }
  }
}

}  // namespace specula
