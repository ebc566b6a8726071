// The eagle and eagle3 methods: an EAGLE head (model/eagle_head.h) drafts from the target's own
// hidden states: EAGLE-1 from its final hidden state, EAGLE-3 from the features of three of its
// layers (the target returns them in every forward once the head is loaded). The pipeline
// (catch-up of every position the target computed, chained draft steps from the head's own
// hidden state, graphs, greedy chain, q store) is ModelProposer's hidden-state shape, as MTP's;
// this file says only how the head runs.
//
// The head's row at position p reads the target's features of p and token p + 1; draft 1 of a
// request with tokens t_0..t_{L-1} is its prediction at p = L - 2, draft j > 1 the row at
// L - 3 + j reading the previous step's prenorm output and draft j - 1 (as vLLM chains them).
// Its KV cache (one layer) sits on the target's block tables; entries of positions the request
// never ran (prefix-cache hits, steps shed under load) are inherited, as MTP's are.
#pragma once

#include <memory>
#include <string_view>

#include "model/eagle_head.h"
#include "spec_decode/model_proposer.h"

namespace specula {

class EagleProposer : public ModelProposer {
 public:
  EagleProposer(std::unique_ptr<EagleHead> head, Backend& backend, std::unique_ptr<DraftSampler> sampler,
                const ModelProposerConfig& config);

  std::string_view method() const override {
    return head_->config().version == EagleVersion::kEagle3 ? "eagle3" : "eagle";
  }
  KVCacheSpec kv_cache_spec() const override { return head_->kv_cache_spec(); }
  EagleHead& head() { return *head_; }

 private:
  const Tensor& target_features(const ProposeBatch& batch) const override;
  DraftForwardOutput draft_forward(DraftForwardInput& in) override;
  DraftChain::FusedChain fused_chain() override;

  std::unique_ptr<EagleHead> head_;
};

struct ProposerContext;
// Loads the head named by --speculative-config ("model") for method eagle or eagle3, checks it
// against the target and makes the target return the head's features.
std::unique_ptr<Proposer> make_eagle_proposer(const ProposerContext& ctx);

}  // namespace specula
