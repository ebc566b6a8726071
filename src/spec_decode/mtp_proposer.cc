#include "spec_decode/mtp_proposer.h"

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "core/phase_profile.h"

namespace specula {

MtpProposer::MtpProposer(std::unique_ptr<DeepseekMtp> mtp, Backend& backend, std::unique_ptr<DraftSampler> sampler,
                         const MtpProposerConfig& config)
    : mtp_(std::move(mtp)),
      backend_(backend),
      sampler_(std::move(sampler)),
      config_(config),
      states_(config.max_num_seqs, config.num_speculative_tokens, "mtp") {
  SPECULA_CHECK(mtp_ != nullptr && mtp_->num_layers() > 0, "mtp proposer: no MTP layer");
  SPECULA_CHECK(config.num_speculative_tokens >= 1 && config.max_num_seqs >= 1 && config.max_num_batched_tokens >= 1 &&
                    config.max_model_len >= 2,
                "mtp proposer: bad configuration (k={}, max_num_seqs={}, max_num_batched_tokens={}, max_model_len={})",
                config.num_speculative_tokens, config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len);
  if (!sampler_) sampler_ = make_cpu_draft_sampler(backend);
  hidden_ = mtp_->config().hidden_size;
  q_store_ = backend.empty({static_cast<int64_t>(config.max_num_seqs) * config.num_speculative_tokens, mtp_->config().vocab_size},
                           DType::kF32);
}

void MtpProposer::allocate_kv_cache(int num_blocks, int block_size) {
  SPECULA_CHECK(num_blocks > 0 && block_size > 0, "mtp proposer: bad KV cache shape ({} blocks of {})", num_blocks,
                block_size);
  block_size_ = block_size;
  const DType dtype = backend_.compute_dtype();
  kv_ = allocate_draft_kv_cache(backend_, mtp_->kv_cache_spec(), num_blocks, block_size);
  max_blocks_per_seq_ = ceil_div(config_.max_model_len + config_.num_speculative_tokens, block_size);
  const int64_t t = config_.max_num_batched_tokens, s = config_.max_num_seqs;
  catch_up_.allocate(backend_, config_.max_num_batched_tokens, config_.max_num_seqs, max_blocks_per_seq_, block_size);
  target_rows_.allocate(backend_, t, DType::kI32);
  step_rows_.allocate(backend_, s, DType::kI32);
  step_.allocate(backend_, config_.max_num_seqs, max_blocks_per_seq_, block_size, "MTP K/V", config_.num_speculative_tokens - 1);
  chain_.allocate(backend_, config_.max_num_seqs, config_.num_speculative_tokens);
  d_hidden_ = backend_.empty({t, hidden_}, dtype);
  backend_.zero(d_hidden_);  // read by graph captures before any real row: finite, so routing stays in range
  ds_hidden_ = backend_.empty({s, hidden_}, dtype);
  backend_.zero(ds_hidden_);  // padding rows read it: never uninitialised (NaN) memory
  backend_.synchronize();
}

void MtpProposer::drop_request(std::string_view req_id) { states_.drop(req_id); }

int MtpProposer::draft_probs_row(std::string_view req_id) const { return states_.q_row(req_id); }

int MtpProposer::num_computed(std::string_view req_id) const {
  const State* st = states_.find(req_id);
  return st ? st->num_computed : -1;
}

int MtpProposer::num_inherited(std::string_view req_id) const {
  const State* st = states_.find(req_id);
  return st ? st->num_inherited : -1;
}

void MtpProposer::propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) {
  const size_t n = batch.requests.size();
  drafts.assign(n, {});
  if (n == 0) return;
  SPECULA_CHECK(!kv_.empty(), "internal error: mtp proposer used before allocate_kv_cache");

  // 1. Every request's new MTP positions: those the target computed in this step (their hidden
  // states are in this step's rows) whose next token is known.
  std::vector<int> num_drafts(n, 0);
  std::vector<Piece> pieces;
  int total = 0;
  contexts_.assign(n, {});
  chain_.end();
  last_catch_up_tokens_ = 0;
  const bool chain = config_.greedy_chain && batch.depth > 0 && GreedyDraftChain::applies(batch);
  step_row_min_drafts_ = chain ? 1 : 2;
  for (size_t i = 0; i < n; ++i) {
    const ProposerRequest& r = batch.requests[i];
    State& st = states_.get_or_add(r.req_id);
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
    if (drafting) {
      num_drafts[i] = std::min(batch.depth, r.max_drafts);
      if (!chain) {  // the draft sampler's context (penalties, masks)
        contexts_[i].reserve(r.tokens.size() + static_cast<size_t>(num_drafts[i]));
        contexts_[i].assign(r.tokens.begin(), r.tokens.end());
      }
    }
    pieces.push_back(Piece{i, from, to, drafting});
    total += to - from;
    last_catch_up_tokens_ += to - from;
  }
  if (pieces.empty()) return;
  SPECULA_CHECK(batch.target_hidden_states.defined(),
                "mtp proposer: the target model returned no hidden states (ForwardOutput::hidden_states)");
  SPECULA_CHECK(total <= config_.max_num_batched_tokens && static_cast<int>(pieces.size()) <= config_.max_num_seqs,
                "internal error: MTP catch-up of {} positions / {} requests exceeds max_num_batched_tokens {} / "
                "max_num_seqs {}", total, pieces.size(), config_.max_num_batched_tokens, config_.max_num_seqs);

  // 2. One varlen forward (every position comes from this step's target rows, so it never needs
  // more room than the target's step); the drafting rows sample draft 1.
  std::vector<size_t> rows;  // requests with drafts 2..k (in a chain: every drafting one), in batch order
  int max_drafts = 0;
  for (size_t i = 0; i < n; ++i) {
    if (num_drafts[i] >= step_row_min_drafts_) rows.push_back(i);
    max_drafts = std::max(max_drafts, num_drafts[i]);
  }
  if (chain && !rows.empty()) {
    const int padded = step_batch_size(static_cast<int>(rows.size()));
    SPECULA_CHECK(padded >= static_cast<int>(rows.size()) && padded <= config_.max_num_seqs,
                  "internal error: MTP draft chain of {} rows padded to {} (max_num_seqs {})", rows.size(), padded,
                  config_.max_num_seqs);
    if (max_drafts >= 2) step_.prepare_chain(batch, rows, max_drafts - 1, padded, num_drafts, /*first_back=*/2);
    chain_.begin(rows, padded);
  }
  run_catch_up(batch, pieces, num_drafts, drafts);
  if (chain_.on()) {
    const int padded = chain_.padded();
    chain_.run(step_, max_drafts, num_drafts, [&](int j) { return run_step(padded, layer_for_draft(j)); }, drafts);
    return;
  }
  if (rows.empty()) return;

  // 3. Drafts 2..k: one chained step over every drafting request per draft (rows fixed for the
  // whole loop; a row that has all its drafts idles: no K/V write, result ignored).
  const int real = static_cast<int>(rows.size());
  const int padded = step_batch_size(real);
  SPECULA_CHECK(padded >= real && padded <= config_.max_num_seqs,
                "internal error: MTP draft step of {} rows padded to {} (max_num_seqs {})", real, padded,
                config_.max_num_seqs);
  for (int j = 2; j <= max_drafts; ++j) {
    {
      phase_profile::Scope p("mtp.step_prepare");
      // Draft j's input is draft j-1 at position L - 3 + j (draft 1 came from the row of L - 2).
      step_.prepare(batch, rows, j, padded, drafts, num_drafts, /*upload_tables=*/j == 2, /*first_back=*/2);
    }
    Tensor logits;
    {
      phase_profile::Scope p("mtp.step_forward");
      logits = run_step(padded, layer_for_draft(j));
      if (phase_profile::enabled()) backend_.synchronize();
    }
    phase_profile::Scope sample_phase("mtp.step_sample");
    std::vector<DraftSampleRow> sample_rows;
    std::vector<size_t> owners;
    for (int row = 0; row < real; ++row) {
      const size_t i = rows[static_cast<size_t>(row)];
      if (num_drafts[i] < j) continue;
      const ProposerRequest& r = batch.requests[i];
      contexts_[i].push_back(drafts[i].back());
      const int slot = states_.at(r.req_id).slot;
      const int position = static_cast<int>(r.tokens.size()) + j - 1;  // of the token drafted
      sample_rows.push_back(DraftSampleRow{draft_sampling_row(r, row, position, contexts_[i]), slot * config_.num_speculative_tokens + j - 1});
      owners.push_back(i);
    }
    std::vector<int32_t> tokens = sampler_->sample(logits, sample_rows, &q_store_);
    for (size_t s = 0; s < owners.size(); ++s) drafts[owners[s]].push_back(tokens[s]);
  }
}

