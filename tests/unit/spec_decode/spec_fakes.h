// Fakes for speculative-decoding tests: a model whose logits are any function of the WHOLE
// context, which it reads back from its paged KV cache (token id in K, position in V, as the
// engine's FakeModel does). As a draft model it therefore checks the draft's own KV management:
// a wrong block table, slot or catch-up changes its drafts or trips its consistency check.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "unit/engine/engine_fakes.h"

namespace specula::testing {

class ContextModel : public Model {
 public:
  using LogitsFn = std::function<std::vector<float>(const std::vector<int32_t>& context)>;

  ContextModel(int64_t vocab, LogitsFn logits) : logits_(std::move(logits)) {
    config_.vocab_size = vocab;
    config_.num_hidden_layers = 1;
    config_.max_position_embeddings = 4096;
  }

  const ModelConfig& config() const override { return config_; }
  KVCacheSpec kv_cache_spec() const override { return {1, 1, 1, 1}; }

  ForwardOutput forward(const ForwardInput& in, std::vector<KVCacheLayer>& kv) override {
    ++num_forwards;
    num_tokens += in.token_ids.size(0);
    const auto tokens = in.token_ids.to_i32_vector();
    const auto positions = in.positions.to_i32_vector();
    const int64_t* slots = in.attn.slot_mapping.data_as<int64_t>();
    float* k = kv[0].k.data_as<float>();
    float* v = kv[0].v.data_as<float>();
    for (size_t t = 0; t < tokens.size(); ++t) {
      if (slots[t] < 0) continue;
      k[slots[t]] = static_cast<float>(tokens[t]);
      v[slots[t]] = static_cast<float>(positions[t]);
    }
    const auto& qsl = in.attn.query_start_loc_host;
    const auto& seq_lens = in.attn.seq_lens_host;
    const int bs = in.attn.block_size;
    const int64_t width = in.attn.block_tables.size(1);
    const int32_t* tables = in.attn.block_tables.data_as<int32_t>();
    const auto rows = in.logits_indices.to_i32_vector();
    Tensor logits = Tensor::empty({static_cast<int64_t>(rows.size()), config_.vocab_size}, DType::kF32);
    for (size_t i = 0; i < rows.size(); ++i) {
      int s = 0;
      while (!(rows[i] >= qsl[s] && rows[i] < qsl[s + 1])) ++s;
      const int pos = seq_lens[s] - (qsl[s + 1] - qsl[s]) + (rows[i] - qsl[s]);
      SPECULA_CHECK(positions[rows[i]] == pos, "context model: row {} has position {}, metadata says {}", rows[i],
                    positions[rows[i]], pos);
      std::vector<int32_t> ctx;
      for (int p = 0; p <= pos; ++p) {
        SPECULA_CHECK(p / bs < width, "context model: block table too narrow");
        const int64_t slot = static_cast<int64_t>(tables[s * width + p / bs]) * bs + p % bs;
        SPECULA_CHECK(v[slot] == static_cast<float>(p), "context model: KV slot {} holds position {}, expected {}",
                      slot, v[slot], p);
        ctx.push_back(static_cast<int32_t>(k[slot]));
      }
      std::vector<float> l = logits_(ctx);
      std::memcpy(logits.data_as<float>() + i * config_.vocab_size, l.data(), l.size() * sizeof(float));
    }
    ForwardOutput out;
    out.logits = logits;
    return out;
  }

  int num_forwards = 0;
  int64_t num_tokens = 0;

 private:
  ModelConfig config_;
  LogitsFn logits_;
};

// A draft for FakeModel `target`: its logits, except after a fraction `noise` of contexts (chosen
// by hashing the context) where one token gets a large boost, so that the greedy draft is wrong
// there and its distribution differs.
inline ContextModel::LogitsFn noisy_logits(const FakeModel& target, double noise, uint64_t salt = 1) {
  return [&target, noise, salt](const std::vector<int32_t>& ctx) {
    std::vector<float> l = target.logits_for(ctx);
    const uint64_t h = mix64(FakeModel::context_hash(ctx) ^ salt);
    if (static_cast<double>(h >> 11) * 0x1.0p-53 < noise) l[(h >> 7) % (l.size() - 2)] += 12.0f;
    return l;
  };
}

}  // namespace specula::testing
