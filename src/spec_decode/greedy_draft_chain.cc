#include "spec_decode/greedy_draft_chain.h"

#include "core/error.h"
#include "core/phase_profile.h"
#include "engine/scheduler_output.h"

namespace specula {

void GreedyDraftChain::allocate(Backend& backend, int max_num_seqs, int num_speculative_tokens) {
  backend_ = &backend;
  out_ = backend.empty({static_cast<int64_t>(max_num_seqs) * num_speculative_tokens}, DType::kI32);
  host_ = backend.empty_host({out_.numel()}, DType::kI32);
  idx_.allocate(backend, max_num_seqs, DType::kI32);
  Tensor logits = backend.empty({1, 2}, DType::kF32), first = out_.slice(0, 1);
  backend.zero(logits);
  backend.argmax_rows(logits, nullptr, first);
  backend.synchronize();
}

bool GreedyDraftChain::applies(const ProposeBatch& batch, bool argmax_drafts) {
  for (const ProposerRequest& r : batch.requests) {
    if (!r.sampled || r.max_drafts <= 0) continue;
    if (r.grammar) return false;  // each draft's mask follows the drafts before it (host work)
    if (argmax_drafts) continue;
    const SamplingParams& p = *r.params;
    if (!p.greedy() || p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f ||
        !p.logit_bias.empty())
      return false;
    // min_tokens masks its stop ids while fewer tokens than that are out (draft_sampling_row).
    const int out = static_cast<int>(r.tokens.size()) - r.num_prompt_tokens;
    if (!r.min_tokens_stop_ids.empty() && out < p.min_tokens) return false;
  }
  return true;
}

void GreedyDraftChain::begin(std::vector<size_t> rows, int padded) {
  SPECULA_CHECK(!pending(), "internal error: a greedy draft chain begun before the last one's drafts were collected");
  SPECULA_CHECK(backend_ != nullptr && padded >= static_cast<int>(rows.size()) && !rows.empty() &&
                    static_cast<int64_t>(padded) <= idx_.device.numel(),
                "internal error: a greedy draft chain of {} rows padded to {}", rows.size(), padded);
  rows_ = std::move(rows);
  padded_ = padded;
  firsts_ = 0;
  on_ = true;
  // Padding rows' first "drafts" feed the padding rows of step 2: any valid token.
  Tensor firsts = out_.slice(0, padded);
  backend_->zero(firsts);
}

void GreedyDraftChain::add_first_drafts(const Tensor& logits, const std::vector<int32_t>& logits_rows) {
  const int m = static_cast<int>(logits_rows.size());
  if (m == 0) return;
  SPECULA_CHECK(firsts_ + m <= static_cast<int>(rows_.size()),
                "internal error: {} first drafts for a chain of {} rows", firsts_ + m, rows_.size());
  Tensor out = out_.slice(firsts_, firsts_ + m);
  bool identity = true;
  for (int i = 0; i < m; ++i) identity = identity && logits_rows[static_cast<size_t>(i)] == i;
  if (identity) {
    backend_->argmax_rows(logits, nullptr, out);
  } else {
    // The staging is free: its last upload ran before the last chain's drafts were copied back,
    // which every chain waits for (run() synchronously, else finish() before the next begin()).
    int32_t* idx = idx_.host.data_as<int32_t>();
    for (int i = 0; i < m; ++i) idx[i] = logits_rows[static_cast<size_t>(i)];
    const Tensor rows = idx_.upload(*backend_, m);
    backend_->argmax_rows(logits, &rows, out);
  }
  firsts_ += m;
}

void GreedyDraftChain::run(DraftStepBuffers& step, int max_drafts, const std::vector<int>& num_drafts,
                           const std::function<Tensor(int j)>& forward, std::vector<std::vector<int32_t>>& drafts,
                           const FusedChain& fused, bool leave_on_device) {
  SPECULA_CHECK(on_ && firsts_ == static_cast<int>(rows_.size()),
                "internal error: the catch-up drafted {} first drafts for a chain of {} rows", firsts_, rows_.size());
  phase_profile::Scope p("draft.greedy_chain");
  const int64_t padded = padded_;
  bool ran = false;
  if (max_drafts >= 2) ++multi_step_chains_;
  if (max_drafts >= 2 && fused) {
    DecoderChain chain;
    step.fill_chain(chain);
    SPECULA_CHECK(chain.rows == padded_ && chain.steps == max_drafts - 1,
                  "internal error: a fused chain of {} steps x {} rows staged for {} drafts x {} rows", chain.steps,
                  chain.rows, max_drafts, padded_);
    chain.first_tokens = out_.slice(0, padded);
    chain.out_tokens = out_.slice(padded, static_cast<int64_t>(max_drafts) * padded);
    ran = fused(chain);
    if (ran) ++fused_chains_;
  }
  // Everything is enqueued behind the catch-up without waiting: step j reads draft j-1 (the
  // previous argmax, on the stream before it) and its staged inputs.
  for (int j = 2; j <= max_drafts && !ran; ++j) {
    step.load_chain_step(j);
    Tensor tokens = step.tokens(padded_);
    backend_->copy(out_.slice((j - 2) * padded, (j - 1) * padded), tokens);
    const Tensor logits = forward(j);
    Tensor out = out_.slice((j - 1) * padded, j * padded);
    backend_->argmax_rows(logits, nullptr, out);
  }
  const int64_t total = static_cast<int64_t>(max_drafts) * padded;
  Tensor host = host_.slice(0, total);
  backend_->copy(out_.slice(0, total), host);
  ++chains_;
  on_ = false;
  if (leave_on_device) {
    copied_ = backend_->record_event();
    num_drafts_ = num_drafts;
    for (size_t i : rows_) drafts[i].assign(static_cast<size_t>(num_drafts[i]), kPlaceholderToken);
    return;
  }
  backend_->synchronize();
  read_drafts(num_drafts, drafts);
}

void GreedyDraftChain::finish(std::vector<std::vector<int32_t>>& drafts) {
  SPECULA_CHECK(pending(), "internal error: no greedy draft chain left its drafts on the device");
  {
    phase_profile::Scope p("draft.wait_for_drafts");
    copied_->wait();
  }
  copied_.reset();
  drafts.assign(num_drafts_.size(), {});
  read_drafts(num_drafts_, drafts);
}

void GreedyDraftChain::read_drafts(const std::vector<int>& num_drafts, std::vector<std::vector<int32_t>>& drafts) const {
  const int32_t* got = host_.data_as<int32_t>();
  for (size_t row = 0; row < rows_.size(); ++row) {
    const size_t i = rows_[row];
    for (int j = 0; j < num_drafts[i]; ++j) drafts[i].push_back(got[static_cast<size_t>(j) * padded_ + row]);
  }
}

}  // namespace specula