void MtpProposer::run_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                               const std::vector<int>& num_drafts, std::vector<std::vector<int32_t>>& drafts) {
  // Pinned staging: the previous forward's copies out of it must have run before it is rewritten.
  backend_.synchronize();
  if (run_uniform_catch_up(batch, pieces, num_drafts, drafts)) return;
  phase_profile::Scope eager_phase("mtp.catch_up (eager)");
  const int bs = block_size_;
  const int num_seqs = static_cast<int>(pieces.size());
  const Tensor& target_hidden = batch.target_hidden_states;
  int32_t* tokens = catch_up_.tokens.host.data_as<int32_t>();
  int32_t* positions = catch_up_.positions.host.data_as<int32_t>();
  int64_t* slots = catch_up_.slots.host.data_as<int64_t>();
  int32_t* hidden_rows = target_rows_.host.data_as<int32_t>();
  int32_t* qsl = catch_up_.qsl.host.data_as<int32_t>();
  int32_t* seq_lens = catch_up_.seq_lens.host.data_as<int32_t>();
  int32_t* logits_idx = catch_up_.logits_idx.host.data_as<int32_t>();
  int32_t* step_rows = step_rows_.host.data_as<int32_t>();
  int t = 0, num_logits = 0, num_step_rows = 0, max_query = 0, max_seq = 0, width = 1;
  std::vector<int32_t> zero_rows;
  std::vector<size_t> sampling;  // pieces whose last row samples draft 1
  qsl[0] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const Piece& piece = pieces[static_cast<size_t>(s)];
    const ProposerRequest& r = batch.requests[piece.req];
    SPECULA_CHECK(r.first_row >= 0 && r.first_row + (piece.to - r.first_position) <= target_hidden.size(0),
                  "internal error: request {} reads target rows [{}, {}) of {}", r.req_id, r.first_row,
                  r.first_row + piece.to - r.first_position, target_hidden.size(0));
    for (int pos = piece.from; pos < piece.to; ++pos, ++t) {
      tokens[t] = r.tokens[static_cast<size_t>(pos) + 1];  // the NEXT token
      positions[t] = pos;
      slots[t] = slot_of(r, pos);
      hidden_rows[t] = r.first_row + (pos - r.first_position);
      if (pos == 0) zero_rows.push_back(t);
    }
    if (piece.drafts) {
      logits_idx[num_logits++] = t - 1;
      sampling.push_back(static_cast<size_t>(s));
      if (num_drafts[piece.req] >= step_row_min_drafts_) step_rows[num_step_rows++] = t - 1;  // as propose's rows
    }
    qsl[s + 1] = t;
    seq_lens[s] = piece.to;
    max_query = std::max(max_query, piece.to - piece.from);
    max_seq = std::max(max_seq, piece.to);
    width = std::max(width, ceil_div(piece.to, bs));
  }
  catch_up_.fill_varlen_tables(batch, pieces, width);
  // The target's hidden rows into our own buffer first: they live in scratch memory that the
  // MTP forward is about to reuse.
  gather_target_rows(target_hidden, t);
  Tensor hidden = d_hidden_.slice(0, t);
  backend_.reset_scratch();

  MtpForwardInput in;
  in.rows = catch_up_.upload_varlen(num_seqs, t, num_logits, max_query, max_seq, width);
  in.hidden = hidden;
  in.zero_embedding_rows = std::move(zero_rows);
  MtpForwardOutput out = mtp_->forward(0, in, kv_[0]);
  ++num_forwards_;
  if (num_step_rows > 0) {
    // The chained steps start from y at each drafting request's last position.
    Tensor y_rows = ds_hidden_.slice(0, num_step_rows);
    backend_.gather_rows(out.y, step_rows_.upload(backend_, num_step_rows), y_rows);
  }
  if (sampling.empty()) return;
  // Logits row l is the l-th drafting piece's.
  std::vector<int> row_of(pieces.size(), -1);
  for (size_t l = 0; l < sampling.size(); ++l) row_of[sampling[l]] = static_cast<int>(l);
  sample_first_drafts(batch, pieces, out.logits, [&row_of](int s) { return row_of[static_cast<size_t>(s)]; }, drafts);
}

