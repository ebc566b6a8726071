#include "spec_decode/mtp_proposer.h"

#include <algorithm>

#include "core/error.h"

namespace specula {

MtpProposer::MtpProposer(std::unique_ptr<DeepseekMtp> mtp, Backend& backend, std::unique_ptr<DraftSampler> sampler,
                         const MtpProposerConfig& config)
    : ModelProposer(backend, std::move(sampler), config, mtp ? mtp->config().vocab_size : 0,
                    mtp ? mtp->config().hidden_size : 0),
      mtp_(std::move(mtp)) {
  SPECULA_CHECK(mtp_ != nullptr && mtp_->num_layers() > 0, "mtp proposer: no MTP layer");
  SPECULA_CHECK(config.max_model_len >= 2, "mtp proposer: bad configuration (max_model_len={})", config.max_model_len);
}

int MtpProposer::num_inherited(std::string_view req_id) const {
  const RequestState* st = find_state(req_id);
  return st ? static_cast<const MtpState*>(st)->num_inherited : -1;
}

void MtpProposer::plan_catch_up(const ProposeBatch& batch, std::vector<int>& num_drafts, std::vector<Piece>& pieces) {
  // Every request's new MTP positions: those the target computed in this step (their hidden
  // states are in this step's rows) whose next token is known.
  int total = 0;
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    const ProposerRequest& r = batch.requests[i];
    MtpState& st = state_as<MtpState>(r.req_id);
    const int len = static_cast<int>(r.tokens.size());
    const int from = r.first_position;
    const int to = std::min({r.num_target_computed, len - 1, r.first_position + r.num_rows});
    // Positions before the step's first one that this request never ran (a prefix-cache hit): the
    // shared blocks' entries stand in for them (see the header).
    if (st.num_computed < from) st.num_inherited += from - st.num_computed;
    st.num_computed = std::max(from, to);
    if (to <= from) continue;
    // A request that sampled drafts from its last accepted position, L - 2.
    const bool drafting = r.sampled && batch.depth > 0 && r.max_drafts > 0 && to == len - 1;
    if (drafting) num_drafts[i] = std::min(batch.depth, r.max_drafts);
    pieces.push_back(Piece{i, from, to, drafting});
    total += to - from;
  }
  if (pieces.empty()) return;
  const Tensor& target_hidden = batch.target_hidden_states;
  SPECULA_CHECK(target_hidden.defined(),
                "mtp proposer: the target model returned no hidden states (ForwardOutput::hidden_states)");
  // Every position comes from this step's target rows, so the catch-up never needs more room than
  // the target's step: one forward.
  SPECULA_CHECK(total <= config_.max_num_batched_tokens && static_cast<int>(pieces.size()) <= config_.max_num_seqs,
                "internal error: MTP catch-up of {} positions / {} requests exceeds max_num_batched_tokens {} / "
                "max_num_seqs {}", total, pieces.size(), config_.max_num_batched_tokens, config_.max_num_seqs);
  for (const Piece& piece : pieces) {
    const ProposerRequest& r = batch.requests[piece.req];
    SPECULA_CHECK(r.first_row >= 0 && r.first_row + (piece.to - r.first_position) <= target_hidden.size(0),
                  "internal error: request {} reads target rows [{}, {}) of {}", r.req_id, r.first_row,
                  r.first_row + piece.to - r.first_position, target_hidden.size(0));
  }
}

ModelProposer::DraftForwardOutput MtpProposer::draft_forward(DraftForwardInput& in) {
  // The same arena offsets at the warm-up, the capture and eager runs of a graph's work.
  backend_.reset_scratch();
  MtpForwardInput m;
  m.rows = in.rows;
  m.hidden = in.hidden;
  m.zero_embedding_rows = std::move(in.position_zero_rows);
  MtpForwardOutput out = mtp_->forward(in.variant, m, kv_[static_cast<size_t>(in.variant)]);
  return DraftForwardOutput{out.logits, out.y};
}

}  // namespace specula
