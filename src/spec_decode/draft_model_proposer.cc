#include "spec_decode/draft_model_proposer.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/logging.h"
#include "core/phase_profile.h"
#include "sampling/rejection_math.h"

namespace specula {

DraftModelProposer::DraftModelProposer(std::unique_ptr<Model> draft, Backend& backend,
                                       std::unique_ptr<DraftSampler> sampler, const DraftModelProposerConfig& config)
    : draft_(std::move(draft)),
      backend_(backend),
      sampler_(std::move(sampler)),
      config_(config),
      states_(config.max_num_seqs, config.num_speculative_tokens, "draft_model") {
  SPECULA_CHECK(draft_ != nullptr, "draft_model proposer: no draft model");
  SPECULA_CHECK(config.num_speculative_tokens >= 1 && config.max_num_seqs >= 1 && config.max_num_batched_tokens >= 1 &&
                    config.draft_max_model_len >= 2,
                "draft_model proposer: bad configuration (k={}, max_num_seqs={}, max_num_batched_tokens={}, "
                "draft max_model_len={})",
                config.num_speculative_tokens, config.max_num_seqs, config.max_num_batched_tokens, config.draft_max_model_len);
  if (!sampler_) sampler_ = make_cpu_draft_sampler(backend);
  q_store_ = backend.empty({static_cast<int64_t>(config.max_num_seqs) * config.num_speculative_tokens, draft_->config().vocab_size},
                           DType::kF32);
}

void DraftModelProposer::allocate_kv_cache(int num_blocks, int block_size) {
  SPECULA_CHECK(num_blocks > 0 && block_size > 0, "draft_model proposer: bad KV cache shape ({} blocks of {})",
                num_blocks, block_size);
  block_size_ = block_size;
  kv_ = allocate_draft_kv_cache(backend_, draft_->kv_cache_spec(), num_blocks, block_size);
  max_blocks_per_seq_ = ceil_div(config_.max_model_len + config_.num_speculative_tokens, block_size);
  catch_up_.allocate(backend_, config_.max_num_batched_tokens, config_.max_num_seqs, max_blocks_per_seq_, block_size);
  step_.allocate(backend_, config_.max_num_seqs, max_blocks_per_seq_, block_size, "draft K/V", config_.num_speculative_tokens - 1);
  chain_.allocate(backend_, config_.max_num_seqs, config_.num_speculative_tokens);
  backend_.synchronize();
}

void DraftModelProposer::drop_request(std::string_view req_id) { states_.drop(req_id); }

int DraftModelProposer::draft_probs_row(std::string_view req_id) const { return states_.q_row(req_id); }

int DraftModelProposer::num_computed(std::string_view req_id) const {
  const State* st = states_.find(req_id);
  return st ? st->num_computed : -1;
}

void DraftModelProposer::confirm_accepted_drafts(State& st, const ProposerRequest& r) const {
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

double DraftModelProposer::draft_fixed_cost() const {
  // With greedy chains fused (CUDA: one cluster launch), a further draft costs ~25 us on the H100
  // beside ~90 us for the first (the catch-up forward, the chain's launch and the drafts' copy):
  // ~3 further drafts of fixed cost a step. Drafted layer by layer, each draft is a forward like
  // the first, the default shape.
  const bool fused = config_.greedy_chain && config_.fused_chain && backend_.device() == Device::kCUDA;
  return fused ? 3.0 : Proposer::draft_fixed_cost();
}

void DraftModelProposer::propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) {
  const size_t n = batch.requests.size();
  drafts.assign(n, {});
  last_catch_up_tokens_ = 0;
  // Depth 0: the draft does not run at all; its next drafting step catches up.
  if (batch.depth <= 0 || n == 0) return;
  SPECULA_CHECK(!kv_.empty(), "internal error: draft_model proposer used before allocate_kv_cache");

  chain_.end();
  const bool chain = config_.greedy_chain && GreedyDraftChain::applies(batch);

  // 1. What each request needs: catch up to `target` tokens, then maybe draft.
  std::vector<int> target(n, 0), num_drafts(n, 0);
  std::vector<Piece> pieces;
  contexts_.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    const ProposerRequest& r = batch.requests[i];
    State& st = states_.get_or_add(r.req_id);
    confirm_accepted_drafts(st, r);
    const int known = r.sampled ? static_cast<int>(r.tokens.size()) : r.num_target_computed;
    target[i] = std::min(known, config_.draft_max_model_len);
    st.num_computed = std::min(st.num_computed, target[i]);
    if (r.sampled && r.max_drafts > 0 && target[i] == static_cast<int>(r.tokens.size())) {
      // Draft j comes from the input at position target + j - 2, which must lie within the draft.
      num_drafts[i] = std::min({batch.depth, r.max_drafts, config_.draft_max_model_len - target[i] + 1});
    }
    if (num_drafts[i] > 0) {
      // Drafting needs the logits of the last token: run it again if the draft has it already.
      st.num_computed = std::min(st.num_computed, target[i] - 1);
      if (!chain) {  // the draft sampler's context (penalties, masks)
        contexts_[i].reserve(r.tokens.size() + static_cast<size_t>(num_drafts[i]));
        contexts_[i].assign(r.tokens.begin(), r.tokens.end());
      }
    } else if (r.sampled) {
      // A decoding request that cannot draft now never will (it is at max_tokens, max_model_len
      // or the draft's length): no catch-up for it.
      target[i] = st.num_computed;
      continue;
    }
    if (st.num_computed < target[i]) {
      pieces.push_back(Piece{i, st.num_computed, target[i], num_drafts[i] > 0});
      last_catch_up_tokens_ += target[i] - st.num_computed;
    }
  }