void MtpProposer::gather_target_rows(const Tensor& target_hidden, int t) {
  Tensor rows = target_rows_.upload(backend_, t);
  Tensor hidden = d_hidden_.slice(0, t);
  if (target_hidden.dtype() == backend_.compute_dtype()) {
    backend_.gather_rows(target_hidden, rows, hidden);
  } else {
    Tensor gathered = backend_.scratch({t, hidden_}, target_hidden.dtype());
    backend_.gather_rows(target_hidden, rows, gathered);
    backend_.cast(gathered, hidden);
  }
}

void MtpProposer::sample_first_drafts(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                      const Tensor& logits, const std::function<int(int)>& row_of,
                                      std::vector<std::vector<int32_t>>& drafts) {
  phase_profile::Scope sample_phase("mtp.catch_up_sample");
  if (chain_.on()) {  // their argmax, on the device, as the chain's next first drafts
    chain_.add_first_drafts(logits, pieces, row_of);
    return;
  }
  std::vector<DraftSampleRow> sample_rows;
  std::vector<size_t> owners;
  for (size_t s = 0; s < pieces.size(); ++s) {
    const Piece& piece = pieces[s];
    if (!piece.drafts) continue;
    const ProposerRequest& r = batch.requests[piece.req];
    const int slot = states_.at(r.req_id).slot;
    // Draft 1 is the token at position L = piece.to + 1.
    sample_rows.push_back(DraftSampleRow{
        draft_sampling_row(r, row_of(static_cast<int>(s)), piece.to + 1, contexts_[piece.req]), slot * config_.num_speculative_tokens});
    owners.push_back(piece.req);
  }
  if (sample_rows.empty()) return;
  std::vector<int32_t> first = sampler_->sample(logits, sample_rows, &q_store_);
  for (size_t l = 0; l < owners.size(); ++l) drafts[owners[l]].push_back(first[l]);
}

