#include "spec/draft_model_proposer.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/logging.h"
#include "core/phase_profile.h"
#include "spec/rejection_math.h"

namespace specula {

namespace {
int ceil_div(int a, int b) { return (a + b - 1) / b; }
}  // namespace

DraftModelProposer::DraftModelProposer(std::unique_ptr<Model> draft, Backend& backend,
                                       std::unique_ptr<DraftSampler> sampler, const DraftModelProposerConfig& config)
    : draft_(std::move(draft)), backend_(backend), sampler_(std::move(sampler)), config_(config) {
  SPECULA_CHECK(draft_ != nullptr, "draft_model proposer: no draft model");
  SPECULA_CHECK(config.max_depth >= 1 && config.max_num_seqs >= 1 && config.max_num_batched_tokens >= 1 &&
                    config.draft_max_model_len >= 2,
                "draft_model proposer: bad configuration (k={}, max_num_seqs={}, max_num_batched_tokens={}, "
                "draft max_model_len={})",
                config.max_depth, config.max_num_seqs, config.max_num_batched_tokens, config.draft_max_model_len);
  if (!sampler_) sampler_ = make_cpu_draft_sampler(backend);
  q_store_ = backend.empty({static_cast<int64_t>(config.max_num_seqs) * config.max_depth, draft_->config().vocab_size},
                           DType::kF32);
  for (int s = config.max_num_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
}

void DraftModelProposer::allocate_kv_cache(int num_blocks, int block_size) {
  SPECULA_CHECK(num_blocks > 0 && block_size > 0, "draft_model proposer: bad KV cache shape ({} blocks of {})",
                num_blocks, block_size);
  block_size_ = block_size;
  const KVCacheSpec spec = draft_->kv_cache_spec();
  const DType dtype = backend_.compute_dtype();
  kv_.assign(static_cast<size_t>(spec.num_layers), KVCacheLayer{});
  for (KVCacheLayer& layer : kv_) {
    layer.k = backend_.empty({num_blocks, block_size, spec.num_kv_heads, spec.head_dim}, dtype);
    layer.v = backend_.empty({num_blocks, block_size, spec.num_kv_heads, spec.v_head_dim}, dtype);
    // As the target's cache (model_runner.cc): zeroed on a device, left to the OS's zero pages on
    // the host.
    if (backend_.device() != Device::kCPU) {
      backend_.zero(layer.k);
      if (layer.v.numel() > 0) backend_.zero(layer.v);
    }
  }

  max_blocks_per_seq_ = ceil_div(config_.max_model_len + config_.max_depth, block_size);
  const int64_t t = config_.max_num_batched_tokens, s = config_.max_num_seqs, w = max_blocks_per_seq_;
  auto pair = [&](Tensor& h, Tensor& d, int64_t n, DType type) {
    h = backend_.empty_host({n}, type);  // pinned where the backend has it: asynchronous uploads
    d = backend_.empty({n}, type);
  };
  pair(h_tokens_, d_tokens_, t, DType::kI32);
  pair(h_positions_, d_positions_, t, DType::kI32);
  pair(h_slots_, d_slots_, t, DType::kI64);
  pair(h_qsl_, d_qsl_, s + 1, DType::kI32);
  pair(h_seq_lens_, d_seq_lens_, s, DType::kI32);
  pair(h_tables_, d_tables_, s * w, DType::kI32);
  pair(h_logits_idx_, d_logits_idx_, s, DType::kI32);
  pair(hs_tokens_, ds_tokens_, s, DType::kI32);
  pair(hs_positions_, ds_positions_, s, DType::kI32);
  pair(hs_slots_, ds_slots_, s, DType::kI64);
  pair(hs_seq_lens_, ds_seq_lens_, s, DType::kI32);
  pair(hs_tables_, ds_tables_, s * w, DType::kI32);
  // A draft step has one query row per sequence: query_start_loc and the logits rows are 0, 1, 2, ...
  // whatever the batch, so they are uploaded once.
  step_qsl_host_.resize(static_cast<size_t>(s) + 1);
  std::iota(step_qsl_host_.begin(), step_qsl_host_.end(), 0);
  ds_qsl_ = backend_.empty({s + 1}, DType::kI32);
  backend_.copy(Tensor::from_i32(step_qsl_host_), ds_qsl_);
  ds_logits_idx_ = backend_.empty({s}, DType::kI32);
  backend_.copy(Tensor::from_i32(std::vector<int32_t>(step_qsl_host_.begin(), step_qsl_host_.end() - 1)), ds_logits_idx_);
  step_seq_lens_host_.assign(static_cast<size_t>(s), 1);
  backend_.synchronize();
}

DraftModelProposer::State& DraftModelProposer::state_for(std::string_view req_id) {
  auto it = states_.find(std::string(req_id));
  if (it != states_.end()) return it->second;
  SPECULA_CHECK(!free_slots_.empty(), "internal error: draft_model proposer tracks more than max_num_seqs ({}) requests",
                config_.max_num_seqs);
  State st;
  st.slot = free_slots_.back();
  free_slots_.pop_back();
  return states_.emplace(std::string(req_id), std::move(st)).first->second;
}

void DraftModelProposer::drop_request(std::string_view req_id) {
  auto it = states_.find(std::string(req_id));
  if (it == states_.end()) return;
  free_slots_.push_back(it->second.slot);
  states_.erase(it);
}

int DraftModelProposer::draft_probs_row(std::string_view req_id) const {
  auto it = states_.find(std::string(req_id));
  return it == states_.end() ? -1 : it->second.slot * config_.max_depth;
}

int DraftModelProposer::num_computed(std::string_view req_id) const {
  auto it = states_.find(std::string(req_id));
  return it == states_.end() ? -1 : it->second.num_computed;
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

int64_t DraftModelProposer::slot_of(const ProposerRequest& r, int pos) const {
  const size_t block = static_cast<size_t>(pos / block_size_);
  SPECULA_CHECK(block < r.block_ids.size(), "internal error: draft K/V position {} of request {} has no block ({} held)",
                pos, r.req_id, r.block_ids.size());
  return static_cast<int64_t>(r.block_ids[block]) * block_size_ + pos % block_size_;
}

Tensor DraftModelProposer::upload(const Tensor& host, Tensor& device, int64_t n) {
  Tensor dst = device.slice(0, n);
  if (n > 0) backend_.copy(host.slice(0, n), dst);
  return dst;
}

SamplingRow DraftModelProposer::sampling_row(const ProposerRequest& r, int logits_row, int position,
                                             const std::vector<int32_t>& context) const {
  // `context` = the request's tokens followed by the drafts so far; the row samples the token at
  // `position` == context.size(), exactly as the target's verification row of that position will.
  SamplingRow row;
  row.logits_row = logits_row;
  row.params = r.params;
  row.seed = r.seed;
  row.position = position;
  row.prompt_token_ids = std::span<const int32_t>(context.data(), static_cast<size_t>(r.num_prompt_tokens));
  row.output_token_ids = std::span<const int32_t>(context.data() + r.num_prompt_tokens,
                                                  static_cast<size_t>(position - r.num_prompt_tokens));
  if (position - r.num_prompt_tokens < r.params->min_tokens) row.masked_token_ids = r.min_tokens_stop_ids;
  return row;
}

void DraftModelProposer::propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) {
  const size_t n = batch.requests.size();
  drafts.assign(n, {});
  // Depth 0: the draft does not run at all; its next drafting step catches up.
  if (batch.depth <= 0 || n == 0) return;
  SPECULA_CHECK(!kv_.empty(), "internal error: draft_model proposer used before allocate_kv_cache");

  // 1. What each request needs: catch up to `target` tokens, then maybe draft.
  std::vector<int> target(n, 0), num_drafts(n, 0);
  std::vector<Piece> pieces;
  contexts_.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    const ProposerRequest& r = batch.requests[i];
    State& st = state_for(r.req_id);
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
      contexts_[i].reserve(r.tokens.size() + static_cast<size_t>(num_drafts[i]));
      contexts_[i].assign(r.tokens.begin(), r.tokens.end());
    } else if (r.sampled) {
      // A decoding request that cannot draft now never will (it is at max_tokens, max_model_len
      // or the draft's length): no catch-up for it.
      target[i] = st.num_computed;
      continue;
    }
    if (st.num_computed < target[i]) pieces.push_back(Piece{i, st.num_computed, target[i], num_drafts[i] > 0});
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
  for (size_t i = 0; i < n; ++i) states_.at(std::string(batch.requests[i].req_id)).num_computed = target[i];

  // 3. Drafts 2..k: one decode step over every drafting request per draft (rows fixed for the
  // whole loop; a row that has all its drafts only idles: no K/V write, result ignored).
  std::vector<size_t> rows;
  int max_drafts = 0;
  for (size_t i = 0; i < n; ++i) {
    if (num_drafts[i] >= 2) rows.push_back(i);
    max_drafts = std::max(max_drafts, num_drafts[i]);
  }
  if (!rows.empty()) {
    const int real = static_cast<int>(rows.size());
    const int padded = step_batch_size(real);
    SPECULA_CHECK(padded >= real && padded <= config_.max_num_seqs,
                  "internal error: draft step of {} rows padded to {} (max_num_seqs {})", real, padded,
                  config_.max_num_seqs);
    for (int j = 2; j <= max_drafts; ++j) {
      {
        phase_profile::Scope p("draft.step_prepare");
        prepare_step(batch, rows, j, padded, drafts, num_drafts, /*upload_tables=*/j == 2);
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
        const int slot = states_.at(std::string(r.req_id)).slot;
        sample_rows.push_back(DraftSampleRow{sampling_row(r, row, position, contexts_[i]), slot * config_.max_depth + j - 1});
        owners.push_back(i);
      }
      std::vector<int32_t> tokens = sampler_->sample(logits, sample_rows, &q_store_);
      for (size_t s = 0; s < owners.size(); ++s) drafts[owners[s]].push_back(tokens[s]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (drafts[i].empty()) continue;
    State& st = states_.at(std::string(batch.requests[i].req_id));
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
  int32_t* tokens = h_tokens_.data_as<int32_t>();
  int32_t* positions = h_positions_.data_as<int32_t>();
  int64_t* slots = h_slots_.data_as<int64_t>();
  int32_t* qsl = h_qsl_.data_as<int32_t>();
  int32_t* seq_lens = h_seq_lens_.data_as<int32_t>();
  int32_t* logits_idx = h_logits_idx_.data_as<int32_t>();
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
  int32_t* tables = h_tables_.data_as<int32_t>();
  for (int s = 0; s < num_seqs; ++s) {
    const ProposerRequest& r = batch.requests[pieces[static_cast<size_t>(s)].req];
    const int used = ceil_div(seq_lens[s], bs);
    int32_t* row = tables + static_cast<size_t>(s) * width;
    std::copy(r.block_ids.begin(), r.block_ids.begin() + used, row);
    std::fill(row + used, row + width, 0);
  }

  ForwardInput in;
  in.token_ids = upload(h_tokens_, d_tokens_, t);
  in.positions = upload(h_positions_, d_positions_, t);
  in.logits_indices = upload(h_logits_idx_, d_logits_idx_, num_logits);
  AttentionMetadata& md = in.attn;
  md.num_seqs = num_seqs;
  md.num_tokens = t;
  md.max_query_len = max_query;
  md.max_seq_len = max_seq;
  md.block_size = bs;
  md.query_start_loc = upload(h_qsl_, d_qsl_, num_seqs + 1);
  md.seq_lens = upload(h_seq_lens_, d_seq_lens_, num_seqs);
  md.slot_mapping = upload(h_slots_, d_slots_, t);
  md.block_tables = upload(h_tables_, d_tables_, static_cast<int64_t>(num_seqs) * width).reshape({num_seqs, width});
  md.query_start_loc_host.assign(qsl, qsl + num_seqs + 1);
  md.seq_lens_host.assign(seq_lens, seq_lens + num_seqs);
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
  std::vector<DraftSampleRow> rows;
  std::vector<size_t> owners;
  for (size_t s = 0; s < pieces.size(); ++s) {
    const Piece& piece = pieces[s];
    if (!piece.drafts) continue;
    const ProposerRequest& r = batch.requests[piece.req];
    const int slot = states_.at(std::string(r.req_id)).slot;
    rows.push_back(DraftSampleRow{sampling_row(r, row_of(static_cast<int>(s)), piece.to, contexts_[piece.req]),
                                  slot * config_.max_depth});
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
  int32_t* tokens = h_tokens_.data_as<int32_t>();
  int32_t* positions = h_positions_.data_as<int32_t>();
  int64_t* slots = h_slots_.data_as<int64_t>();
  int32_t* qsl = h_qsl_.data_as<int32_t>();
  int32_t* seq_lens = h_seq_lens_.data_as<int32_t>();
  int32_t* tables = h_tables_.data_as<int32_t>();
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
  upload(h_tokens_, d_tokens_, static_cast<int64_t>(size) * rows);
  upload(h_positions_, d_positions_, static_cast<int64_t>(size) * rows);
  upload(h_slots_, d_slots_, static_cast<int64_t>(size) * rows);
  upload(h_qsl_, d_qsl_, size + 1);
  upload(h_seq_lens_, d_seq_lens_, size);
  upload(h_tables_, d_tables_, static_cast<int64_t>(size) * w);
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
  const int w = max_blocks_per_seq_;
  const int t = size * rows;
  ForwardInput in;
  in.token_ids = d_tokens_.slice(0, t);
  in.positions = d_positions_.slice(0, t);
  in.logits_indices = dc_logits_idx_.slice(0, t);
  AttentionMetadata& md = in.attn;
  md.num_seqs = size;
  md.num_tokens = t;
  md.max_query_len = rows;
  md.block_size = block_size_;
  md.query_start_loc = d_qsl_.slice(0, size + 1);
  md.seq_lens = d_seq_lens_.slice(0, size);
  md.slot_mapping = d_slots_.slice(0, t);
  md.block_tables = d_tables_.slice(0, static_cast<int64_t>(size) * w).reshape({size, w});
  md.query_start_loc_host.resize(static_cast<size_t>(size) + 1);
  for (int s = 0; s <= size; ++s) md.query_start_loc_host[static_cast<size_t>(s)] = s * rows;
  // Launch shapes from the longest length any catch-up may have (kernels read the true ones).
  const int longest = std::min(config_.draft_max_model_len, w * block_size_);
  md.seq_lens_host.assign(static_cast<size_t>(size), longest);
  md.max_seq_len = longest;
  return in;
}

void DraftModelProposer::prepare_step(const ProposeBatch& batch, const std::vector<size_t>& rows, int step,
                                      int padded, const std::vector<std::vector<int32_t>>& drafts,
                                      const std::vector<int>& num_drafts, bool upload_tables) {
  backend_.synchronize();  // pinned staging: the previous step's uploads must have run
  const int w = max_blocks_per_seq_;
  int32_t* tokens = hs_tokens_.data_as<int32_t>();
  int32_t* positions = hs_positions_.data_as<int32_t>();
  int64_t* slots = hs_slots_.data_as<int64_t>();
  int32_t* seq_lens = hs_seq_lens_.data_as<int32_t>();
  int32_t* tables = hs_tables_.data_as<int32_t>();
  step_max_seq_len_ = 1;
  // Padding rows write nothing and attend to position 0 of the first real row's first block,
  // which holds valid K/V: finite values for kernels that read before they mask.
  const int32_t pad_block = batch.requests[rows.front()].block_ids.front();
  for (int row = 0; row < padded; ++row) {
    if (row >= static_cast<int>(rows.size())) {
      tokens[row] = 0;
      positions[row] = 0;
      slots[row] = -1;
      seq_lens[row] = 1;
      if (upload_tables) {
        int32_t* dst = tables + static_cast<size_t>(row) * w;
        std::fill(dst, dst + w, 0);
        dst[0] = pad_block;
      }
      continue;
    }
    const size_t i = rows[static_cast<size_t>(row)];
    const ProposerRequest& r = batch.requests[i];
    const int first = static_cast<int>(r.tokens.size());  // position of draft 1
    if (num_drafts[i] >= step) {
      // Draft `step` comes from draft step-1 at its position.
      tokens[row] = drafts[i][static_cast<size_t>(step - 2)];
      positions[row] = first + step - 2;
      slots[row] = slot_of(r, positions[row]);
    } else {  // done drafting: idle on its last real position without writing
      tokens[row] = r.tokens.back();
      positions[row] = first - 1;
      slots[row] = -1;
    }
    seq_lens[row] = positions[row] + 1;
    step_max_seq_len_ = std::max(step_max_seq_len_, seq_lens[row]);
    if (upload_tables) {
      int32_t* dst = tables + static_cast<size_t>(row) * w;
      const size_t used = std::min(r.block_ids.size(), static_cast<size_t>(w));
      std::copy(r.block_ids.begin(), r.block_ids.begin() + used, dst);
      std::fill(dst + used, dst + w, 0);
    }
  }
  upload(hs_tokens_, ds_tokens_, padded);
  upload(hs_positions_, ds_positions_, padded);
  upload(hs_slots_, ds_slots_, padded);
  upload(hs_seq_lens_, ds_seq_lens_, padded);
  if (upload_tables) upload(hs_tables_, ds_tables_, static_cast<int64_t>(padded) * w);
  std::copy(seq_lens, seq_lens + padded, step_seq_lens_host_.begin());
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
  const int w = max_blocks_per_seq_;
  ForwardInput in;
  in.token_ids = ds_tokens_.slice(0, padded);
  in.positions = ds_positions_.slice(0, padded);
  in.logits_indices = ds_logits_idx_.slice(0, padded);
  AttentionMetadata& md = in.attn;
  md.num_seqs = padded;
  md.num_tokens = padded;
  md.max_query_len = 1;
  md.block_size = block_size_;
  md.query_start_loc = ds_qsl_.slice(0, padded + 1);
  md.seq_lens = ds_seq_lens_.slice(0, padded);
  md.slot_mapping = ds_slots_.slice(0, padded);
  md.block_tables = ds_tables_.slice(0, static_cast<int64_t>(padded) * w).reshape({padded, w});
  md.query_start_loc_host.assign(step_qsl_host_.begin(), step_qsl_host_.begin() + padded + 1);
  if (for_capture) {
    // No draft input position reaches draft_max_model_len, so no step's sequence is longer.
    const int longest = std::min(config_.draft_max_model_len, w * block_size_);
    md.seq_lens_host.assign(static_cast<size_t>(padded), longest);
    md.max_seq_len = longest;
  } else {
    md.seq_lens_host.assign(step_seq_lens_host_.begin(), step_seq_lens_host_.begin() + padded);
    md.max_seq_len = step_max_seq_len_;
  }
  return draft_->forward(in, kv_).logits;
}

// Draft-step graphs. A replay reads only the static step buffers (ds_*, filled by prepare_step
// with plain copies) and the draft's KV cache, and writes its K/V slots and the logits at the
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
  const int w = max_blocks_per_seq_;
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
    const int most = fit.back();
    backend_.synchronize();
    int32_t* qsl = h_qsl_.data_as<int32_t>();
    qsl[0] = 0;
    for (int s = 0; s < most; ++s) {
      for (int j = 0; j < rows; ++j) {
        h_tokens_.data_as<int32_t>()[s * rows + j] = 0;
        h_positions_.data_as<int32_t>()[s * rows + j] = j;
        h_slots_.data_as<int64_t>()[s * rows + j] = -1;
      }
      qsl[s + 1] = (s + 1) * rows;
      h_seq_lens_.data_as<int32_t>()[s] = rows;
    }
    std::fill_n(h_tables_.data_as<int32_t>(), static_cast<size_t>(most) * w, 0);
    upload(h_tokens_, d_tokens_, static_cast<int64_t>(most) * rows);
    upload(h_positions_, d_positions_, static_cast<int64_t>(most) * rows);
    upload(h_slots_, d_slots_, static_cast<int64_t>(most) * rows);
    upload(h_qsl_, d_qsl_, most + 1);
    upload(h_seq_lens_, d_seq_lens_, most);
    upload(h_tables_, d_tables_, static_cast<int64_t>(most) * w);
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
  if (config_.max_depth < 2) return num_catch_up_graphs();
  // An all-padding batch in the static buffers: token 0 at position 0, no K/V write, one key in
  // block 0 (zeroed or written K/V: finite).
  const int most = sizes.back();
  backend_.synchronize();
  std::fill_n(hs_tokens_.data_as<int32_t>(), most, 0);
  std::fill_n(hs_positions_.data_as<int32_t>(), most, 0);
  std::fill_n(hs_slots_.data_as<int64_t>(), most, int64_t{-1});
  std::fill_n(hs_seq_lens_.data_as<int32_t>(), most, 1);
  std::fill_n(hs_tables_.data_as<int32_t>(), static_cast<size_t>(most) * w, 0);
  upload(hs_tokens_, ds_tokens_, most);
  upload(hs_positions_, ds_positions_, most);
  upload(hs_slots_, ds_slots_, most);
  upload(hs_seq_lens_, ds_seq_lens_, most);
  upload(hs_tables_, ds_tables_, static_cast<int64_t>(most) * w);
  backend_.synchronize();
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
