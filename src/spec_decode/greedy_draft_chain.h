// Greedy drafts chained on the device, for the model-running proposers (model_proposer.h).
//
// When every request that drafts in a step drafts the plain argmax (greedy, no penalties, no
// active min_tokens mask: its draft distribution is one-hot at the argmax of the raw logits), its
// drafts need not visit the host until the last one: the first drafts (rows of the catch-up's
// logits) and each draft step's are argmax'd on the device (Backend::argmax_rows) straight into
// the next step's token input; the other inputs of every step are staged at once
// (DraftStepBuffers::prepare_chain) and moved into the static step buffers by device copies
// between the steps; one copy brings all drafts back. On the H100 a draft token otherwise costs a
// sampler launch, a device -> host copy and a synchronisation (~27 us, a third of a draft step of
// the embedded pair), and the GPU waits for the host between steps. Batches with a sampled or
// penalised row take the proposer's per-step path through its DraftSampler.
//
// Rows: the drafting requests (batch indices, batch order), padded to a step batch size; draft j
// of chain row r is out[(j - 1) * padded + r]. A row that has all its drafts idles in later steps
// (no K/V write, result ignored); padding rows draft from token 0.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/speculator.h"
#include "spec_decode/draft_step_buffers.h"
#include "spec_decode/staged_tensor.h"

namespace specula {

class GreedyDraftChain {
 public:
  // Buffers for max_num_seqs rows of up to num_speculative_tokens drafts; launches the argmax kernel once (a
  // kernel's first launch loads its module, a millisecond or more that the first drafting step
  // would otherwise be measured with).
  void allocate(Backend& backend, int max_num_seqs, int num_speculative_tokens);

  // True when every request that may draft in `batch` drafts the plain argmax.
  // argmax_drafts: every request drafts the argmax whatever its sampling settings (verified as
  // deterministic drafts, which is lossless for any draft); only a grammar then keeps a batch out.
  static bool applies(const ProposeBatch& batch, bool argmax_drafts = false);

  // Starts a chain over `rows` at `padded` rows (its first drafts all token 0 until written).
  void begin(std::vector<size_t> rows, int padded);
  void end() { on_ = false; }
  bool on() const { return on_; }
  const std::vector<size_t>& rows() const { return rows_; }
  int padded() const { return padded_; }

  // The next first drafts, in chain-row order: the argmax of each of `logits_rows` of `logits`
  // (the drafting rows of a catch-up forward, in batch order, as the chain's rows).
  void add_first_drafts(const Tensor& logits, const std::vector<int32_t>& logits_rows);
  int num_first_drafts() const { return firsts_; }

  // Drafts 2..max_drafts, then every draft to the host: drafts[rows[r]] gets its
  // num_drafts[rows[r]] drafts. Every first draft must have been added. `fused` (may be empty)
  // gets the whole chain as one op (the staged inputs, the first drafts as step 0's tokens,
  // drafts 2.. as its outputs) and returns false when it cannot run it; otherwise, or then, each
  // step j moves its staged inputs and tokens into `step` and forward(j) runs the draft step and
  // returns its F32 logits [padded, vocab].
  // With leave_on_device the copy to the host stays in flight: drafts[rows[r]] gets its
  // num_drafts placeholders (kPlaceholderToken) and finish() the values.
  using FusedChain = std::function<bool(DecoderChain& chain)>;
  void run(DraftStepBuffers& step, int max_drafts, const std::vector<int>& num_drafts,
           const std::function<Tensor(int j)>& forward, std::vector<std::vector<int32_t>>& drafts,
           const FusedChain& fused = nullptr, bool leave_on_device = false);
  // A run that left its drafts on the device: there, draft j of chain row r is
  // device_tokens()[j * padded() + r] until the next begin().
  bool pending() const { return copied_ != nullptr; }
  const Tensor& device_tokens() const { return out_; }
  // Waits for that run's copy (not for work issued after it) and gives drafts[rows[r]] its values.
  void finish(std::vector<std::vector<int32_t>>& drafts);

  int64_t num_chains() const { return chains_; }
  int64_t num_fused_chains() const { return fused_chains_; }
  int64_t num_multi_step_chains() const { return multi_step_chains_; }  // chains with drafts 2..k

 private:
  void read_drafts(const std::vector<int>& num_drafts, std::vector<std::vector<int32_t>>& drafts) const;

  Backend* backend_ = nullptr;
  Tensor out_;         // I32 [num_speculative_tokens * max_num_seqs]
  Tensor host_;        // its pinned twin
  std::unique_ptr<DeviceEvent> copied_;  // a run's copy into host_ left in flight
  std::vector<int> num_drafts_;          // that run's drafts per batch request
  StagedTensor idx_;   // logits rows of the first drafts
  std::vector<size_t> rows_;
  int padded_ = 0;
  int firsts_ = 0;
  bool on_ = false;
  int64_t chains_ = 0;
  int64_t fused_chains_ = 0;
  int64_t multi_step_chains_ = 0;
};

}  // namespace specula