// The catch-up as `rows` rows per request at a padded batch size (header: why real rows come
// first and the rest write nothing). Request s's rows are s * rows .. s * rows + rows - 1: its
// positions from, from + 1, ..., its sequence length from + rows (the causal offset of its
// query rows), its logits row its last real one. A row past a piece's end reads the piece's last
// hidden row and token 0 (finite, unused); padding requests are rows tokens 0 at positions
// 0..rows-1, slot -1, length rows, block 0, hidden row 0.
bool MtpProposer::run_uniform_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                       const std::vector<int>& num_drafts, std::vector<std::vector<int32_t>>& drafts) {
  const bool have_graphs = !catch_up_graphs_.empty();
  if (pieces.empty() || (!have_graphs && !config_.pad_batch)) return false;
  int longest = 0;
  for (const Piece& p : pieces) {
    if (p.from < 1) return false;  // position 0 zeroes its embedding: a host-side choice, not in a graph
    longest = std::max(longest, p.to - p.from);
  }
  // Rows past a piece's end must still lie within the block table's width.
  for (const Piece& p : pieces)
    if (p.from + 1 + config_.num_speculative_tokens > max_blocks_per_seq_ * block_size_) return false;
  const int n = static_cast<int>(pieces.size());
  int rows = 0, size = 0;
  PaddedGraphs* graphs = nullptr;
  if (have_graphs) {
    auto it = catch_up_graphs_.lower_bound(longest);
    if (it == catch_up_graphs_.end()) return false;
    rows = it->first;
    graphs = it->second.get();
    size = graphs->padded_size(n);
  } else {
    if (longest > 1 + config_.num_speculative_tokens) return false;
    rows = longest;
    size = std::min(config_.max_num_seqs, std::max(n, config_.pad_batch(n)));
  }
  if (size == 0 || size < n || size * rows > config_.max_num_batched_tokens) return false;

  const Tensor& target_hidden = batch.target_hidden_states;
  const int w = max_blocks_per_seq_;
  const int t = size * rows;
  {
    phase_profile::Scope prepare_phase("mtp.catch_up_prepare");
    int32_t* tokens = catch_up_.tokens.host.data_as<int32_t>();
    int32_t* positions = catch_up_.positions.host.data_as<int32_t>();
    int64_t* slots = catch_up_.slots.host.data_as<int64_t>();
    int32_t* hidden_rows = target_rows_.host.data_as<int32_t>();
    int32_t* qsl = catch_up_.qsl.host.data_as<int32_t>();
    int32_t* seq_lens = catch_up_.seq_lens.host.data_as<int32_t>();
    int32_t* tables = catch_up_.tables.host.data_as<int32_t>();
    int32_t* logits_idx = catch_up_.logits_idx.host.data_as<int32_t>();
    int32_t* step_rows = step_rows_.host.data_as<int32_t>();
    int num_step_rows = 0;
    qsl[0] = 0;
    for (int s = 0; s < size; ++s) {
      const int base = s * rows;
      int32_t* table = tables + static_cast<size_t>(s) * w;
      std::fill(table, table + w, 0);
      qsl[s + 1] = base + rows;
      if (s >= n) {
        for (int j = 0; j < rows; ++j) {
          tokens[base + j] = 0;
          positions[base + j] = j;
          slots[base + j] = -1;
          hidden_rows[base + j] = 0;
        }
        seq_lens[s] = rows;
        logits_idx[s] = base + rows - 1;
        continue;
      }
      const Piece& piece = pieces[static_cast<size_t>(s)];
      const ProposerRequest& r = batch.requests[piece.req];
      const int real = piece.to - piece.from;
      SPECULA_CHECK(r.first_row >= 0 && r.first_row + (piece.to - r.first_position) <= target_hidden.size(0),
                    "internal error: request {} reads target rows [{}, {}) of {}", r.req_id, r.first_row,
                    r.first_row + piece.to - r.first_position, target_hidden.size(0));
      const int last_row = r.first_row + (piece.to - 1 - r.first_position);
      for (int j = 0; j < rows; ++j) {
        const int pos = piece.from + j;
        positions[base + j] = pos;
        if (j < real) {
          tokens[base + j] = r.tokens[static_cast<size_t>(pos) + 1];  // the NEXT token
          slots[base + j] = slot_of(r, pos);
          hidden_rows[base + j] = r.first_row + (pos - r.first_position);
        } else {
          tokens[base + j] = 0;
          slots[base + j] = -1;
          hidden_rows[base + j] = last_row;
        }
      }
      seq_lens[s] = piece.from + rows;
      logits_idx[s] = base + real - 1;
      if (piece.drafts && num_drafts[piece.req] >= step_row_min_drafts_) step_rows[num_step_rows++] = base + real - 1;
      const size_t used = std::min(r.block_ids.size(), static_cast<size_t>(w));
      std::copy(r.block_ids.begin(), r.block_ids.begin() + used, table);
    }
    std::fill(step_rows + num_step_rows, step_rows + size, 0);
    catch_up_.tokens.upload(backend_, t);
    catch_up_.positions.upload(backend_, t);
    catch_up_.slots.upload(backend_, t);
    catch_up_.qsl.upload(backend_, size + 1);
    catch_up_.seq_lens.upload(backend_, size);
    catch_up_.tables.upload(backend_, static_cast<int64_t>(size) * w);
    catch_up_.logits_idx.upload(backend_, size);
    if (config_.num_speculative_tokens >= 2) step_rows_.upload(backend_, size);
    // Into the static d_hidden_ before the replay, which writes the arena from offset 0, where
    // the target's rows may lie.
    gather_target_rows(target_hidden, t);
  }
  ++num_forwards_;
  ++uniform_catch_ups_;
  Tensor logits;
  if (graphs) {
    phase_profile::Scope p("mtp.catch_up_forward (graph)");
    SPECULA_CHECK(graphs->replay(size), "internal error: no MTP catch-up graph of {} x {} rows", size, rows);
    ++catch_up_graph_replays_;
    logits = catch_up_graph_logits_.at({rows, size});
    if (phase_profile::enabled()) backend_.synchronize();
  } else {
    phase_profile::Scope p("mtp.catch_up_forward (padded, eager)");
    logits = uniform_catch_up_forward(size, rows, /*for_capture=*/false);
  }
  sample_first_drafts(batch, pieces, logits, [](int s) { return s; }, drafts);
  return true;
}

