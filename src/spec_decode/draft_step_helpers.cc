#include "spec_decode/draft_step_helpers.h"

namespace specula {

void StagedTensor::allocate(Backend& backend, int64_t n, DType type) {
  host = backend.empty_host({n}, type);
  device = backend.empty({n}, type);
}

Tensor StagedTensor::upload(Backend& backend, int64_t n) {
  Tensor dst = device.slice(0, n);
  if (n > 0) backend.copy(host.slice(0, n), dst);
  return dst;
}

int64_t draft_kv_slot(const ProposerRequest& r, int pos, int block_size, std::string_view cache) {
  const size_t block = static_cast<size_t>(pos / block_size);
  SPECULA_CHECK(block < r.block_ids.size(), "internal error: {} position {} of request {} has no block ({} held)",
                cache, pos, r.req_id, r.block_ids.size());
  return static_cast<int64_t>(r.block_ids[block]) * block_size + pos % block_size;
}

SamplingRow draft_sampling_row(const ProposerRequest& r, int logits_row, int position,
                               const std::vector<int32_t>& context) {
  SamplingRow row;
  row.logits_row = logits_row;
  row.params = r.params;
  row.seed = r.seed;
  row.position = position;
  row.prompt_token_ids = std::span<const int32_t>(context.data(), static_cast<size_t>(r.num_prompt_tokens));
  row.output_token_ids = std::span<const int32_t>(context.data() + r.num_prompt_tokens,
                                                  static_cast<size_t>(position - r.num_prompt_tokens));
  if (position - r.num_prompt_tokens < r.params->min_tokens) row.masked_token_ids = r.min_tokens_stop_ids;
  return row;
}

std::vector<KVCacheLayer> allocate_draft_kv_cache(Backend& backend, const KVCacheSpec& spec, int num_blocks,
                                                  int block_size) {
  const DType dtype = backend.compute_dtype();
  std::vector<KVCacheLayer> kv(static_cast<size_t>(spec.num_layers));
  for (KVCacheLayer& layer : kv) {
    layer.k = backend.empty({num_blocks, block_size, spec.num_kv_heads, spec.head_dim}, dtype);
    layer.v = backend.empty({num_blocks, block_size, spec.num_kv_heads, spec.v_head_dim}, dtype);
    if (backend.device() != Device::kCPU) {
      backend.zero(layer.k);
      if (layer.v.numel() > 0) backend.zero(layer.v);  // MLA caches have no V
    }
  }
  return kv;
}

}  // namespace specula
