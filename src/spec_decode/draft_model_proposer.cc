#include "spec_decode/draft_model_proposer.h"

#include <algorithm>

#include "core/error.h"

namespace specula {

DraftModelProposer::DraftModelProposer(std::unique_ptr<Model> draft, Backend& backend,
                                       std::unique_ptr<DraftSampler> sampler, const DraftModelProposerConfig& config)
    : ModelProposer(backend, std::move(sampler), config, draft ? draft->config().vocab_size : 0,
                    /*target_hidden_size=*/0),
      draft_(std::move(draft)),
      draft_config_(config) {
  SPECULA_CHECK(draft_ != nullptr, "draft_model proposer: no draft model");
  SPECULA_CHECK(config.num_speculative_tokens >= 1 && config.max_num_seqs >= 1 && config.max_num_batched_tokens >= 1 &&
                    config.draft_max_model_len >= 2,
                "draft_model proposer: bad configuration (k={}, max_num_seqs={}, max_num_batched_tokens={}, "
                "draft max_model_len={})",
                config.num_speculative_tokens, config.max_num_seqs, config.max_num_batched_tokens, config.draft_max_model_len);
}

double DraftModelProposer::draft_fixed_cost() const {
  // With greedy chains fused (CUDA: one cluster launch), a further draft costs ~25 us on the H100
  // beside ~90 us for the first (the catch-up forward, the chain's launch and the drafts' copy):
  // ~3 further drafts of fixed cost a step. Drafted layer by layer, each draft is a forward like
  // the first, the default shape.
  const bool fused = config_.chain_drafts && draft_config_.fused_chain && backend_.device() == Device::kCUDA;
  return fused ? 3.0 : Proposer::draft_fixed_cost();
}

void DraftModelProposer::confirm_accepted_drafts(DraftState& st, const ProposerRequest& r) const {
  // Drafting wrote K/V for drafts[0 .. size-2] (the inputs of steps 2..k). An entry is the draft's
  // real K/V of that position iff every token up to it is the accepted one.
  if (!st.drafts.empty() && st.num_computed == st.drafted_from) {
    for (size_t i = 0; i + 1 < st.drafts.size(); ++i) {
      const size_t pos = static_cast<size_t>(st.drafted_from) + i;
      if (pos >= r.tokens.size() || r.tokens[pos] != st.drafts[i]) break;
      st.num_computed = static_cast<int>(pos) + 1;
    }
  }
  st.drafts.clear();
}

void DraftModelProposer::plan_catch_up(const ProposeBatch& batch, std::vector<int>& num_drafts,
                                       std::vector<Piece>& pieces) {
  // Catch up to target_[i] tokens, then maybe draft.
  const size_t n = batch.requests.size();
  target_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const ProposerRequest& r = batch.requests[i];
    DraftState& st = state_as<DraftState>(r.req_id);
    confirm_accepted_drafts(st, r);
    if (r.shed) {  // nothing runs for it: it catches up when it next drafts
      target_[i] = st.num_computed;
      continue;
    }
    const int known = r.sampled ? static_cast<int>(r.tokens.size()) : r.num_target_computed;
    target_[i] = std::min(known, draft_config_.draft_max_model_len);
    st.num_computed = std::min(st.num_computed, target_[i]);
    if (r.sampled && r.max_drafts > 0 && target_[i] == static_cast<int>(r.tokens.size())) {
      // Draft j comes from the input at position target + j - 2, which must lie within the draft.
      num_drafts[i] = std::min({batch.depth, r.max_drafts, draft_config_.draft_max_model_len - target_[i] + 1});
    }
    if (num_drafts[i] > 0) {
      // Drafting needs the logits of the last token: run it again if the draft has it already. A
      // launch-ahead runs two rows, the shift moving them onto the last accepted token and the
      // target's next one, whose predecessors the draft holds whatever was accepted.
      st.num_computed = std::min(st.num_computed, target_[i] - (batch.ahead ? 2 : 1));
    } else if (r.sampled) {
      // A decoding request that cannot draft now never will (it is at max_tokens, max_model_len
      // or the draft's length): no catch-up for it.
      target_[i] = st.num_computed;
      continue;
    }
    if (st.num_computed < target_[i]) pieces.push_back(Piece{i, st.num_computed, target_[i], num_drafts[i] > 0});
  }
}

void DraftModelProposer::finish_propose(const ProposeBatch& batch, const std::vector<std::vector<int32_t>>& drafts) {
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    DraftState& st = state_as<DraftState>(batch.requests[i].req_id);
    st.num_computed = target_[i];
    if (drafts[i].empty()) continue;
    st.drafted_from = target_[i];
    st.drafts = drafts[i];
  }
}

bool DraftModelProposer::ahead_fits(const ProposerRequest& r, int k) const {
  // Whatever it accepts, its catch-up and drafts stay within the draft's length.
  return static_cast<int>(r.tokens.size()) + k + config_.num_speculative_tokens < draft_config_.draft_max_model_len;
}

void DraftModelProposer::shift_state(RequestState& st, int accepted) {
  ModelProposer::shift_state(st, accepted);
  static_cast<DraftState&>(st).drafted_from += accepted;
}

ModelProposer::DraftForwardOutput DraftModelProposer::draft_forward(DraftForwardInput& in) {
  return DraftForwardOutput{draft_->forward(in.rows, kv_).logits, Tensor()};
}

int DraftModelProposer::longest_sequence() const {
  // No draft input position reaches draft_max_model_len, so no sequence is longer.
  return std::min(draft_config_.draft_max_model_len, ModelProposer::longest_sequence());
}

DraftChain::FusedChain DraftModelProposer::fused_chain() {
  if (!draft_config_.fused_chain) return nullptr;
  return [this](DecoderChain& chain) {
    chain.kv = &kv_;
    return draft_->decoder_chain(chain);
  };
}

}  // namespace specula