Tensor MtpProposer::uniform_catch_up_forward(int size, int rows, bool for_capture) {
  const int t = size * rows;
  backend_.reset_scratch();  // the same arena offsets at the warm-up, the capture and eager runs
  MtpForwardInput in;
  in.rows = catch_up_.uniform_input(size, rows);
  in.rows.logits_indices = catch_up_.logits_idx.device.slice(0, size);
  AttentionMetadata& md = in.rows.attn;
  if (for_capture) {
    // Launch shapes from the longest length any catch-up may have (kernels read the true ones).
    md.seq_lens_host.assign(static_cast<size_t>(size), max_blocks_per_seq_ * block_size_);
  } else {
    const int32_t* lens = catch_up_.seq_lens.host.data_as<int32_t>();
    md.seq_lens_host.assign(lens, lens + size);
  }
  md.max_seq_len = *std::max_element(md.seq_lens_host.begin(), md.seq_lens_host.end());
  in.hidden = d_hidden_.slice(0, t);
  MtpForwardOutput out = mtp_->forward(0, in, kv_[0]);
  if (config_.num_speculative_tokens >= 2) {
    // The chained steps start from y at each drafting request's last real row.
    Tensor y_rows = ds_hidden_.slice(0, size);
    backend_.gather_rows(out.y, step_rows_.device.slice(0, size), y_rows);
  }
  return out.logits;
}

