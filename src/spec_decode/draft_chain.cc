#include "spec_decode/draft_chain.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/phase_profile.h"
#include "engine/scheduler_output.h"
#include "sampling/rejection_math.h"

namespace specula {

void DraftChain::allocate(Backend& backend, int max_num_seqs, int num_speculative_tokens, DraftSampler* sampler,
                          Tensor* q_store) {
  backend_ = &backend;
  sampler_ = sampler;
  q_store_ = q_store;
  const char* fuse = std::getenv("SPECULA_FUSED_SAMPLED_CHAIN");
  fuse_sampled_ = !(fuse && std::strcmp(fuse, "0") == 0);
  out_ = backend.empty({static_cast<int64_t>(max_num_seqs) * num_speculative_tokens}, DType::kI32);
  host_ = backend.empty_host({out_.numel()}, DType::kI32);
  idx_.allocate(backend, max_num_seqs, DType::kI32);
  // Every entry is a valid token from here on (draws, argmaxes and zeros only), so a chain's
  // padding rows may read whatever the last chain left there.
  backend.zero(out_);
  Tensor logits = backend.empty({1, 2}, DType::kF32), first = out_.slice(0, 1);
  backend.zero(logits);
  backend.argmax_rows(logits, nullptr, first);
  backend.synchronize();
}

DraftChain::Kind DraftChain::kind_for(const ProposeBatch& batch, bool argmax_drafts, bool sampled) {
  bool all_argmax = true;
  for (const ProposerRequest& r : batch.requests) {
    if (!r.sampled || r.max_drafts <= 0) continue;
    if (r.grammar) return Kind::kNone;  // each draft's mask follows the drafts before it (host work)
    if (argmax_drafts) continue;
    const SamplingParams& p = *r.params;
    if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f ||
        !p.logit_bias.empty())
      return Kind::kNone;  // the draws depend on the drafts before them
    // min_tokens masks its stop ids while fewer tokens than that are out (draft_sampling_row).
    const int out = static_cast<int>(r.tokens.size()) - r.num_prompt_tokens;
    if (!r.min_tokens_stop_ids.empty() && out < p.min_tokens) return Kind::kNone;
    all_argmax = all_argmax && p.greedy();
  }
  if (all_argmax) return Kind::kArgmax;
  return sampled ? Kind::kSampled : Kind::kNone;
}

void DraftChain::begin(std::vector<size_t> rows, int padded, Kind kind, std::vector<DraftSampleRow> first_rows,
                       std::vector<int> num_drafts) {
  SPECULA_CHECK(!pending(), "internal error: a draft chain begun before the last one's drafts were collected");
  SPECULA_CHECK(backend_ != nullptr && padded >= static_cast<int>(rows.size()) && !rows.empty() &&
                    static_cast<int64_t>(padded) <= idx_.device.numel() && kind != Kind::kNone,
                "internal error: a draft chain of {} rows padded to {}", rows.size(), padded);
  SPECULA_CHECK(
      kind == Kind::kArgmax || (sampler_ && first_rows.size() == rows.size() && num_drafts.size() == rows.size()),
      "internal error: a sampled draft chain of {} rows with {} sampling rows", rows.size(), first_rows.size());
  rows_ = std::move(rows);
  padded_ = padded;
  kind_ = kind;
  first_rows_ = std::move(first_rows);
  row_drafts_ = std::move(num_drafts);
  firsts_ = 0;
  on_ = true;
}

void DraftChain::draw(const Tensor& logits, int j, int first, const std::vector<int32_t>& logits_rows, Tensor out) {
  draws_.clear();
  for (size_t i = 0; i < logits_rows.size(); ++i) {
    const size_t r = static_cast<size_t>(first) + i;
    DraftSampleRow d = first_rows_[r];
    d.row.logits_row = logits_rows[i];
    d.row.position += j - 1;
    // A row past its drafts idles: its draw is ignored and keeps no q.
    d.q_row = j <= row_drafts_[r] && d.q_row >= 0 ? d.q_row + j - 1 : -1;
    draws_.push_back(d);
  }
  sampler_->draw_on_device(logits, draws_, q_store_, out);
}

