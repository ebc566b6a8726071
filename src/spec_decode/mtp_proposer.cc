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