int MtpProposer::step_batch_size(int n) const {
  // Every layer the steps use was captured at the same sizes (or none was).
  if (!step_graphs_.empty()) {
    if (const int size = step_graphs_.begin()->second->padded_size(n)) return size;
  }
  return config_.pad_batch ? config_.pad_batch(n) : n;
}

size_t MtpProposer::num_step_graphs() const {
  size_t n = 0;
  for (const auto& [layer, graphs] : step_graphs_) n += graphs->size();
  return n;
}

Tensor MtpProposer::run_step(int padded, int layer) {
  SPECULA_CHECK(padded >= 1 && padded <= config_.max_num_seqs, "internal error: MTP draft step of {} rows", padded);
  ++num_forwards_;
  auto it = step_graphs_.find(layer);
  if (it != step_graphs_.end() && it->second->replay(padded)) {
    ++step_graph_replays_;
    return step_graph_logits_.at({layer, padded});
  }
  return step_forward(padded, layer, /*for_capture=*/false);
}

Tensor MtpProposer::step_forward(int padded, int layer, bool for_capture) {
  backend_.reset_scratch();
  MtpForwardInput in;
  in.rows = for_capture ? step_.capture_input(padded, max_blocks_per_seq_ * block_size_) : step_.input(padded);
  Tensor hidden = ds_hidden_.slice(0, padded);
  in.hidden = hidden;
  MtpForwardOutput out = mtp_->forward(layer, in, kv_[static_cast<size_t>(layer)]);
  backend_.copy(out.y, hidden);  // the next step's h: y, in place (its input was read already)
  return out.logits;
}

// Graphs. A chained-step replay reads only static buffers: the step inputs (step_, refilled
// before each step with plain copies), ds_hidden_ (the chained h, which the step itself overwrites
// with its y by a device copy captured in the graph) and the MTP KV cache; a catch-up replay reads
// the catch-up buffers (catch_up_, target_rows_, step_rows_, d_hidden_) and the cache, and writes y rows into ds_hidden_.
// Both write K/V slots and their logits at scratch-arena addresses fixed at capture. Nothing else
// in the arena is read after a replay: the target's hidden rows were gathered into d_hidden_ before
// the catch-up, its logits are sampled (first drafts on the host) before the first step, and each
// step's logits are sampled (q_store_ and host tokens) before the next step is prepared. A
// device-side draft sampler must keep that rule: what it carries between steps lives in persistent
// buffers.
size_t MtpProposer::num_catch_up_graphs() const {
  size_t n = 0;
  for (const auto& [rows, graphs] : catch_up_graphs_) n += graphs->size();
  return n;
}

