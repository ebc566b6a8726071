#include "spec_decode/eagle_proposer.h"

#include "core/error.h"

namespace specula {

EagleProposer::EagleProposer(std::unique_ptr<EagleHead> head, Backend& backend, std::unique_ptr<DraftSampler> sampler,
                             const ModelProposerConfig& config)
    : ModelProposer(backend, std::move(sampler), config, head ? head->config().layer.vocab_size : 0,
                    head ? head->config().feature_size() : 0, head ? head->hidden_size() : 0),
      head_(std::move(head)) {
  SPECULA_CHECK(head_ != nullptr, "eagle proposer: no head");
}

const Tensor& EagleProposer::target_features(const ProposeBatch& batch) const {
  return head_->config().version == EagleVersion::kEagle3 ? batch.target_aux_hidden_states : batch.target_hidden_states;
}

ModelProposer::DraftForwardOutput EagleProposer::draft_forward(DraftForwardInput& in) {
  // The same arena offsets at the warm-up, the capture and eager runs of a graph's work.
  backend_.reset_scratch();
  EagleForwardInput e;
  e.rows = in.rows;
  e.hidden = in.hidden;
  e.from_target = in.from_target;
  EagleForwardOutput out = head_->forward(e, kv_[0]);
  return DraftForwardOutput{out.logits, out.prenorm};
}

DraftChain::FusedChain EagleProposer::fused_chain() {
  return [this](DecoderChain& chain) {
    chain.kv = &kv_;
    chain.first_hidden = chained_hidden(chain.rows);
    return head_->decoder_chain(chain);
  };
}

}  // namespace specula
