// Drafts chained on the device, for the model-running proposers (model_proposer.h).
//
// When no request that drafts in a step needs the host between its drafts (no grammar, no
// penalties, no logit bias, no active min_tokens mask), its drafts need not visit the host until
// the last one: each draft is drawn on the device (the first from the catch-up's logits, the
// others from each draft step's) straight into the next step's token input; the other inputs of
// every step are staged at once (DraftStepBuffers::prepare_chain) and moved into the static step
// buffers by device copies between the steps; one copy brings all drafts back. On the H100 a
// draft token otherwise costs a sampler launch, a device -> host copy and a synchronisation
// (~27 us, a third of a draft step of the embedded pair), and the GPU waits for the host between
// steps. Two kinds:
//   - argmax: every drafting request drafts the plain argmax (greedy, or argmax_drafts: its
//     drafts are then deterministic, q one-hot). Backend::argmax_rows draws, and a model with a
//     fused chain (Model::decoder_chain) runs drafts 2..k as one op;
//   - sampled: some request samples its drafts. The DraftSampler draws every row on the device
//     (draw_on_device) from the request's (seed, position) draw, keeping q in the q store for the
//     rejection sampler: the tokens and q of the step-by-step path, without the round trips.
//     Where one row samples, from its temperature alone (no top-k, top-p or min-p), a fused
//     chain draws drafts 2..k itself, the same draw over its own logits
//     (backend/decoder_chain.h; SPECULA_FUSED_SAMPLED_CHAIN=0 keeps them on the draft steps).
// Other batches take the proposer's per-step path through its DraftSampler.
//
// Rows: the drafting requests (batch indices, batch order), padded to a step batch size; draft j
// of chain row r is out[(j - 1) * padded + r]. A row that has all its drafts idles in later steps
// (no K/V write, result ignored); padding rows draft from whatever valid token their entry holds.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/speculator.h"
#include "sampling/draft_sampler.h"
#include "spec_decode/draft_step_buffers.h"
#include "spec_decode/staged_tensor.h"

namespace specula {

class DraftChain {
 public:
  enum class Kind { kNone, kArgmax, kSampled };

  // Buffers for max_num_seqs rows of up to num_speculative_tokens drafts; launches the argmax kernel once (a
  // kernel's first launch loads its module, a millisecond or more that the first drafting step
  // would otherwise be measured with). Sampled chains draw through `sampler`, keeping q in `q_store`.
  void allocate(Backend& backend, int max_num_seqs, int num_speculative_tokens, DraftSampler* sampler,
                Tensor* q_store);

  // How `batch`'s drafts can chain. argmax_drafts: every request drafts the argmax whatever its
  // sampling settings (verified as deterministic drafts, which is lossless for any draft); only a
  // grammar then keeps a batch out. sampled: a batch with sampled rows may chain (kSampled).
  static Kind kind_for(const ProposeBatch& batch, bool argmax_drafts, bool sampled = true);

  // Starts a chain over `rows` at `padded` rows (padding rows read tokens of earlier chains). A
  // sampled chain gets each row's draft-1 sampling row (logits_row unset: each draw sets it; q_row
  // the request's first q row) and its number of drafts; draft j draws at position + j - 1 into
  // q row q_row + j - 1.
  void begin(std::vector<size_t> rows, int padded, Kind kind = Kind::kArgmax,
             std::vector<DraftSampleRow> first_rows = {}, std::vector<int> num_drafts = {});
  void end() { on_ = false; }
  bool on() const { return on_; }
  Kind kind() const { return kind_; }
  const std::vector<size_t>& rows() const { return rows_; }
  int padded() const { return padded_; }

  // The next first drafts, in chain-row order: drawn from each of `logits_rows` of `logits`
  // (the drafting rows of a catch-up forward, in batch order, as the chain's rows).
  void add_first_drafts(const Tensor& logits, const std::vector<int32_t>& logits_rows);
  int num_first_drafts() const { return firsts_; }

  // Drafts 2..max_drafts, then every draft to the host: drafts[rows[r]] gets its
  // num_drafts[rows[r]] drafts. Every first draft must have been added. `fused` (may be empty)
  // gets the whole chain as one op (the staged inputs, the first drafts as step 0's tokens, drafts
  // 2.. as its outputs, a sampled chain's draws) and returns false when it cannot run it; otherwise, or then, each
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

  int64_t num_chains() const { return chains_; }  // both kinds
  int64_t num_sampled_chains() const { return sampled_chains_; }
  int64_t num_fused_chains() const { return fused_chains_; }
  int64_t num_multi_step_chains() const { return multi_step_chains_; }  // chains with drafts 2..k

 private:
  void read_drafts(const std::vector<int>& num_drafts, std::vector<std::vector<int32_t>>& drafts) const;
  // A sampled chain's draws as a fused chain's (DecoderChain::temperatures ...); false when more
  // than kMaxFusedSampledRows rows sample, or some row's draw is more than a temperature (top-k,
  // top-p, min-p) or keeps no q.
  static constexpr int kMaxFusedSampledRows = 1;
  bool fill_draws(DecoderChain& chain) const;
  // A sampled chain's draws of draft j (1-based) for chain rows [first, first + n) from `logits`
  // rows logits_rows (n of them) into `out`.
  void draw(const Tensor& logits, int j, int first, const std::vector<int32_t>& logits_rows, Tensor out);

  Backend* backend_ = nullptr;
  DraftSampler* sampler_ = nullptr;
  Tensor* q_store_ = nullptr;
  bool fuse_sampled_ = true;  // SPECULA_FUSED_SAMPLED_CHAIN, read at allocate()
  Kind kind_ = Kind::kArgmax;
  std::vector<DraftSampleRow> first_rows_;  // sampled chains: per chain row, draft 1's sampling row
  std::vector<int> row_drafts_;             // sampled chains: per chain row, its drafts
  std::vector<DraftSampleRow> draws_;       // scratch
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
  int64_t sampled_chains_ = 0;
  int64_t fused_chains_ = 0;
  int64_t multi_step_chains_ = 0;
};

}  // namespace specula