size_t MtpProposer::capture_graphs(const std::vector<int>& batch_sizes) {
  SPECULA_CHECK(!kv_.empty(), "internal error: MTP proposer graphs captured before allocate_kv_cache");
  step_graphs_.clear();
  step_graph_logits_.clear();
  catch_up_graphs_.clear();
  catch_up_graph_logits_.clear();
  std::vector<int> sizes;
  for (int s : batch_sizes)
    if (s > 0 && s <= config_.max_num_seqs) sizes.push_back(s);
  if (sizes.empty()) return 0;

  // Catch-up graphs: r = 1..1+k rows per request (steady state: 1 + the accepted drafts), for
  // sizes up to kMaxCatchUpGraphBatch whose r * size rows fit the catch-up buffers. Captured over
  // an all-padding batch (d_hidden_ zeroed: finite inputs whatever the router does with them).
  for (int rows = 1; rows <= 1 + config_.num_speculative_tokens; ++rows) {
    std::vector<int> fit;
    for (int s : sizes)
      if (s <= kMaxCatchUpGraphBatch && s * rows <= config_.max_num_batched_tokens) fit.push_back(s);
    if (fit.empty()) continue;
    const int most = fit.back();
    backend_.synchronize();
    for (int s = 0; s < most; ++s) {
      catch_up_.logits_idx.host.data_as<int32_t>()[s] = s * rows + rows - 1;
      step_rows_.host.data_as<int32_t>()[s] = 0;
    }
    catch_up_.upload_uniform_padding(most, rows);
    catch_up_.logits_idx.upload(backend_, most);
    step_rows_.upload(backend_, most);
    backend_.zero(d_hidden_);
    backend_.synchronize();
    auto graphs = std::make_unique<PaddedGraphs>(backend_);
    try {
      graphs->capture(fit, [&](int size) {
        catch_up_graph_logits_[{rows, size}] = uniform_catch_up_forward(size, rows, /*for_capture=*/true);
      });
    } catch (const Error& e) {
      LOG_WARN("CUDA graphs: {}; MTP catch-ups of {} row(s) per request run eagerly", e.what(), rows);
      graphs.reset();
    }
    if (!graphs || graphs->size() != fit.size()) {  // the backend has none, or a capture failed
      for (int s : fit) catch_up_graph_logits_.erase({rows, s});
      continue;
    }
    LOG_INFO("CUDA graphs of MTP catch-ups ({} row(s) per request): batch sizes {}..{} ({} graphs)", rows,
             fit.front(), fit.back(), fit.size());
    catch_up_graphs_[rows] = std::move(graphs);
  }
  backend_.zero(ds_hidden_);  // the captures gathered padding rows' y into it

  std::vector<int> layers;  // the layers drafts 2..k run
  for (int j = 2; j <= config_.num_speculative_tokens; ++j)
    if (std::find(layers.begin(), layers.end(), layer_for_draft(j)) == layers.end()) layers.push_back(layer_for_draft(j));
  if (layers.empty()) return num_catch_up_graphs();
  step_.fill_padding(sizes.back());
  for (int layer : layers) {
    auto graphs = std::make_unique<PaddedGraphs>(backend_);
    try {
      graphs->capture(sizes, [&](int size) {
        step_graph_logits_[{layer, size}] = step_forward(size, layer, /*for_capture=*/true);
      });
    } catch (const Error& e) {
      LOG_WARN("CUDA graphs: {}; MTP draft steps run eagerly", e.what());
      graphs.reset();
    }
    // All layers or none: step_batch_size pads to one set of sizes.
    if (!graphs || graphs->size() != sizes.size()) {
      step_graphs_.clear();
      step_graph_logits_.clear();
      break;
    }
    step_graphs_[layer] = std::move(graphs);
  }
  // The captures ran padding through ds_hidden_: keep its rows finite and deterministic.
  backend_.zero(ds_hidden_);
  if (!step_graphs_.empty())
    LOG_INFO("CUDA graphs of MTP draft steps: batch sizes {}..{} ({} graphs over {} layer(s))", sizes.front(),
             sizes.back(), num_step_graphs(), layers.size());
  return num_catch_up_graphs() + num_step_graphs();
}

}  // namespace specula
