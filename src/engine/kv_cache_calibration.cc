#include "engine/kv_cache_calibration.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"

namespace specula {
namespace {

Tensor upload(Backend& backend, const Tensor& host) {
  Tensor t = backend.empty(host.shape(), host.dtype());
  backend.copy(host, t);
  return t;
}

// max |x| over a cache tensor's first `elements` elements (the calibration batch's slots).
float amax(Backend& backend, const Tensor& cache, int64_t elements) {
  if (elements == 0) return 0.0f;
  Tensor flat = cache.reshape({cache.numel()}).slice(0, elements);
  Tensor host = Tensor::empty({elements}, cache.dtype(), Device::kCPU);
  backend.copy(flat, host);
  backend.synchronize();
  float m = 0.0f;
  for (float x : host.to_f32_vector()) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

std::vector<int32_t> calibration_tokens(int64_t vocab_size, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab_size - 1));
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int32_t& id : ids) id = token(rng);
  return ids;
}

std::vector<KVCacheScales> calibrate_kv_cache_scales(Model& model, Backend& backend,
                                                     const std::vector<int32_t>& token_ids, int block_size) {
  const int num_tokens = static_cast<int>(token_ids.size());
  SPECULA_CHECK(num_tokens > 0 && block_size > 0, "KV cache calibration: {} tokens in blocks of {}", num_tokens,
                block_size);
  const KVCacheSpec spec = model.kv_cache_spec();
  const int64_t blocks = (num_tokens + block_size - 1) / block_size;
  const DType dt = backend.compute_dtype();
  std::vector<KVCacheLayer> kv(static_cast<size_t>(spec.num_layers));
  for (KVCacheLayer& layer : kv) {
    layer.k = backend.empty({blocks, block_size, spec.num_kv_heads, spec.head_dim}, dt);
    layer.v = backend.empty({blocks, block_size, spec.num_kv_heads, spec.v_head_dim}, dt);
  }

  // One sequence in slots 0..num_tokens-1 (blocks 0, 1, ... in order).
  std::vector<int32_t> positions(token_ids.size()), table(static_cast<size_t>(blocks));
  std::vector<int64_t> slots(token_ids.size());
  for (int i = 0; i < num_tokens; ++i) {
    positions[i] = i;
    slots[i] = i;
  }
  for (int64_t b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  ForwardInput in;
  in.token_ids = upload(backend, Tensor::from_i32(token_ids));
  in.positions = upload(backend, Tensor::from_i32(positions));
  in.logits_indices = upload(backend, Tensor::from_i32({num_tokens - 1}));
  AttentionMetadata& md = in.attn;
  md.num_seqs = 1;
  md.num_tokens = num_tokens;
  md.max_query_len = num_tokens;
  md.max_seq_len = num_tokens;
  md.block_size = block_size;
  md.query_start_loc = upload(backend, Tensor::from_i32({0, num_tokens}));
  md.seq_lens = upload(backend, Tensor::from_i32({num_tokens}));
  md.block_tables = upload(backend, Tensor::from_i32(table, {1, blocks}));
  md.slot_mapping = upload(backend, Tensor::from_i64(slots));
  md.query_start_loc_host = {0, num_tokens};
  md.seq_lens_host = {num_tokens};
  backend.reset_scratch();
  model.forward(in, kv);
  backend.reset_scratch();

  std::vector<KVCacheScales> scales;
  for (const KVCacheLayer& layer : kv) {
    const float k = amax(backend, layer.k, static_cast<int64_t>(num_tokens) * spec.num_kv_heads * spec.head_dim);
    const float v = amax(backend, layer.v, static_cast<int64_t>(num_tokens) * spec.num_kv_heads * spec.v_head_dim);
    SPECULA_CHECK(std::isfinite(k) && std::isfinite(v),
                  "--calculate-kv-scales: the calibration batch gave layer {} a largest |K| of {} and |V| of {}",
                  scales.size(), k, v);
    // A layer whose K or V are all zero keeps 1.0 (nothing to scale).
    scales.push_back({k > 0.0f ? k / kKScaleConstant : 1.0f, v > 0.0f ? v / kVScaleConstant : 1.0f});
  }
  return scales;
}

}  // namespace specula
