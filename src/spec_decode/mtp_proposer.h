// The mtp method (alias deepseek_mtp): DeepSeek-V3's MTP layer(s) (model/deepseek_mtp.h) draft
// from the target's own final hidden states. The pipeline (catch-up, chained draft steps, graphs,
// greedy chain, q store) is ModelProposer's, in its hidden-state shape; this file says which
// positions an MTP layer runs and how.
//
// The MTP layer at position i reads h_i (the target's hidden state) and t_{i+1}; draft 1 of a
// request with tokens t_0..t_{L-1} is its prediction at i = L - 2. Draft j > 1 chains: the layer
// min(j - 1, layers - 1) runs at position L - 3 + j on its own previous output y (in place of h)
// and draft j - 1, as vLLM does; with one layer (DeepSeek-V3, specula-tiny-moe) only the first
// draft is what it was trained for. A row at position 0 has its embedding zeroed.
//
// KV cache: each MTP layer has its own latent cache on the target's blocks and block tables (the
// one KVCacheManager allocates and frees both). Its entries must come from real hidden states, and
// those exist only in the step that computed them, so propose() consumes every step, prefill
// chunks included (no logits then, only the cache), except decode steps of depth 0 (load
// shedding: the adaptive depth turned speculation off because the batch is large; the positions
// skipped then are "inherited" like a prefix-cache hit's, below):
//   - after each step the MTP cache is valid for exactly the positions whose target K/V is valid
//     (< num_target_computed): the rows of the step whose inputs the target accepted, each with
//     its next token (for a prefill chunk, the next prompt token; for the last accepted position,
//     the token just sampled);
//   - draft steps 2..k write entries at positions L - 1 .. L + k - 3 from y, not from h: they
//     never count as computed, and the next step overwrites them with the real ones (whatever was
//     accepted), so rejection needs no bookkeeping;
//   - a prefix-cache hit (also a preempted request coming back) starts at the first position the
//     target computes: the earlier hidden states were never produced for this request. The MTP
//     entries of those positions are then the ones already in the shared blocks, written by the
//     request that computed the blocks (the MTP consumed its every step). They equal this
//     request's own except at the last cached position, whose entry read the token after it in
//     THAT request. Acceptance may move by a hair there; the output cannot (verification is
//     lossless for any draft and q).
// The catch-up therefore runs every step's new positions exactly once: one varlen forward, or, in
// steady-state decode (pieces of 1..1+k positions, none at position 0), the padded layout of a
// catch-up graph (model_proposer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "model/deepseek_mtp.h"
#include "spec_decode/model_proposer.h"

namespace specula {

struct MtpProposerConfig : ModelProposerConfig {
  MtpProposerConfig() { relative_step_cost = 0.1; }
};

class MtpProposer : public ModelProposer {
 public:
  MtpProposer(std::unique_ptr<DeepseekMtp> mtp, Backend& backend, std::unique_ptr<DraftSampler> sampler,
              const MtpProposerConfig& config);

  std::string_view method() const override { return "mtp"; }
  KVCacheSpec kv_cache_spec() const override { return mtp_->kv_cache_spec(); }
  // On the H100 the MTP layer's drafts after a shed stretch were back to within 1 of 16 of the
  // always-fed ones from the 8th fed step (docs/PERFORMANCE.md): 12 with a margin.
  int steps_to_recover() const override { return 12; }

  DeepseekMtp& mtp() { return *mtp_; }

 private:
  // plan_catch_up: the base's (every position the target computed, each once).
  DraftForwardOutput draft_forward(DraftForwardInput& in) override;
  int step_variant(int draft) const override { return layer_for_draft(draft); }

  int layer_for_draft(int j) const { return std::min(j - 1, mtp_->num_layers() - 1); }

  std::unique_ptr<DeepseekMtp> mtp_;
};

struct ProposerContext;
// Loads the target checkpoint's MTP layers (speculative_config.h: the target must have some).
std::unique_ptr<Proposer> make_mtp_proposer(const ProposerContext& ctx);

}  // namespace specula