  int max_drafts = 0;
  for (size_t i = 0; i < n; ++i) max_drafts = std::max(max_drafts, num_drafts[i]);
  if (chain) {
    // The chain's rows are the drafting requests in batch order, which is also the order of their
    // drafting pieces in the catch-up forwards (each adds the next first drafts).
    std::vector<size_t> rows;
    for (size_t i = 0; i < n; ++i)
      if (num_drafts[i] > 0) rows.push_back(i);
    if (!rows.empty()) {
      const int padded = step_batch_size(static_cast<int>(rows.size()));
      if (max_drafts >= 2) step_.prepare_chain(batch, rows, max_drafts - 1, padded, num_drafts, 1);
      chain_.begin(std::move(rows), padded);
    }
  }

  // 2. Catch-up forwards, at most max_num_batched_tokens tokens and max_num_seqs pieces each; the
  // last piece of a drafting request samples its first draft.
  std::vector<Piece> chunk;
  int chunk_tokens = 0;
  for (size_t p = 0; p < pieces.size();) {
    Piece& piece = pieces[p];
    const int room = config_.max_num_batched_tokens - chunk_tokens;
    if (room <= 0 || static_cast<int>(chunk.size()) == config_.max_num_seqs) {
      run_catch_up(batch, chunk, drafts);
      chunk.clear();
      chunk_tokens = 0;
      continue;
    }
    if (piece.to - piece.from <= room) {
      chunk.push_back(piece);
      chunk_tokens += piece.to - piece.from;
      ++p;
    } else {  // split: the head now, the rest in the next forward
      chunk.push_back(Piece{piece.req, piece.from, piece.from + room, false});
      chunk_tokens += room;
      piece.from += room;
    }
  }
  if (!chunk.empty()) run_catch_up(batch, chunk, drafts);
  for (size_t i = 0; i < n; ++i) states_.at(batch.requests[i].req_id).num_computed = target[i];