void DraftChain::add_first_drafts(const Tensor& logits, const std::vector<int32_t>& logits_rows) {
  const int m = static_cast<int>(logits_rows.size());
  if (m == 0) return;
  SPECULA_CHECK(firsts_ + m <= static_cast<int>(rows_.size()),
                "internal error: {} first drafts for a chain of {} rows", firsts_ + m, rows_.size());
  Tensor out = out_.slice(firsts_, firsts_ + m);
  bool identity = true;
  for (int i = 0; i < m; ++i) identity = identity && logits_rows[static_cast<size_t>(i)] == i;
  if (kind_ == Kind::kSampled) {
    draw(logits, 1, firsts_, logits_rows, out);
  } else if (identity) {
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

void DraftChain::run(DraftStepBuffers& step, int max_drafts, const std::vector<int>& num_drafts,
                     const std::function<Tensor(int j)>& forward, std::vector<std::vector<int32_t>>& drafts,
                     const FusedChain& fused, bool leave_on_device) {
  SPECULA_CHECK(on_ && firsts_ == static_cast<int>(rows_.size()),
                "internal error: the catch-up drafted {} first drafts for a chain of {} rows", firsts_, rows_.size());
  phase_profile::Scope p(kind_ == Kind::kSampled ? "draft.sampled_chain" : "draft.greedy_chain");
  const int64_t padded = padded_;
  bool ran = false;
  if (max_drafts >= 2) ++multi_step_chains_;
  if (max_drafts >= 2 && fused && (kind_ == Kind::kArgmax || fuse_sampled_)) {
    DecoderChain chain;
    step.fill_chain(chain);
    SPECULA_CHECK(chain.rows == padded_ && chain.steps == max_drafts - 1,
                  "internal error: a fused chain of {} steps x {} rows staged for {} drafts x {} rows", chain.steps,
                  chain.rows, max_drafts, padded_);
    chain.first_tokens = out_.slice(0, padded);
    chain.out_tokens = out_.slice(padded, static_cast<int64_t>(max_drafts) * padded);
    ran = (kind_ == Kind::kArgmax || fill_draws(chain)) && fused(chain);
    if (ran) ++fused_chains_;
  }
  // Everything is enqueued behind the catch-up without waiting: step j reads draft j-1 (the
  // previous draw, on the stream before it) and its staged inputs.
  std::vector<int32_t> step_rows;
  if (kind_ == Kind::kSampled) {
    for (size_t r = 0; r < rows_.size(); ++r) step_rows.push_back(static_cast<int32_t>(r));
  }
  for (int j = 2; j <= max_drafts && !ran; ++j) {
    step.load_chain_step(j);
    Tensor tokens = step.tokens(padded_);
    backend_->copy(out_.slice((j - 2) * padded, (j - 1) * padded), tokens);
    const Tensor logits = forward(j);
    Tensor out = out_.slice((j - 1) * padded, j * padded);
    if (kind_ == Kind::kSampled) {
      draw(logits, j, 0, step_rows, out.slice(0, static_cast<int64_t>(rows_.size())));
    } else {
      backend_->argmax_rows(logits, nullptr, out);
    }
  }
  const int64_t total = static_cast<int64_t>(max_drafts) * padded;
  Tensor host = host_.slice(0, total);
  ++chains_;
  if (kind_ == Kind::kSampled) ++sampled_chains_;
  on_ = false;
  if (leave_on_device) {
    // (off the stream: the next step's forward, queued behind the chain, need not wait for it;
    // out_ is next written after finish() waited for the copy)
    copied_ = backend_->copy_to_host_async(out_.slice(0, total), host);
    num_drafts_ = num_drafts;
    for (size_t i : rows_) drafts[i].assign(static_cast<size_t>(num_drafts[i]), kPlaceholderToken);
    return;
  }
  backend_->copy(out_.slice(0, total), host);
  backend_->synchronize();
  read_drafts(num_drafts, drafts);
}

bool DraftChain::fill_draws(DecoderChain& chain) const {
  // One sampled row only: the kernel draws its rows one after another on one cluster (a mass
  // pass, a block scan and an exchange each), where the token sampler's draws run a cluster per
  // row. On the H200 at temperature 1, k = 3 (docs/PERFORMANCE.md), one request gained 4-8 % TPOT
  // over the draft steps as graphs, while 4 and 8 requests lost up to 12 % of throughput.
  int sampled_rows = 0;
  for (const DraftSampleRow& d : first_rows_) sampled_rows += d.row.params->greedy() ? 0 : 1;
  if (sampled_rows > kMaxFusedSampledRows) return false;
  const int64_t vocab = q_store_->size(1);
  chain.temperatures.assign(static_cast<size_t>(padded_), 0.0f);  // padding rows: the argmax
  chain.seeds.assign(static_cast<size_t>(padded_), 0);
  chain.q_first_rows.assign(static_cast<size_t>(padded_), 0);
  chain.q_steps.assign(static_cast<size_t>(padded_), 0);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const DraftSampleRow& d = first_rows_[r];
    const SamplingParams& p = *d.row.params;
    if (p.greedy()) continue;
    if ((p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f || p.min_p > 0.0f || d.q_row < 0) return false;
    chain.temperatures[r] = p.temperature;
    chain.seeds[r] = d.row.seed;
    // Draft j (2..) keeps q in row q_row + j - 1, while j <= the row's drafts.
    chain.q_first_rows[r] = d.q_row + 1;
    chain.q_steps[r] = row_drafts_[r] - 1;
  }
  chain.draw_stream = kSpecDraftStream;
  chain.q_store = *q_store_;
  return true;
}

void DraftChain::finish(std::vector<std::vector<int32_t>>& drafts) {
  SPECULA_CHECK(pending(), "internal error: no greedy draft chain left its drafts on the device");
  {
    phase_profile::Scope p("draft.wait_for_drafts");
    copied_->wait();
  }
  copied_.reset();
  drafts.assign(num_drafts_.size(), {});
  read_drafts(num_drafts_, drafts);
}

void DraftChain::read_drafts(const std::vector<int>& num_drafts, std::vector<std::vector<int32_t>>& drafts) const {
  const int32_t* got = host_.data_as<int32_t>();
  for (size_t row = 0; row < rows_.size(); ++row) {
    const size_t i = rows_[row];
    for (int j = 0; j < num_drafts[i]; ++j) drafts[i].push_back(got[static_cast<size_t>(j) * padded_ + row]);
  }
}

}  // namespace specula
