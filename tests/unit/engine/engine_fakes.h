// Fakes for engine tests: a tokenizer over a tiny hand-made vocabulary, a speculator that is
// always idle, and a model whose logits
// are a deterministic function of the WHOLE context, which it reads back from the paged KV cache
// (it stores each token id in K and its position in V). A wrong block table, slot mapping or
// prefix-cache hit therefore changes its output or trips its consistency check, and its greedy
// continuation can be computed directly (reference_greedy) to compare the engine against.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/speculator.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace specula::testing {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---- tokenizer ---------------------------------------------------------------------------
// ids 0..25 "a".."z", 26..35 "0".."9", 36 " ", 37 "ab", 38 "cd", 39 "xyz", 40 "\xc3" and 41 "\xa9"
// (the two bytes of "é"), 42 "STOP", 43 "ST", 44 "OP", 45..61 "w45".."w61", 62 "<eos>" (special),
// 63 "<bos>" (special); ids from 64 up to `vocab` are "w64", "w65", ...
class FakeTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kEos = 62;
  static constexpr int32_t kBos = 63;
  static constexpr int64_t kVocab = 64;

  explicit FakeTokenizer(int64_t vocab = kVocab) {
    for (int i = 0; i < 26; ++i) pieces_.push_back(std::string(1, static_cast<char>('a' + i)));
    for (int i = 0; i < 10; ++i) pieces_.push_back(std::string(1, static_cast<char>('0' + i)));
    for (const char* s : {" ", "ab", "cd", "xyz", "\xc3", "\xa9", "STOP", "ST", "OP"}) pieces_.push_back(s);
    for (int i = 45; i < 62; ++i) pieces_.push_back("w" + std::to_string(i));
    pieces_.push_back("<eos>");
    pieces_.push_back("<bos>");
    for (int64_t i = kVocab; i < vocab; ++i) pieces_.push_back("w" + std::to_string(i));
  }
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const override {
    std::vector<int32_t> ids;
    for (char c : text) {
      auto id = token_to_id(std::string_view(&c, 1));
      SPECULA_CHECK(id.has_value(), "fake tokenizer: no token for '{}'", c);
      ids.push_back(*id);
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const override {
    std::string s;
    for (int32_t id : ids)
      if (!(skip_special_tokens && is_special(id))) s += pieces_.at(static_cast<size_t>(id));
    return s;
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    for (size_t i = 0; i < pieces_.size(); ++i)
      if (pieces_[i] == token) return static_cast<int32_t>(i);
    return std::nullopt;
  }
  std::string id_to_token(int32_t id) const override { return pieces_.at(static_cast<size_t>(id)); }
  std::string token_bytes(int32_t id) const override {
    if (on_token_bytes) on_token_bytes(id);  // (a test's way to make detokenizing throw)
    return pieces_.at(static_cast<size_t>(id));
  }
  bool is_special(int32_t id) const override { return id == kEos || id == kBos; }
  std::optional<int32_t> bos_token_id() const override { return kBos; }
  std::optional<int32_t> eos_token_id() const override { return kEos; }
  std::string bos_token() const override { return "<bos>"; }
  std::string eos_token() const override { return "<eos>"; }
  bool add_bos_token() const override { return false; }
  const std::string& chat_template() const override { return empty_; }

  std::function<void(int32_t)> on_token_bytes;

 private:
  std::vector<std::string> pieces_;
  std::string empty_;
};

// ---- model -------------------------------------------------------------------------------
// Logits of the token after context c[0..p]: value(v) = uniform(-4, 4) keyed on (hash(c), v),
// plus `eos_bias` on the eos id (negative: eos is rare, so sequences run to max_tokens).
class FakeModel : public Model {
 public:
  explicit FakeModel(Backend& backend, int64_t vocab = FakeTokenizer::kVocab, float eos_bias = -100.0f)
      : backend_(backend), eos_bias_(eos_bias) {
    config_.vocab_size = vocab;
    config_.num_hidden_layers = 1;
    config_.max_position_embeddings = 4096;
  }

  static uint64_t context_hash(const std::vector<int32_t>& ctx) {
    uint64_t h = 0x1234;
    for (int32_t t : ctx) h = mix64(h * 31 + static_cast<uint64_t>(t) + 1);
    return h;
  }
  std::vector<float> logits_for(const std::vector<int32_t>& ctx) const {
    const uint64_t h = context_hash(ctx);
    std::vector<float> out(static_cast<size_t>(config_.vocab_size));
    for (int64_t v = 0; v < config_.vocab_size; ++v)
      out[v] = static_cast<float>(mix64(h ^ (static_cast<uint64_t>(v) * 0x9e37ull)) >> 11) * 0x1.0p-53f * 8.0f - 4.0f;
    if (FakeTokenizer::kEos < config_.vocab_size) out[FakeTokenizer::kEos] += eos_bias_;
    return out;
  }
  // Greedy continuation computed without the engine.
  std::vector<int32_t> reference_greedy(std::vector<int32_t> ctx, int max_tokens) const {
    std::vector<int32_t> out;
    for (int i = 0; i < max_tokens; ++i) {
      std::vector<float> l = logits_for(ctx);
      int32_t best = 0;
      for (int32_t v = 1; v < static_cast<int32_t>(l.size()); ++v)
        if (l[v] > l[best]) best = v;
      out.push_back(best);
      ctx.push_back(best);
    }
    return out;
  }

  const ModelConfig& config() const override { return config_; }
  KVCacheSpec kv_cache_spec() const override { return {1, 1, 1, 1}; }

  ForwardOutput forward(const ForwardInput& in, std::vector<KVCacheLayer>& kv) override {
    ++num_forwards;
    if (fail_on_forward && fail_on_forward(num_forwards)) throw Error("fake model: injected failure");
    const auto tokens = in.token_ids.to_i32_vector();
    const auto positions = in.positions.to_i32_vector();
    const int64_t* slots = in.attn.slot_mapping.data_as<int64_t>();
    float* k = kv[0].k.data_as<float>();
    float* v = kv[0].v.data_as<float>();
    const int bs = in.attn.block_size;
    for (size_t t = 0; t < tokens.size(); ++t) {
      if (slots[t] < 0) continue;
      k[slots[t]] = static_cast<float>(tokens[t]);
      v[slots[t]] = static_cast<float>(positions[t]);
    }
    const auto qsl = in.attn.query_start_loc_host;
    const auto seq_lens = in.attn.seq_lens_host;
    const int64_t width = in.attn.block_tables.size(1);
    const int32_t* tables = in.attn.block_tables.data_as<int32_t>();
    const auto rows = in.logits_indices.to_i32_vector();
    Tensor logits = Tensor::empty({static_cast<int64_t>(rows.size()), config_.vocab_size}, DType::kF32);
    for (size_t i = 0; i < rows.size(); ++i) {
      int s = 0;
      while (!(rows[i] >= qsl[s] && rows[i] < qsl[s + 1])) ++s;
      const int query_len = qsl[s + 1] - qsl[s];
      const int pos = seq_lens[s] - query_len + (rows[i] - qsl[s]);
      SPECULA_CHECK(positions[rows[i]] == pos, "fake model: row {} has position {}, metadata says {}", rows[i],
                    positions[rows[i]], pos);
      std::vector<int32_t> ctx;
      for (int p = 0; p <= pos; ++p) {
        SPECULA_CHECK(p / bs < width, "fake model: block table too narrow");
        const int64_t slot = static_cast<int64_t>(tables[s * width + p / bs]) * bs + p % bs;
        SPECULA_CHECK(v[slot] == static_cast<float>(p), "fake model: KV cache slot {} holds position {}, expected {}",
                      slot, v[slot], p);
        ctx.push_back(static_cast<int32_t>(k[slot]));
      }
      std::vector<float> l = logits_for(ctx);
      std::memcpy(logits.data_as<float>() + i * config_.vocab_size, l.data(), l.size() * sizeof(float));
    }
    ForwardOutput out;
    out.logits = logits;
    return out;
  }

  int num_forwards = 0;
  // Called with the forward's number before it runs: throws when it returns true (and may sleep).
  std::function<bool(int)> fail_on_forward;

 private:
  Backend& backend_;
  ModelConfig config_;
  float eos_bias_;
};

// ---- speculator --------------------------------------------------------------------------
// A speculator whose adaptive depth is idle throughout (depth 0, nothing for its proposer to see):
// every decode step is skipped before its forward, so it runs as a plain step. It counts what the
// runner asked of it; `odd_calls` counts calls no idle step should make (a multi-row target step,
// a negative time, a skip asked for no decoding request).
class IdleSpeculator : public Speculator {
 public:
  int num_speculative_tokens() const override { return 2; }
  bool adaptive() const override { return true; }
  std::string describe() const override { return "idle"; }
  void drop_request(std::string_view) override {}
  const Tensor* draft_probs() const override { return nullptr; }
  int draft_probs_row(std::string_view) const override { return -1; }
  void record_verification(std::string_view, int, int) override { ++verifications; }
  void record_target_step(int, int rows, double seconds) override {
    ++target_steps;
    odd_calls += rows != 1 || seconds < 0.0 ? 1 : 0;
  }
  bool skip_step(int num_decoding, bool) override {
    ++skipped;
    odd_calls += num_decoding <= 0 ? 1 : 0;
    return true;
  }
  int propose(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override {
    for (const ProposerRequest& r : batch.requests) decoding_proposals += r.sampled ? 1 : 0;
    drafts.assign(batch.requests.size(), {});
    return 0;
  }
  int skipped = 0, verifications = 0, decoding_proposals = 0, target_steps = 0, odd_calls = 0;
};

}  // namespace specula::testing