  // 3. Drafts 2..k: one decode step over every drafting request per draft (rows fixed for the
  // whole loop; a row that has all its drafts only idles: no K/V write, result ignored).
  std::vector<size_t> rows;
  for (size_t i = 0; i < n && !chain_.on(); ++i)
    if (num_drafts[i] >= 2) rows.push_back(i);
  if (chain_.on()) {
    const int padded = chain_.padded();
    GreedyDraftChain::FusedChain fused;
    if (config_.fused_chain)
      fused = [&](DecoderChain& chain) {
        chain.kv = &kv_;
        return draft_->greedy_chain(chain);
      };
    chain_.run(step_, max_drafts, num_drafts, [&](int) { return run_step(padded); }, drafts, fused);
  } else if (!rows.empty()) {
    const int real = static_cast<int>(rows.size());
    const int padded = step_batch_size(real);
    SPECULA_CHECK(padded >= real && padded <= config_.max_num_seqs,
                  "internal error: draft step of {} rows padded to {} (max_num_seqs {})", real, padded,
                  config_.max_num_seqs);
    for (int j = 2; j <= max_drafts; ++j) {
      {
        phase_profile::Scope p("draft.step_prepare");
        // Draft j's input is draft j-1 at position tokens.size() + j - 2 (draft 1 came from the
        // last token's row, tokens.size() - 1).
        step_.prepare(batch, rows, j, padded, drafts, num_drafts, /*upload_tables=*/j == 2, /*first_back=*/1);
      }
      Tensor logits;
      {
        phase_profile::Scope p("draft.step_forward");
        logits = run_step(padded);
        if (phase_profile::enabled()) backend_.synchronize();
      }
      phase_profile::Scope sample_phase("draft.step_sample");
      std::vector<DraftSampleRow> sample_rows;
      std::vector<size_t> owners;
      for (int row = 0; row < real; ++row) {
        const size_t i = rows[static_cast<size_t>(row)];
        if (num_drafts[i] < j) continue;
        const ProposerRequest& r = batch.requests[i];
        const int position = target[i] + j - 1;
        contexts_[i].push_back(drafts[i].back());
        const int slot = states_.at(r.req_id).slot;
        sample_rows.push_back(DraftSampleRow{draft_sampling_row(r, row, position, contexts_[i]), slot * config_.num_speculative_tokens + j - 1});
        owners.push_back(i);
      }
      std::vector<int32_t> tokens = sampler_->sample(logits, sample_rows, &q_store_);
      for (size_t s = 0; s < owners.size(); ++s) drafts[owners[s]].push_back(tokens[s]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (drafts[i].empty()) continue;
    State& st = states_.at(batch.requests[i].req_id);
    st.drafted_from = target[i];
    st.drafts = drafts[i];
  }
}

void DraftModelProposer::run_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                      std::vector<std::vector<int32_t>>& drafts) {
  // The staging buffers may be pinned (asynchronous copies): the previous forward's copies out of
  // them must have run before they are rewritten.
  backend_.synchronize();
  if (run_catch_up_graph(batch, pieces, drafts)) return;
  const int bs = block_size_;
  const int num_seqs = static_cast<int>(pieces.size());
  int32_t* tokens = catch_up_.tokens.host.data_as<int32_t>();
  int32_t* positions = catch_up_.positions.host.data_as<int32_t>();
  int64_t* slots = catch_up_.slots.host.data_as<int64_t>();
  int32_t* qsl = catch_up_.qsl.host.data_as<int32_t>();
  int32_t* seq_lens = catch_up_.seq_lens.host.data_as<int32_t>();
  int32_t* logits_idx = catch_up_.logits_idx.host.data_as<int32_t>();
  int t = 0, num_logits = 0, max_query = 0, max_seq = 0, width = 1;
  qsl[0] = 0;
  std::vector<size_t> sampling;  // pieces whose last row samples a first draft
  for (int s = 0; s < num_seqs; ++s) {
    const Piece& piece = pieces[static_cast<size_t>(s)];
    const ProposerRequest& r = batch.requests[piece.req];
    for (int pos = piece.from; pos < piece.to; ++pos, ++t) {
      tokens[t] = r.tokens[static_cast<size_t>(pos)];
      positions[t] = pos;
      slots[t] = slot_of(r, pos);
    }
    if (piece.drafts) {
      logits_idx[num_logits++] = t - 1;
      sampling.push_back(static_cast<size_t>(s));
    }
    qsl[s + 1] = t;
    seq_lens[s] = piece.to;
    max_query = std::max(max_query, piece.to - piece.from);
    max_seq = std::max(max_seq, piece.to);
    width = std::max(width, ceil_div(piece.to, bs));
  }
  catch_up_.fill_varlen_tables(batch, pieces, width);
  const ForwardInput in = catch_up_.upload_varlen(num_seqs, t, num_logits, max_query, max_seq, width);
  ForwardOutput out;
  {
    phase_profile::Scope p("draft.catch_up_forward");
    out = draft_->forward(in, kv_);
    if (phase_profile::enabled()) backend_.synchronize();
  }
  ++num_forwards_;
  // The logits rows are those of the drafting pieces, in order.
  std::vector<int> row_of(pieces.size(), -1);
  for (size_t l = 0; l < sampling.size(); ++l) row_of[sampling[l]] = static_cast<int>(l);
  sample_first_drafts(batch, pieces, out.logits, [&](int s) { return row_of[static_cast<size_t>(s)]; }, drafts);
}

void DraftModelProposer::sample_first_drafts(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                             const Tensor& logits, const std::function<int(int)>& row_of,
                                             std::vector<std::vector<int32_t>>& drafts) {
  if (chain_.on()) {  // their argmax, on the device, as the chain's next first drafts
    chain_.add_first_drafts(logits, pieces, row_of);
    return;
  }
  std::vector<DraftSampleRow> rows;
  std::vector<size_t> owners;
  for (size_t s = 0; s < pieces.size(); ++s) {
    const Piece& piece = pieces[s];
    if (!piece.drafts) continue;
    const ProposerRequest& r = batch.requests[piece.req];
    const int slot = states_.at(r.req_id).slot;
    rows.push_back(DraftSampleRow{draft_sampling_row(r, row_of(static_cast<int>(s)), piece.to, contexts_[piece.req]),
                                  slot * config_.num_speculative_tokens});
    owners.push_back(piece.req);
  }
  if (rows.empty()) return;
  phase_profile::Scope sample_phase("draft.catch_up_sample");
  std::vector<int32_t> first = sampler_->sample(logits, rows, &q_store_);
  for (size_t l = 0; l < owners.size(); ++l) drafts[owners[l]].push_back(first[l]);
}

// A catch-up forward in which every piece spans at most kCatchUpGraphRows positions runs as a
// graph of r = the longest piece's length rows per request: each piece runs positions
// [to - r, to), the ones before its `from` again. Those already have the draft's K/V of the same
// tokens at the same positions (from = num_computed), so writing them once more changes nothing
// the draft reads but bf16 rounding of another batch shape (drafts only; verification keeps the
// output lossless whatever they are). Inputs go into the catch-up buffers at full table width,
// every row a logits row (dc_logits_idx_); padding requests are as the runner's (r tokens 0 at
// positions 0..r-1, slot -1, length r, block 0).
bool DraftModelProposer::run_catch_up_graph(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                            std::vector<std::vector<int32_t>>& drafts) {
  if (catch_up_graphs_.empty() || pieces.empty()) return false;
  int rows = 0;
  for (const Piece& p : pieces) rows = std::max(rows, p.to - p.from);
  auto it = catch_up_graphs_.find(rows);
  if (it == catch_up_graphs_.end()) return false;
  for (const Piece& p : pieces)
    if (p.to < rows) return false;
  const int n = static_cast<int>(pieces.size());
  const int size = it->second->padded_size(n);
  if (size == 0) return false;

  const int w = max_blocks_per_seq_;
  int32_t* tokens = catch_up_.tokens.host.data_as<int32_t>();
  int32_t* positions = catch_up_.positions.host.data_as<int32_t>();
  int64_t* slots = catch_up_.slots.host.data_as<int64_t>();
  int32_t* qsl = catch_up_.qsl.host.data_as<int32_t>();
  int32_t* seq_lens = catch_up_.seq_lens.host.data_as<int32_t>();
  int32_t* tables = catch_up_.tables.host.data_as<int32_t>();
  qsl[0] = 0;
  for (int s = 0; s < size; ++s) {
    int32_t* row = tables + static_cast<size_t>(s) * w;
    std::fill(row, row + w, 0);
    qsl[s + 1] = (s + 1) * rows;
    if (s >= n) {
      for (int j = 0; j < rows; ++j) {
        tokens[s * rows + j] = 0;
        positions[s * rows + j] = j;
        slots[s * rows + j] = -1;
      }
      seq_lens[s] = rows;
      continue;
    }
    const Piece& piece = pieces[static_cast<size_t>(s)];
    const ProposerRequest& r = batch.requests[piece.req];
    for (int j = 0; j < rows; ++j) {
      const int pos = piece.to - rows + j;
      tokens[s * rows + j] = r.tokens[static_cast<size_t>(pos)];
      positions[s * rows + j] = pos;
      slots[s * rows + j] = slot_of(r, pos);
    }
    seq_lens[s] = piece.to;
    const size_t used = std::min(r.block_ids.size(), static_cast<size_t>(w));
    std::copy(r.block_ids.begin(), r.block_ids.begin() + used, row);
  }
  catch_up_.tokens.upload(backend_, static_cast<int64_t>(size) * rows);
  catch_up_.positions.upload(backend_, static_cast<int64_t>(size) * rows);
  catch_up_.slots.upload(backend_, static_cast<int64_t>(size) * rows);
  catch_up_.qsl.upload(backend_, size + 1);
  catch_up_.seq_lens.upload(backend_, size);
  catch_up_.tables.upload(backend_, static_cast<int64_t>(size) * w);
  {
    phase_profile::Scope p("draft.catch_up_forward (graph)");
    SPECULA_CHECK(it->second->replay(size), "internal error: no catch-up graph of {} x {} rows", size, rows);
    if (phase_profile::enabled()) backend_.synchronize();
  }
  ++num_forwards_;
  ++catch_up_graph_replays_;
  sample_first_drafts(batch, pieces, catch_up_graph_logits_.at({rows, size}),
                      [rows](int s) { return s * rows + rows - 1; }, drafts);
  return true;
}

ForwardInput DraftModelProposer::catch_up_graph_input(int size, int rows) {
  ForwardInput in = catch_up_.uniform_input(size, rows);
  in.logits_indices = dc_logits_idx_.slice(0, static_cast<int64_t>(size) * rows);
  // Launch shapes from the longest length any catch-up may have (kernels read the true ones).
  const int longest = std::min(config_.draft_max_model_len, max_blocks_per_seq_ * block_size_);
  in.attn.seq_lens_host.assign(static_cast<size_t>(size), longest);
  in.attn.max_seq_len = longest;
  return in;
}

int DraftModelProposer::step_batch_size(int n) const {
  if (step_graphs_) {
    if (const int size = step_graphs_->padded_size(n)) return size;
  }
  return config_.pad_batch ? config_.pad_batch(n) : n;
}

Tensor DraftModelProposer::run_step(int padded) {
  SPECULA_CHECK(padded >= 1 && padded <= config_.max_num_seqs, "internal error: draft step of {} rows", padded);
  ++num_forwards_;
  if (step_graphs_ && step_graphs_->replay(padded)) {
    ++step_graph_replays_;
    return step_graph_logits_.at(padded);
  }
  return step_forward(padded, /*for_capture=*/false);
}

Tensor DraftModelProposer::step_forward(int padded, bool for_capture) {
  // No draft input position reaches draft_max_model_len, so no step's sequence is longer.
  const int longest = std::min(config_.draft_max_model_len, max_blocks_per_seq_ * block_size_);
  return draft_->forward(for_capture ? step_.capture_input(padded, longest) : step_.input(padded), kv_).logits;
}

// Draft-step graphs. A replay reads only the static step buffers (step_, refilled before each
// step with plain copies) and the draft's KV cache, and writes its K/V slots and the logits at the
// scratch-arena addresses fixed at capture. Those addresses overlap whatever else the arena holds
// during propose(), which is safe because nothing there is read after a replay: the target's
// logits were sampled and verified (ModelRunner::execute) before propose, draft_model reads no
// target hidden states, the catch-up forward's logits are sampled (the first drafts are on the
// host) before the first draft step, and each step's logits are sampled (into q_store_, persistent,
// and host tokens) before the next step is prepared. A device-side draft sampler must keep that
// rule: whatever it carries from one step to the next (tokens, probabilities) lives in
// persistent buffers, never in scratch memory allocated before a replay.
size_t DraftModelProposer::num_catch_up_graphs() const {
  size_t n = 0;
  for (const auto& [rows, graphs] : catch_up_graphs_) n += graphs->size();
  return n;
}

size_t DraftModelProposer::capture_graphs(const std::vector<int>& batch_sizes) {
  SPECULA_CHECK(!kv_.empty(), "internal error: draft_model proposer graphs captured before allocate_kv_cache");
  catch_up_graphs_.clear();
  catch_up_graph_logits_.clear();
  step_graphs_.reset();
  step_graph_logits_.clear();
  std::vector<int> sizes;
  for (int s : batch_sizes)
    if (s > 0 && s <= config_.max_num_seqs) sizes.push_back(s);
  if (sizes.empty()) return 0;

  // Catch-up graphs: r rows per request for sizes whose r * size rows fit the catch-up buffers.
  dc_logits_idx_ = backend_.empty({static_cast<int64_t>(kMaxCatchUpGraphBatch) * kCatchUpGraphRows}, DType::kI32);
  {
    std::vector<int32_t> iota(static_cast<size_t>(dc_logits_idx_.numel()));
    std::iota(iota.begin(), iota.end(), 0);
    backend_.copy(Tensor::from_i32(iota), dc_logits_idx_);
  }
  for (int rows = 1; rows <= kCatchUpGraphRows; ++rows) {
    std::vector<int> fit;
    for (int s : sizes)
      if (s <= kMaxCatchUpGraphBatch && s * rows <= config_.max_num_batched_tokens) fit.push_back(s);
    if (fit.empty()) continue;
    backend_.synchronize();
    catch_up_.upload_uniform_padding(fit.back(), rows);
    backend_.synchronize();
    auto graphs = std::make_unique<PaddedGraphs>(backend_);
    try {
      graphs->capture(fit, [&](int size) {
        catch_up_graph_logits_[{rows, size}] = draft_->forward(catch_up_graph_input(size, rows), kv_).logits;
      });
    } catch (const Error& e) {
      LOG_WARN("CUDA graphs: {}; draft catch-up forwards of {} row(s) per request run eagerly", e.what(), rows);
      graphs.reset();
    }
    if (!graphs || graphs->size() != fit.size()) {
      for (int s : fit) catch_up_graph_logits_.erase({rows, s});
      continue;
    }
    LOG_INFO("CUDA graphs of draft catch-up forwards ({} row(s) per request): batch sizes {}..{} ({} graphs)", rows,
             fit.front(), fit.back(), fit.size());
    catch_up_graphs_[rows] = std::move(graphs);
  }

  // Drafts 2..k only run when k >= 2.
  if (config_.num_speculative_tokens < 2) return num_catch_up_graphs();
  step_.fill_padding(sizes.back());
  auto graphs = std::make_unique<PaddedGraphs>(backend_);
  try {
    graphs->capture(sizes, [&](int size) { step_graph_logits_[size] = step_forward(size, /*for_capture=*/true); });
  } catch (const Error& e) {
    LOG_WARN("CUDA graphs: {}; draft steps of more than {} rows run eagerly", e.what(),
             graphs->empty() ? 0 : graphs->sizes().back());
  }
  for (auto it = step_graph_logits_.begin(); it != step_graph_logits_.end();)
    it = graphs->padded_size(it->first) == it->first ? std::next(it) : step_graph_logits_.erase(it);
  if (graphs->empty()) return num_catch_up_graphs();
  const std::vector<int> got = graphs->sizes();
  LOG_INFO("CUDA graphs of draft steps: batch sizes {}..{} ({} graphs)", got.front(), got.back(), got.size());
  step_graphs_ = std::move(graphs);
  return num_catch_up_graphs() + step_graphs_->size();
}

}  // namespace specula
