#include "spec_decode/model_proposer.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "core/logging.h"
#include "core/phase_profile.h"

namespace specula {

namespace {

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The sampling row of the token at `position` == context.size(), `context` being the request's
// tokens followed by the drafts so far: exactly the settings the target's verification row of
// that position will use.
SamplingRow draft_sampling_row(const ProposerRequest& r, int logits_row, int position,
                               const std::vector<int32_t>& context) {
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

// A chained draft's sampling row (DraftChain::kind_for took the request: nothing in it reads the
// context), its logits row set by each draw.
SamplingRow chained_sampling_row(const ProposerRequest& r, int position) {
  SamplingRow row;
  row.params = r.params;
  row.seed = r.seed;
  row.position = position;
  return row;
}

// The proposer's own paged cache on the target's blocks: one layer per spec layer, zeroed on a
// device as the target's cache is (model_runner.cc). On the host it is left to the OS's zero pages
// (touched only as the cache fills) unless `reads_unwritten`: a hidden-state proposer reads
// entries it never wrote (positions a request inherited from shared blocks or skipped while
// shed), which recycled host memory made garbage (eagle3 on the CPU accepted 0.15 of the drafts
// after a shed stretch inside the test suite against 0.70 in a fresh process).
std::vector<KVCacheLayer> allocate_kv_layers(Backend& backend, const KVCacheSpec& spec, int num_blocks,
                                             int block_size, bool reads_unwritten) {
  const DType dtype = backend.compute_dtype();
  std::vector<KVCacheLayer> kv(static_cast<size_t>(spec.num_layers));
  for (KVCacheLayer& layer : kv) {
    layer.k = backend.empty({num_blocks, block_size, spec.num_kv_heads, spec.head_dim}, dtype);
    layer.v = backend.empty({num_blocks, block_size, spec.num_kv_heads, spec.v_head_dim}, dtype);
    if (backend.device() != Device::kCPU || reads_unwritten) {
      backend.zero(layer.k);
      if (layer.v.numel() > 0) backend.zero(layer.v);  // MLA caches have no V
    }
  }
  return kv;
}

}  // namespace

ModelProposer::ModelProposer(Backend& backend, std::unique_ptr<DraftSampler> sampler,
                             const ModelProposerConfig& config, int64_t vocab_size, int64_t target_hidden_size,
                             int64_t chained_hidden_size)
    : backend_(backend),
      config_(config),
      sampler_(std::move(sampler)),
      target_hidden_size_(target_hidden_size),
      chained_hidden_size_(chained_hidden_size > 0 ? chained_hidden_size : target_hidden_size) {
  SPECULA_CHECK(config.num_speculative_tokens >= 1 && config.max_num_seqs >= 1 && config.max_num_batched_tokens >= 1 &&
                    config.max_model_len >= 1,
                "proposer: bad configuration (k={}, max_num_seqs={}, max_num_batched_tokens={}, max_model_len={})",
                config.num_speculative_tokens, config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len);
  if (!sampler_) sampler_ = make_cpu_draft_sampler(backend);
  // SPECULA_SAMPLED_DRAFT_CHAIN=0 / =1 overrides the factory's choice (for comparisons).
  if (const char* env = std::getenv("SPECULA_SAMPLED_DRAFT_CHAIN"); env && (env[0] == '0' || env[0] == '1'))
    config_.chain_sampled_drafts = env[0] == '1';
  q_store_ = backend.empty({static_cast<int64_t>(config.max_num_seqs) * config.num_speculative_tokens, vocab_size},
                           DType::kF32);
  for (int s = config.max_num_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
}

void ModelProposer::CatchUpInputs::allocate(Backend& backend, int max_tokens, int max_num_seqs,
                                            int max_blocks_per_seq) {
  const int64_t t = max_tokens, s = max_num_seqs, w = max_blocks_per_seq;
  tokens.allocate(backend, t, DType::kI32);
  positions.allocate(backend, t, DType::kI32);
  slots.allocate(backend, t, DType::kI64);
  qsl.allocate(backend, s + 1, DType::kI32);
  seq_lens.allocate(backend, s, DType::kI32);
  tables.allocate(backend, s * w, DType::kI32);
  logits_idx.allocate(backend, s, DType::kI32);
}

void ModelProposer::allocate_kv_cache(int num_blocks, int block_size) {
  SPECULA_CHECK(num_blocks > 0 && block_size > 0, "{} proposer: bad KV cache shape ({} blocks of {})", method(),
                num_blocks, block_size);
  block_size_ = block_size;
  kv_cache_name_ = fmt::format("{} K/V", method());
  kv_ = allocate_kv_layers(backend_, kv_cache_spec(), num_blocks, block_size, reads_target_hidden());
  max_blocks_per_seq_ = ceil_div(config_.max_model_len + config_.num_speculative_tokens, block_size);
  const int64_t t = config_.max_num_batched_tokens, s = config_.max_num_seqs;
  catch_up_.allocate(backend_, config_.max_num_batched_tokens, config_.max_num_seqs, max_blocks_per_seq_);
  if (reads_target_hidden()) {
    target_rows_.allocate(backend_, t, DType::kI32);
    step_rows_.allocate(backend_, s, DType::kI32);
  }
  step_.allocate(backend_, config_.max_num_seqs, max_blocks_per_seq_, block_size, kv_cache_name_.c_str(),
                 config_.num_speculative_tokens - 1);
  chain_.allocate(backend_, config_.max_num_seqs, config_.num_speculative_tokens, sampler_.get(), &q_store_);
  if (!reads_target_hidden()) {  // the logits rows of uniform catch-ups (graphs, launch-ahead)
    every_row_logits_idx_ =
        backend_.empty({static_cast<int64_t>(std::max(kMaxCatchUpGraphBatch, config_.max_num_seqs)) * kCatchUpGraphRows},
                       DType::kI32);
    std::vector<int32_t> iota(static_cast<size_t>(every_row_logits_idx_.numel()));
    std::iota(iota.begin(), iota.end(), 0);
    backend_.copy(Tensor::from_i32(iota), every_row_logits_idx_);
  }
  if (reads_target_hidden()) {
    const DType dtype = backend_.compute_dtype();
    target_hidden_ = backend_.empty({t, target_hidden_size_}, dtype);
    backend_.zero(target_hidden_);  // read by graph captures before any real row: finite (MoE routing in range)
    chained_hidden_ = backend_.empty({s, chained_hidden_size_}, dtype);
    backend_.zero(chained_hidden_);  // padding rows read it: never uninitialised (NaN) memory
  }
  backend_.synchronize();
}

ModelProposer::RequestState& ModelProposer::state(std::string_view req_id) {
  auto it = states_.find(req_id);
  if (it != states_.end()) return *it->second;
  SPECULA_CHECK(!free_slots_.empty(), "internal error: {} proposer tracks more than max_num_seqs ({}) requests",
                method(), config_.max_num_seqs);
  std::unique_ptr<RequestState> st = new_request_state();
  st->slot = free_slots_.back();
  free_slots_.pop_back();
  return *states_.emplace(std::string(req_id), std::move(st)).first->second;
}

const ModelProposer::RequestState* ModelProposer::find_state(std::string_view req_id) const {
  auto it = states_.find(req_id);
  return it == states_.end() ? nullptr : it->second.get();
}

void ModelProposer::drop_request(std::string_view req_id) {
  auto it = states_.find(req_id);
  if (it == states_.end()) return;
  free_slots_.push_back(it->second->slot);
  states_.erase(it);
}

int ModelProposer::draft_probs_row(std::string_view req_id) const {
  const RequestState* st = find_state(req_id);
  return st && !st->deterministic_drafts ? st->slot * config_.num_speculative_tokens : -1;
}

int ModelProposer::num_computed(std::string_view req_id) const {
  const RequestState* st = find_state(req_id);
  return st ? st->num_computed : -1;
}

bool ModelProposer::recovering(std::string_view req_id) const {
  const RequestState* st = find_state(req_id);
  return st != nullptr && !st->stale.empty() && st->num_computed - st->stale.back().second < steps_to_recover();
}

int ModelProposer::num_inherited(std::string_view req_id) const {
  const RequestState* st = find_state(req_id);
  return st ? st->num_inherited : -1;
}

void ModelProposer::plan_catch_up(const ProposeBatch& batch, std::vector<int>& num_drafts, std::vector<Piece>& pieces) {
  SPECULA_CHECK(reads_target_hidden(), "internal error: the {} proposer plans no catch-up", method());
  // Every request's new positions: those the target computed in this step (their hidden states
  // are in this step's rows) whose next token is known.
  int total = 0;
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    const ProposerRequest& r = batch.requests[i];
    if (r.shed) continue;
    RequestState& st = state(r.req_id);
    const int len = static_cast<int>(r.tokens.size());
    const int from = r.first_position;
    const int to = std::min({r.num_target_computed, len - 1, r.first_position + r.num_rows});
    // Positions before the step's first one that this request never ran: the shared blocks'
    // entries stand in for them. Past its prefix-cache hit, they are steps shed under load.
    if (st.num_computed < from) {
      st.num_inherited += from - st.num_computed;
      const int shed_from = st.num_computed > 0 ? st.num_computed : std::min(from, r.num_cached_tokens);
      if (shed_from < from) {
        if (!st.stale.empty() && st.stale.back().second == shed_from) {
          st.stale.back().second = from;
        } else {
          st.stale.emplace_back(shed_from, from);
        }
      }
    }
    st.num_computed = std::max(from, to);
    if (to <= from) continue;
    // A request that sampled drafts from its last accepted position, L - 2.
    const bool drafting = r.sampled && batch.depth > 0 && r.max_drafts > 0 && to == len - 1;
    if (drafting) num_drafts[i] = std::min(batch.depth, r.max_drafts);
    pieces.push_back(Piece{i, from, to, drafting});
    total += to - from;
  }
  if (pieces.empty()) return;
  const Tensor& target_hidden = target_features(batch);
  SPECULA_CHECK(target_hidden.defined() && target_hidden.size(1) == target_hidden_size_,
                "{} proposer: the target model returned no hidden states of width {} (ForwardOutput)", method(),
                target_hidden_size_);
  // Every position comes from this step's target rows, so the catch-up never needs more room than
  // the target's step: one forward.
  SPECULA_CHECK(total <= config_.max_num_batched_tokens && static_cast<int>(pieces.size()) <= config_.max_num_seqs,
                "internal error: {} catch-up of {} positions / {} requests exceeds max_num_batched_tokens {} / "
                "max_num_seqs {}", method(), total, pieces.size(), config_.max_num_batched_tokens, config_.max_num_seqs);
  for (const Piece& piece : pieces) {
    const ProposerRequest& r = batch.requests[piece.req];
    SPECULA_CHECK(r.first_row >= 0 && r.first_row + (piece.to - r.first_position) <= target_hidden.size(0),
                  "internal error: request {} reads target rows [{}, {}) of {}", r.req_id, r.first_row,
                  r.first_row + piece.to - r.first_position, target_hidden.size(0));
  }
}

void ModelProposer::plan_attended_blocks(const ProposeBatch& batch) {
  const size_t n = batch.requests.size();
  attended_.assign(n, {});
  for (size_t i = 0; i < n; ++i) attended_[i].blocks = batch.requests[i].block_ids;
  if (!reads_target_hidden()) return;  // a draft model runs every position of its own
  attended_blocks_.resize(n);
  const int bs = block_size_;
  for (size_t i = 0; i < n; ++i) {
    const ProposerRequest& r = batch.requests[i];
    const RequestState* st = r.shed ? nullptr : find_state(r.req_id);
    if (st == nullptr || st->stale.empty()) continue;
    // Blocks wholly inside a shed range hold none of this request's entries. They all lie before
    // the positions it runs now (the ranges end where it was fed again), so dropping them shifts
    // every later key by the same number of blocks.
    std::vector<int32_t>& kept = attended_blocks_[i];
    kept.clear();
    size_t range = 0;
    for (size_t b = 0; b < r.block_ids.size(); ++b) {
      const int first = static_cast<int>(b) * bs, end = first + bs;
      while (range < st->stale.size() && st->stale[range].second < end) ++range;
      const bool stale = range < st->stale.size() && st->stale[range].first <= first && end <= st->stale[range].second;
      if (stale) {
        ++attended_[i].removed;
      } else {
        kept.push_back(r.block_ids[b]);
      }
    }
    attended_[i].blocks = kept;
  }
}

void ModelProposer::propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) {
  const size_t n = batch.requests.size();
  drafts.assign(n, {});
  last_catch_up_tokens_ = 0;
  // Depth 0: a proposer that catches up from tokens does not run at all (its next drafting step
  // runs whatever was accepted meanwhile); one that reads the target's hidden states must not
  // miss them.
  // Drafts left on the device are collected by the next step; a step that failed after proposing
  // left them uncollected: wait for their copy and drop them.
  if (chain_.pending()) finish_drafts();
  if (n == 0 || (batch.depth <= 0 && !needs_every_step())) return;
  SPECULA_CHECK(!kv_.empty(), "internal error: {} proposer used before allocate_kv_cache", method());

  // 1. What each request needs: a catch-up piece, and maybe drafts.
  std::optional<phase_profile::Scope> plan_phase(std::in_place, "draft.plan");
  chain_.end();
  const DraftChain::Kind chain_kind =
      config_.chain_drafts && batch.depth > 0
          ? DraftChain::kind_for(batch, config_.argmax_drafts, config_.chain_sampled_drafts)
          : DraftChain::Kind::kNone;
  const bool chain = chain_kind != DraftChain::Kind::kNone;
  step_row_min_drafts_ = chain ? 1 : 2;
  num_drafts_.assign(n, 0);
  pieces_.clear();
  plan_catch_up(batch, num_drafts_, pieces_);
  plan_attended_blocks(batch);
  contexts_.assign(n, {});
  draft_masks_.resize(n);
  std::vector<size_t> rows;  // requests with a draft-step row, in batch order
  int max_drafts = 0;
  for (size_t i = 0; i < n; ++i) {
    if (num_drafts_[i] > 0 && !chain) {  // the draft sampler's context (penalties, masks)
      const ProposerRequest& r = batch.requests[i];
      contexts_[i].reserve(r.tokens.size() + static_cast<size_t>(num_drafts_[i]));
      contexts_[i].assign(r.tokens.begin(), r.tokens.end());
    }
    if (num_drafts_[i] >= step_row_min_drafts_) rows.push_back(i);
    max_drafts = std::max(max_drafts, num_drafts_[i]);
  }
  for (const Piece& piece : pieces_) last_catch_up_tokens_ += piece.to - piece.from;
  for (size_t i = 0; i < n; ++i)
    if (num_drafts_[i] > 0)
      state(batch.requests[i].req_id).deterministic_drafts = chain_kind == DraftChain::Kind::kArgmax;
  if (batch.ahead && batch.ahead->k == 0) {
    // A plain step's catch-up ahead: at depth 0, one row (its sampled token) of each request fed.
    bool one_row = batch.depth == 0;
    for (const Piece& piece : pieces_) one_row = one_row && !piece.drafts && piece.to - piece.from == 1;
    SPECULA_CHECK(one_row, "internal error: a {} catch-up ahead at depth {} planned more than one row a request",
                  method(), batch.depth);
  } else if (batch.ahead) {
    // can_propose_ahead() said every request drafts a chain from a piece of two rows (tokens), or
    // of one (hidden states: the verification's first position, as if nothing were accepted).
    const int piece_rows = reads_target_hidden() ? 1 : 2;
    bool uniform = pieces_.size() == n;
    for (const Piece& piece : pieces_) uniform = uniform && piece.drafts && piece.to - piece.from == piece_rows;
    SPECULA_CHECK(chain && rows.size() == n && uniform,
                  "internal error: a {} launch-ahead of {} requests planned {} drafting rows and {} pieces", method(), n,
                  rows.size(), pieces_.size());
  }
  if (chain && !rows.empty()) {
    // The chain's rows are the drafting requests in batch order, which is also the order of their
    // drafting pieces in the catch-up forwards (each adds the next first drafts).
    const int padded = step_batch_size(static_cast<int>(rows.size()));
    SPECULA_CHECK(padded >= static_cast<int>(rows.size()) && padded <= config_.max_num_seqs,
                  "internal error: {} draft chain of {} rows padded to {} (max_num_seqs {})", method(), rows.size(),
                  padded, config_.max_num_seqs);
    std::vector<DraftSampleRow> first_rows;
    std::vector<int> row_drafts;
    if (chain_kind == DraftChain::Kind::kSampled) {
      for (size_t i : rows) {
        const ProposerRequest& r = batch.requests[i];
        // Draft j is the token at position tokens.size() + j - 1, as run_draft_steps draws it.
        first_rows.push_back(DraftSampleRow{chained_sampling_row(r, static_cast<int>(r.tokens.size())),
                                            state(r.req_id).slot * config_.num_speculative_tokens});
        row_drafts.push_back(num_drafts_[i]);
      }
    }
    chain_.begin(rows, padded, chain_kind, std::move(first_rows), std::move(row_drafts));
  }

  plan_phase.reset();

  // 2. Catch-up forwards, at most max_num_batched_tokens tokens and max_num_seqs pieces each; the
  // last piece of a drafting request samples its first draft.
  std::vector<Piece> chunk;
  int chunk_tokens = 0;
  if (batch.ahead && !pieces_.empty()) run_ahead_catch_up(batch, pieces_, drafts);
  for (size_t p = 0; p < pieces_.size() && !batch.ahead;) {
    Piece& piece = pieces_[p];
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
  if (!chunk.empty() && !batch.ahead) run_catch_up(batch, chunk, drafts);

  // 3. Drafts 2..k. A chain's inputs are staged while the catch-up runs on the device.
  if (chain_.on()) {
    const int padded = chain_.padded();
    if (max_drafts >= 2) {
      step_.prepare_chain(batch, attended_, chain_.rows(), max_drafts - 1, padded, num_drafts_,
                          /*first_back=*/1 + token_offset());
      if (batch.ahead) step_.shift_chain(batch.ahead->inputs, batch.ahead->sampled, batch.ahead->k, static_cast<int>(n));
    }
    chain_.run(step_, max_drafts, num_drafts_, [&](int j) { return run_step(padded, step_variant(j)); }, drafts,
               fused_chain(), batch.may_leave_drafts_on_device);
    if (chain_.pending()) {
      on_device_.tokens = chain_.device_tokens();
      on_device_.stride = padded;
      on_device_.first.assign(n, -1);
      for (size_t r = 0; r < chain_.rows().size(); ++r) on_device_.first[chain_.rows()[r]] = static_cast<int>(r);
      on_device_ids_.clear();
      for (const ProposerRequest& r : batch.requests) on_device_ids_.emplace_back(r.req_id);
    }
  } else if (!rows.empty()) {
    run_draft_steps(batch, rows, max_drafts, drafts);
  }
  finish_propose(batch, drafts);
  ahead_ids_.clear();
  if (batch.ahead)
    for (const ProposerRequest& r : batch.requests) ahead_ids_.emplace_back(r.req_id);
}

bool ModelProposer::can_propose_ahead(const ProposeBatch& batch) const {
  const bool hidden = reads_target_hidden();
  const int rows = ahead_catch_up_rows(batch);
  if (batch.ahead && batch.ahead->k == 0) {
    // A plain step's catch-up ahead (depth 0): a proposer of tokens alone runs nothing then; a
    // hidden-state one runs each request's position s (its last token's, row s reading token s +
    // 1, the one sampled) as the uniform layout.
    if (!hidden) return true;
    const int n = static_cast<int>(batch.requests.size());
    if (kv_.empty() || chain_.pending() || n == 0 || n > config_.max_num_seqs || n > config_.max_num_batched_tokens ||
        ahead_catch_up_size(n, 1) == 0)
      return false;
    for (const ProposerRequest& r : batch.requests) {
      const int s = static_cast<int>(r.tokens.size()) - 2;
      if (!r.sampled || r.verified_drafts || r.first_position != s || r.num_rows != 1 || s < 1 ||
          s + 1 > max_blocks_per_seq_ * block_size_)
        return false;
    }
    return true;
  }
  if (!batch.ahead || !config_.chain_drafts || !batch.may_leave_drafts_on_device || chain_.pending() ||
      batch.requests.empty() || kv_.empty() || static_cast<int>(batch.requests.size()) > config_.max_num_seqs ||
      rows * static_cast<int>(batch.requests.size()) > config_.max_num_batched_tokens ||
      (hidden && ahead_catch_up_size(static_cast<int>(batch.requests.size()), rows) == 0) ||
      DraftChain::kind_for(batch, config_.argmax_drafts, false) != DraftChain::Kind::kArgmax)
    return false;
  for (const ProposerRequest& r : batch.requests) {
    // Steady: it drafted last step, so its cache holds every position before the verification's
    // first, s (r.tokens: ..., its last token at s, the placeholder). A hidden-state proposer's
    // row p reads token p + 1: it has run positions < s, and its catch-up's rows s .. s + k read
    // the verification's rows, within the block table (the uniform layout's bounds).
    const RequestState* st = find_state(r.req_id);
    const int s = static_cast<int>(r.tokens.size()) - 2;
    if (!r.sampled || !r.verified_drafts || r.shed || r.max_drafts <= 0 || st == nullptr ||
        st->num_computed != s + 1 - token_offset() || !ahead_fits(r, batch.ahead->k))
      return false;
    if (hidden && (r.first_position != s || r.num_rows != batch.ahead->k + 1 || s < 1 ||
                   s + rows > max_blocks_per_seq_ * block_size_))
      return false;
  }
  return true;
}

void ModelProposer::settle_ahead(std::span<const int> accepted) {
  SPECULA_CHECK(accepted.size() == ahead_ids_.size(), "internal error: {} accepted counts for a launch-ahead of {}",
                accepted.size(), ahead_ids_.size());
  for (size_t i = 0; i < ahead_ids_.size(); ++i) {
    auto it = states_.find(ahead_ids_[i]);
    if (it != states_.end()) shift_state(*it->second, accepted[i]);
  }
  ahead_ids_.clear();
}

std::vector<std::vector<int32_t>> ModelProposer::finish_drafts() {
  std::vector<std::vector<int32_t>> drafts;
  if (!chain_.pending()) return drafts;
  chain_.finish(drafts);
  for (size_t i = 0; i < drafts.size(); ++i) {
    auto it = states_.find(on_device_ids_[i]);
    if (!drafts[i].empty() && it != states_.end()) drafts_arrived(*it->second, drafts[i]);
  }
  return drafts;
}

void ModelProposer::run_draft_steps(const ProposeBatch& batch, const std::vector<size_t>& rows, int max_drafts,
                                    std::vector<std::vector<int32_t>>& drafts) {
  // One decode step over every drafting request per draft (rows fixed for the whole loop; a row
  // that has all its drafts only idles: no K/V write, result ignored).
  const int real = static_cast<int>(rows.size());
  const int padded = step_batch_size(real);
  SPECULA_CHECK(padded >= real && padded <= config_.max_num_seqs,
                "internal error: {} draft step of {} rows padded to {} (max_num_seqs {})", method(), real, padded,
                config_.max_num_seqs);
  for (int j = 2; j <= max_drafts; ++j) {
    {
      phase_profile::Scope p("draft.step_prepare");
      // Draft j's input is draft j-1, one position past the row draft 1 came from.
      step_.prepare(batch, attended_, rows, j, padded, drafts, num_drafts_, /*upload_tables=*/j == 2,
                    /*first_back=*/1 + token_offset());
    }
    Tensor logits;
    {
      phase_profile::Scope p("draft.step_forward");
      logits = run_step(padded, step_variant(j));
      if (phase_profile::synchronizing()) backend_.synchronize();
    }
    phase_profile::Scope sample_phase("draft.step_sample");
    std::vector<DraftSampleRow> sample_rows;
    std::vector<size_t> owners;
    for (int row = 0; row < real; ++row) {
      const size_t i = rows[static_cast<size_t>(row)];
      if (num_drafts_[i] < j) continue;
      const ProposerRequest& r = batch.requests[i];
      const int position = static_cast<int>(r.tokens.size()) + j - 1;  // of the token drafted
      contexts_[i].push_back(drafts[i].back());
      const int slot = state(r.req_id).slot;
      sample_rows.push_back(DraftSampleRow{draft_sampling_row(r, row, position, contexts_[i]),
                                           slot * config_.num_speculative_tokens + j - 1});
      sample_rows.back().row.allowed_token_mask = draft_grammar_mask(r, i, drafts[i]);
      owners.push_back(i);
    }
    std::vector<int32_t> tokens = sampler_->sample(logits, sample_rows, &q_store_);
    for (size_t s = 0; s < owners.size(); ++s) drafts[owners[s]].push_back(tokens[s]);
  }
}

std::span<const uint32_t> ModelProposer::draft_grammar_mask(const ProposerRequest& r, size_t i,
                                                            std::span<const int32_t> drafts_so_far) {
  if (!r.grammar) return {};
  GrammarMatcher& grammar = *r.grammar;
  int accepted = 0;
  for (std::span<const int32_t> tokens : {r.grammar_pending, drafts_so_far}) {
    for (int32_t t : tokens) {
      // This step's tokens were sampled under the grammar's mask, and so were the drafts.
      SPECULA_CHECK(grammar.accept_token(t), "internal error: request {} drafts after token {}, which its grammar forbids",
                    r.req_id, t);
      ++accepted;
    }
  }
  std::vector<uint32_t>& mask = draft_masks_[i];
  mask.resize(static_cast<size_t>(grammar.mask_words()));
  grammar.fill_next_token_mask(mask);
  grammar.rollback(accepted);
  return mask;
}

void ModelProposer::run_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                 std::vector<std::vector<int32_t>>& drafts) {
  // The staging buffers are pinned (asynchronous copies): the previous forward's copies out of
  // them must have run before they are rewritten.
  backend_.synchronize();
  if (run_uniform_catch_up(batch, pieces, drafts)) return;
  run_varlen_catch_up(batch, pieces, drafts);
}

void ModelProposer::run_varlen_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                        std::vector<std::vector<int32_t>>& drafts) {
  const int bs = block_size_;
  const int num_seqs = static_cast<int>(pieces.size());
  const bool hidden = reads_target_hidden();
  int32_t* tokens = catch_up_.tokens.host.data_as<int32_t>();
  int32_t* positions = catch_up_.positions.host.data_as<int32_t>();
  int64_t* slots = catch_up_.slots.host.data_as<int64_t>();
  int32_t* qsl = catch_up_.qsl.host.data_as<int32_t>();
  int32_t* seq_lens = catch_up_.seq_lens.host.data_as<int32_t>();
  int32_t* logits_idx = catch_up_.logits_idx.host.data_as<int32_t>();
  int32_t* hidden_rows = hidden ? target_rows_.host.data_as<int32_t>() : nullptr;
  int32_t* step_rows = hidden ? step_rows_.host.data_as<int32_t>() : nullptr;
  DraftForwardInput in;
  int t = 0, num_logits = 0, num_step_rows = 0, max_query = 0, max_seq = 0, width = 1;
  std::vector<size_t> sampling;  // pieces whose last row samples draft 1
  qsl[0] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const Piece& piece = pieces[static_cast<size_t>(s)];
    const ProposerRequest& r = batch.requests[piece.req];
    for (int pos = piece.from; pos < piece.to; ++pos, ++t) {
      tokens[t] = r.tokens[static_cast<size_t>(pos + token_offset())];
      positions[t] = pos;
      slots[t] = slot_of(r, pos);
      if (hidden) hidden_rows[t] = r.first_row + (pos - r.first_position);
      if (pos == 0) in.position_zero_rows.push_back(t);
    }
    if (piece.drafts) {
      logits_idx[num_logits++] = t - 1;
      sampling.push_back(static_cast<size_t>(s));
      if (hidden && num_drafts_[piece.req] >= step_row_min_drafts_) step_rows[num_step_rows++] = t - 1;
    }
    qsl[s + 1] = t;
    seq_lens[s] = piece.to - attended_[piece.req].removed * bs;
    max_query = std::max(max_query, piece.to - piece.from);
    max_seq = std::max(max_seq, seq_lens[s]);
    width = std::max(width, ceil_div(seq_lens[s], bs));
  }
  // Block tables as wide as the widest piece.
  int32_t* tables = catch_up_.tables.host.data_as<int32_t>();
  for (int s = 0; s < num_seqs; ++s) {
    const std::span<const int32_t> blocks = attended_[pieces[static_cast<size_t>(s)].req].blocks;
    const int used = ceil_div(seq_lens[s], bs);
    int32_t* row = tables + static_cast<size_t>(s) * width;
    std::copy(blocks.begin(), blocks.begin() + used, row);
    std::fill(row + used, row + width, 0);
  }
  ForwardInput& fi = in.rows;
  StagedUploads uploads(backend_);
  fi.token_ids = uploads.add(catch_up_.tokens, t);
  fi.positions = uploads.add(catch_up_.positions, t);
  fi.logits_indices = uploads.add(catch_up_.logits_idx, num_logits);
  AttentionMetadata& md = fi.attn;
  md.num_seqs = num_seqs;
  md.num_tokens = t;
  md.max_query_len = max_query;
  md.max_seq_len = max_seq;
  md.block_size = bs;
  md.query_start_loc = uploads.add(catch_up_.qsl, num_seqs + 1);
  md.seq_lens = uploads.add(catch_up_.seq_lens, num_seqs);
  md.slot_mapping = uploads.add(catch_up_.slots, t);
  md.block_tables = uploads.add(catch_up_.tables, static_cast<int64_t>(num_seqs) * width).reshape({num_seqs, width});
  md.query_start_loc_host.assign(qsl, qsl + num_seqs + 1);
  md.seq_lens_host.assign(seq_lens, seq_lens + num_seqs);
  Tensor target_rows;
  if (hidden) {
    target_rows = uploads.add(target_rows_, t);
    uploads.add(step_rows_, num_step_rows);
  }
  uploads.run();
  if (hidden) {
    // The target's hidden rows into our own buffer first: they live in scratch memory that the
    // proposer's forward is about to reuse.
    gather_target_rows(target_features(batch), target_rows);
    in.hidden = target_hidden_.slice(0, t);
  }
  DraftForwardOutput out;
  {
    phase_profile::Scope p("draft.catch_up_forward");
    out = draft_forward(in);
    if (phase_profile::synchronizing()) backend_.synchronize();
  }
  ++num_forwards_;
  if (num_step_rows > 0) {
    // The chained steps start from the hidden state at each drafting request's last position.
    Tensor chained = chained_hidden_.slice(0, num_step_rows);
    backend_.gather_rows(out.hidden, step_rows_.device.slice(0, num_step_rows), chained);
  }
  // The logits rows are those of the drafting pieces, in order.
  std::vector<int> row_of(pieces.size(), -1);
  for (size_t l = 0; l < sampling.size(); ++l) row_of[sampling[l]] = static_cast<int>(l);
  sample_first_drafts(batch, pieces, out.logits, [&](int s) { return row_of[static_cast<size_t>(s)]; }, drafts);
}

void ModelProposer::gather_target_rows(const Tensor& target_hidden, const Tensor& rows) {
  const int64_t t = rows.numel();
  Tensor hidden = target_hidden_.slice(0, t);
  if (target_hidden.dtype() == backend_.compute_dtype()) {
    backend_.gather_rows(target_hidden, rows, hidden);
  } else {
    Tensor gathered = backend_.scratch({t, target_hidden_size_}, target_hidden.dtype());
    backend_.gather_rows(target_hidden, rows, gathered);
    backend_.cast(gathered, hidden);
  }
}

void ModelProposer::sample_first_drafts(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                        const Tensor& logits, const std::function<int(int)>& row_of,
                                        std::vector<std::vector<int32_t>>& drafts) {
  if (chain_.on()) {  // drawn on the device, as the chain's next first drafts
    std::vector<int32_t> logits_rows;
    for (size_t s = 0; s < pieces.size(); ++s)
      if (pieces[s].drafts) logits_rows.push_back(row_of(static_cast<int>(s)));
    chain_.add_first_drafts(logits, logits_rows);
    return;
  }
  std::vector<DraftSampleRow> rows;
  std::vector<size_t> owners;
  for (size_t s = 0; s < pieces.size(); ++s) {
    const Piece& piece = pieces[s];
    if (!piece.drafts) continue;
    const ProposerRequest& r = batch.requests[piece.req];
    const int slot = state(r.req_id).slot;
    // Draft 1 is the token after the last one its row reads.
    const int position = piece.to + token_offset();
    rows.push_back(DraftSampleRow{draft_sampling_row(r, row_of(static_cast<int>(s)), position, contexts_[piece.req]),
                                  slot * config_.num_speculative_tokens});
    rows.back().row.allowed_token_mask = draft_grammar_mask(r, piece.req, {});
    owners.push_back(piece.req);
  }
  if (rows.empty()) return;
  phase_profile::Scope sample_phase("draft.catch_up_sample");
  std::vector<int32_t> first = sampler_->sample(logits, rows, &q_store_);
  for (size_t l = 0; l < owners.size(); ++l) drafts[owners[l]].push_back(first[l]);
}

// The uniform layout (the header says why each shape lays its rows out as it does). Request s's
// rows are s * rows .. s * rows + rows - 1, at positions first, first + 1, ..., its sequence length
// first + rows (the causal offset of its query rows), its logits row its last real one. A
// hidden-state row past a piece's end reads the piece's last hidden row and token 0 (finite,
// unused) and writes nothing; padding requests are rows tokens 0 at positions 0..rows-1, slot -1,
// length rows, block 0, hidden row 0.
bool ModelProposer::run_uniform_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                         std::vector<std::vector<int32_t>>& drafts) {
  const bool hidden = reads_target_hidden();
  const bool have_graphs = !catch_up_graphs_.empty();
  if (pieces.empty() || (!have_graphs && !(hidden && config_.pad_batch))) return false;
  int longest = 0;
  for (const Piece& p : pieces) longest = std::max(longest, p.to - p.from);
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
  for (const Piece& p : pieces) {
    if (hidden) {
      // Position 0 is special (MTP zeroes its embedding, a host-side choice a graph cannot
      // make), and rows past a piece's end must lie within the block table's width.
      if (p.from < 1 || p.from + 1 + config_.num_speculative_tokens > max_blocks_per_seq_ * block_size_) return false;
    } else if (p.to < rows) {  // the rows re-run end at p.to
      return false;
    }
  }

  stage_uniform_catch_up(batch, pieces, rows, size);
  const Tensor logits = run_uniform_catch_up_forward(graphs, size, rows);
  // A tokens-only graph's logits are every row's; a hidden-state one's one row per request.
  if (hidden) {
    sample_first_drafts(batch, pieces, logits, [](int s) { return s; }, drafts);
  } else {
    sample_first_drafts(batch, pieces, logits, [rows](int s) { return s * rows + rows - 1; }, drafts);
  }
  return true;
}

void ModelProposer::stage_uniform_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces, int rows,
                                           int size, int rows_past_last) {
  const bool hidden = reads_target_hidden();
  const int n = static_cast<int>(pieces.size());
  const int w = max_blocks_per_seq_;
  const int t = size * rows;
  {
    phase_profile::Scope prepare_phase("draft.catch_up_prepare");
    if (catch_up_uploaded_) catch_up_uploaded_->wait();  // pinned staging: the last uploads ran
    int32_t* tokens = catch_up_.tokens.host.data_as<int32_t>();
    int32_t* positions = catch_up_.positions.host.data_as<int32_t>();
    int64_t* slots = catch_up_.slots.host.data_as<int64_t>();
    int32_t* qsl = catch_up_.qsl.host.data_as<int32_t>();
    int32_t* seq_lens = catch_up_.seq_lens.host.data_as<int32_t>();
    int32_t* tables = catch_up_.tables.host.data_as<int32_t>();
    int32_t* logits_idx = catch_up_.logits_idx.host.data_as<int32_t>();
    int32_t* hidden_rows = hidden ? target_rows_.host.data_as<int32_t>() : nullptr;
    int32_t* step_rows = hidden ? step_rows_.host.data_as<int32_t>() : nullptr;
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
          if (hidden) hidden_rows[base + j] = 0;
        }
        seq_lens[s] = rows;
        logits_idx[s] = base + rows - 1;
        continue;
      }
      const Piece& piece = pieces[static_cast<size_t>(s)];
      const ProposerRequest& r = batch.requests[piece.req];
      const int first = hidden ? piece.from : piece.to - rows;
      const int last = piece.to - 1;
      for (int j = 0; j < rows; ++j) {
        const int pos = first + j;
        positions[base + j] = pos;
        if (pos <= last + rows_past_last) {
          // (a launch-ahead's rows past the piece get their tokens on the device)
          tokens[base + j] = pos <= last ? r.tokens[static_cast<size_t>(pos + token_offset())] : 0;
          slots[base + j] = slot_of(r, pos);
          if (hidden) hidden_rows[base + j] = r.first_row + (pos - r.first_position);
        } else {
          tokens[base + j] = 0;
          slots[base + j] = -1;
          if (hidden) hidden_rows[base + j] = r.first_row + (last - r.first_position);
        }
      }
      seq_lens[s] = first + rows - attended_[piece.req].removed * block_size_;
      logits_idx[s] = base + last - first;
      if (hidden && piece.drafts && num_drafts_[piece.req] >= step_row_min_drafts_)
        step_rows[num_step_rows++] = base + last - first;
      const std::span<const int32_t> blocks = attended_[piece.req].blocks;
      const size_t used = std::min(blocks.size(), static_cast<size_t>(w));
      std::copy(blocks.begin(), blocks.begin() + used, table);
    }
    StagedUploads uploads(backend_);
    uploads.add(catch_up_.tokens, t);
    uploads.add(catch_up_.positions, t);
    uploads.add(catch_up_.slots, t);
    uploads.add(catch_up_.qsl, size + 1);
    uploads.add(catch_up_.seq_lens, size);
    uploads.add(catch_up_.tables, static_cast<int64_t>(size) * w);
    Tensor target_rows;
    if (hidden) {
      uploads.add(catch_up_.logits_idx, size);
      std::fill(step_rows + num_step_rows, step_rows + size, 0);
      if (config_.num_speculative_tokens >= 2) uploads.add(step_rows_, size);
      target_rows = uploads.add(target_rows_, t);
    }
    uploads.run();
    // Into the static target_hidden_ before the replay, which writes the arena from offset 0,
    // where the target's rows may lie.
    if (hidden) gather_target_rows(target_features(batch), target_rows);
    catch_up_uploaded_ = backend_.record_event();
  }
}

void ModelProposer::run_ahead_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                       std::vector<std::vector<int32_t>>& drafts) {
  if (reads_target_hidden()) {
    run_ahead_hidden_catch_up(batch, pieces, drafts);
    return;
  }
  // Staged as if no draft were accepted: positions s, s + 1 (s: the verification's first) with its
  // last token and the placeholder; the shift moves them to s + a, s + a + 1 and writes the last
  // accepted token and the target's next one, the catch-up of a steady drafting step.
  constexpr int rows = 2;
  const int n = static_cast<int>(pieces.size());
  PaddedGraphs* graphs = nullptr;
  int size = n;
  if (auto it = catch_up_graphs_.find(rows); it != catch_up_graphs_.end()) {
    if (const int padded = it->second->padded_size(n); padded > 0) {
      graphs = it->second.get();
      size = padded;
    }
  }
  stage_uniform_catch_up(batch, pieces, rows, size);
  const int w = max_blocks_per_seq_;
  AcceptedShift shift;
  shift.inputs = batch.ahead->inputs;
  shift.sampled = batch.ahead->sampled;
  shift.num_requests = n;
  shift.k = batch.ahead->k;
  shift.positions = catch_up_.positions.device.slice(0, size * rows);
  shift.slots = catch_up_.slots.device.slice(0, size * rows);
  shift.tokens = catch_up_.tokens.device.slice(0, size * rows);
  shift.entries = rows;
  shift.request_stride = rows;
  shift.entry_stride = 1;
  shift.seq_lens = catch_up_.seq_lens.device.slice(0, size);
  shift.seq_lens_request_stride = 1;
  shift.block_tables = catch_up_.tables.device.slice(0, static_cast<int64_t>(size) * w).reshape({size, w});
  shift.block_size = block_size_;
  backend_.shift_by_accepted(shift);
  // The staged lengths are short of the true ones by what was accepted: launch shapes take k
  // more (on the CPU the device side is host memory and holds the true ones).
  const Tensor logits =
      run_uniform_catch_up_forward(graphs, size, rows, backend_.device() == Device::kCPU ? 0 : batch.ahead->k);
  sample_first_drafts(batch, pieces, logits, [](int s) { return s * rows + rows - 1; }, drafts);
}

int ModelProposer::ahead_catch_up_rows(const ProposeBatch& batch) const {
  return !batch.ahead ? 0 : reads_target_hidden() ? batch.ahead->k + 1 : 2;
}

int ModelProposer::ahead_catch_up_size(int n, int rows) const {
  int size = n;
  if (auto it = catch_up_graphs_.find(rows); it != catch_up_graphs_.end()) {
    size = it->second->padded_size(n);
  } else if (!catch_up_graphs_.empty()) {
    return 0;  // graphs of other shapes only: an eager catch-up would cost more than the host's wait
  } else if (config_.pad_batch) {
    size = std::min(config_.max_num_seqs, std::max(n, config_.pad_batch(n)));
  }
  return size >= n && size * rows <= config_.max_num_batched_tokens ? size : 0;
}

void ModelProposer::run_ahead_hidden_catch_up(const ProposeBatch& batch, const std::vector<Piece>& pieces,
                                              std::vector<std::vector<int32_t>>& drafts) {
  // Every row the verification ran, s .. s + k: row j reads its hidden state and the target's
  // token of row j (token s + j + 1 where drafts 1..j were accepted). Rows past s + a (a: the
  // drafts accepted) write entries at positions the chain and the next catch-up write again
  // before any row attends to them. The first draft and the chain start from row a: the staged
  // row 0 moved by a on the device.
  const int rows = ahead_catch_up_rows(batch);
  const int n = static_cast<int>(pieces.size());
  const int size = ahead_catch_up_size(n, rows);
  SPECULA_CHECK(size >= n, "internal error: no {} launch-ahead catch-up of {} x {} rows", method(), n, rows);
  auto it = catch_up_graphs_.find(rows);
  PaddedGraphs* graphs = it != catch_up_graphs_.end() ? it->second.get() : nullptr;
  stage_uniform_catch_up(batch, pieces, rows, size, /*rows_past_last=*/rows - 1);
  const int64_t t = static_cast<int64_t>(n) * rows;
  Tensor tokens = catch_up_.tokens.device.slice(0, t);
  if (batch.ahead->k == 0) {
    // A plain step's: each row staged its request's name for the sampled token, which the feed
    // replaces (the requests shed this step have no row); nothing to draft or to move.
    backend_.feed_tokens(tokens, batch.ahead->sampled);
    run_uniform_catch_up_forward(graphs, size, rows);
    return;
  }
  backend_.copy(batch.ahead->sampled.slice(0, t), tokens);
  AcceptedShift shift;
  shift.inputs = batch.ahead->inputs;
  shift.sampled = batch.ahead->sampled;
  shift.num_requests = n;
  shift.k = batch.ahead->k;
  shift.entries = 1;
  shift.request_stride = 1;
  shift.positions = catch_up_.logits_idx.device.slice(0, n);
  backend_.shift_by_accepted(shift);
  if (config_.num_speculative_tokens >= 2) {
    shift.positions = step_rows_.device.slice(0, n);
    backend_.shift_by_accepted(shift);
  }
  const Tensor logits = run_uniform_catch_up_forward(graphs, size, rows);
  sample_first_drafts(batch, pieces, logits, [](int s) { return s; }, drafts);
}

Tensor ModelProposer::run_uniform_catch_up_forward(PaddedGraphs* graphs, int size, int rows, int lens_slack) {
  ++num_forwards_;
  ++uniform_catch_ups_;
  if (graphs) {
    phase_profile::Scope p("draft.catch_up_forward (graph)");
    SPECULA_CHECK(graphs->replay(size), "internal error: no {} catch-up graph of {} x {} rows", method(), size, rows);
    ++catch_up_graph_replays_;
    if (phase_profile::synchronizing()) backend_.synchronize();
    return catch_up_graph_logits_.at({rows, size});
  }
  phase_profile::Scope p("draft.catch_up_forward (padded, eager)");
  return uniform_catch_up_forward(size, rows, /*for_capture=*/false, lens_slack);
}

Tensor ModelProposer::uniform_catch_up_forward(int size, int rows, bool for_capture, int lens_slack) {
  const int t = size * rows;
  const int w = max_blocks_per_seq_;
  DraftForwardInput in;
  ForwardInput& fi = in.rows;
  fi.token_ids = catch_up_.tokens.device.slice(0, t);
  fi.positions = catch_up_.positions.device.slice(0, t);
  fi.logits_indices = reads_target_hidden() ? catch_up_.logits_idx.device.slice(0, size)
                                            : every_row_logits_idx_.slice(0, t);
  AttentionMetadata& md = fi.attn;
  md.num_seqs = size;
  md.num_tokens = t;
  md.max_query_len = rows;
  md.block_size = block_size_;
  md.query_start_loc = catch_up_.qsl.device.slice(0, size + 1);
  md.seq_lens = catch_up_.seq_lens.device.slice(0, size);
  md.slot_mapping = catch_up_.slots.device.slice(0, t);
  md.block_tables = catch_up_.tables.device.slice(0, static_cast<int64_t>(size) * w).reshape({size, w});
  md.query_start_loc_host.resize(static_cast<size_t>(size) + 1);
  for (int s = 0; s <= size; ++s) md.query_start_loc_host[static_cast<size_t>(s)] = s * rows;
  if (for_capture) {
    // Launch shapes from the longest length any catch-up may have (kernels read the true ones).
    md.seq_lens_host.assign(static_cast<size_t>(size), longest_sequence());
  } else {
    // On the CPU the device side is host memory and holds the true lengths (a launch-ahead moves
    // them there); elsewhere the staged ones, with the slack a launch-ahead may add.
    const Tensor& staged = backend_.device() == Device::kCPU ? catch_up_.seq_lens.device : catch_up_.seq_lens.host;
    const int32_t* lens = staged.data_as<int32_t>();
    md.seq_lens_host.resize(static_cast<size_t>(size));
    for (int s = 0; s < size; ++s) md.seq_lens_host[static_cast<size_t>(s)] = lens[s] + lens_slack;
  }
  md.max_seq_len = *std::max_element(md.seq_lens_host.begin(), md.seq_lens_host.end());
  if (reads_target_hidden()) in.hidden = target_hidden_.slice(0, t);
  DraftForwardOutput out = draft_forward(in);
  if (reads_target_hidden() && config_.num_speculative_tokens >= 2) {
    // The chained steps start from the hidden state at each drafting request's last real row.
    Tensor chained = chained_hidden_.slice(0, size);
    backend_.gather_rows(out.hidden, step_rows_.device.slice(0, size), chained);
  }
  return out.logits;
}

int ModelProposer::step_batch_size(int n) const {
  // Every variant was captured at the same sizes (or none was).
  if (!step_graphs_.empty()) {
    if (const int size = step_graphs_.begin()->second->padded_size(n)) return size;
  }
  return config_.pad_batch ? config_.pad_batch(n) : n;
}

Tensor ModelProposer::run_step(int padded, int variant) {
  SPECULA_CHECK(padded >= 1 && padded <= config_.max_num_seqs, "internal error: {} draft step of {} rows", method(),
                padded);
  ++num_forwards_;
  auto it = step_graphs_.find(variant);
  if (it != step_graphs_.end() && it->second->replay(padded)) {
    ++step_graph_replays_;
    return step_graph_logits_.at({variant, padded});
  }
  return step_forward(padded, variant, /*for_capture=*/false);
}

Tensor ModelProposer::step_forward(int padded, int variant, bool for_capture) {
  DraftForwardInput in;
  in.rows = for_capture ? step_.capture_input(padded, longest_sequence()) : step_.input(padded);
  in.variant = variant;
  in.from_target = false;
  if (reads_target_hidden()) in.hidden = chained_hidden_.slice(0, padded);
  DraftForwardOutput out = draft_forward(in);
  if (reads_target_hidden()) backend_.copy(out.hidden, in.hidden);  // the next step's input (read already)
  return out.logits;
}

size_t ModelProposer::num_step_graphs() const {
  size_t n = 0;
  for (const auto& [variant, graphs] : step_graphs_) n += graphs->size();
  return n;
}

size_t ModelProposer::num_catch_up_graphs() const {
  size_t n = 0;
  for (const auto& [rows, graphs] : catch_up_graphs_) n += graphs->size();
  return n;
}

void ModelProposer::stage_catch_up_capture(int most, int rows) {
  const int64_t w = max_blocks_per_seq_;
  int32_t* q = catch_up_.qsl.host.data_as<int32_t>();
  q[0] = 0;
  for (int s = 0; s < most; ++s) {
    for (int j = 0; j < rows; ++j) {
      catch_up_.tokens.host.data_as<int32_t>()[s * rows + j] = 0;
      catch_up_.positions.host.data_as<int32_t>()[s * rows + j] = j;
      catch_up_.slots.host.data_as<int64_t>()[s * rows + j] = -1;
    }
    q[s + 1] = (s + 1) * rows;
    catch_up_.seq_lens.host.data_as<int32_t>()[s] = rows;
  }
  std::fill_n(catch_up_.tables.host.data_as<int32_t>(), static_cast<size_t>(most) * w, 0);
  catch_up_.tokens.upload(backend_, static_cast<int64_t>(most) * rows);
  catch_up_.positions.upload(backend_, static_cast<int64_t>(most) * rows);
  catch_up_.slots.upload(backend_, static_cast<int64_t>(most) * rows);
  catch_up_.qsl.upload(backend_, most + 1);
  catch_up_.seq_lens.upload(backend_, most);
  catch_up_.tables.upload(backend_, most * w);
  if (reads_target_hidden()) {
    for (int s = 0; s < most; ++s) {
      catch_up_.logits_idx.host.data_as<int32_t>()[s] = s * rows + rows - 1;
      step_rows_.host.data_as<int32_t>()[s] = 0;
    }
    catch_up_.logits_idx.upload(backend_, most);
    step_rows_.upload(backend_, most);
    backend_.zero(target_hidden_);  // finite inputs whatever a router does with them
  }
}

size_t ModelProposer::capture_graphs(const std::vector<int>& batch_sizes) {
  SPECULA_CHECK(!kv_.empty(), "internal error: {} proposer graphs captured before allocate_kv_cache", method());
  catch_up_graphs_.clear();
  catch_up_graph_logits_.clear();
  step_graphs_.clear();
  step_graph_logits_.clear();
  std::vector<int> sizes;
  for (int s : batch_sizes)
    if (s > 0 && s <= config_.max_num_seqs) sizes.push_back(s);
  if (sizes.empty()) return 0;

  // Catch-up graphs: r rows per request (tokens only: 1..kCatchUpGraphRows; hidden states:
  // 1..1+k, steady state being 1 + the accepted drafts), for sizes up to kMaxCatchUpGraphBatch
  // whose r * size rows fit the catch-up buffers. Captured over an all-padding batch.
  const PaddedGraphs::Recorder record = [this](const std::function<void()>& work) { return record_graph(work); };
  const bool hidden = reads_target_hidden();
  const int max_rows = hidden ? 1 + config_.num_speculative_tokens : kCatchUpGraphRows;
  for (int rows = 1; rows <= max_rows; ++rows) {
    std::vector<int> fit;
    for (int s : sizes)
      if (s <= kMaxCatchUpGraphBatch && s * rows <= config_.max_num_batched_tokens) fit.push_back(s);
    if (fit.empty()) continue;
    backend_.synchronize();
    stage_catch_up_capture(fit.back(), rows);
    backend_.synchronize();
    auto graphs = std::make_unique<PaddedGraphs>(backend_, record);
    try {
      graphs->capture(fit, [&](int size) {
        catch_up_graph_logits_[{rows, size}] = uniform_catch_up_forward(size, rows, /*for_capture=*/true);
      });
    } catch (const Error& e) {
      LOG_WARN("CUDA graphs: {}; {} catch-ups of {} row(s) per request run eagerly", e.what(), method(), rows);
      graphs.reset();
    }
    if (!graphs || graphs->size() != fit.size()) {  // the backend has none, or a capture failed
      for (int s : fit) catch_up_graph_logits_.erase({rows, s});
      continue;
    }
    LOG_INFO("CUDA graphs of {} catch-ups ({} row(s) per request): batch sizes {}..{} ({} graphs)", method(), rows,
             fit.front(), fit.back(), fit.size());
    catch_up_graphs_[rows] = std::move(graphs);
  }
  if (hidden) backend_.zero(chained_hidden_);  // the captures gathered padding rows into it

  // Draft-step graphs, per variant the steps 2..k use.
  std::vector<int> variants;
  for (int j = 2; j <= config_.num_speculative_tokens; ++j)
    if (std::find(variants.begin(), variants.end(), step_variant(j)) == variants.end())
      variants.push_back(step_variant(j));
  if (variants.empty()) return num_catch_up_graphs();
  step_.fill_padding(sizes.back());
  for (int variant : variants) {
    auto graphs = std::make_unique<PaddedGraphs>(backend_, record);
    try {
      graphs->capture(sizes, [&](int size) {
        step_graph_logits_[{variant, size}] = step_forward(size, variant, /*for_capture=*/true);
      });
    } catch (const Error& e) {
      LOG_WARN("CUDA graphs: {}; {} draft steps of more than {} rows run eagerly", e.what(), method(),
               graphs->empty() ? 0 : graphs->sizes().back());
    }
    for (auto it = step_graph_logits_.begin(); it != step_graph_logits_.end();)
      it = it->first.first != variant || graphs->padded_size(it->first.second) == it->first.second
               ? std::next(it)
               : step_graph_logits_.erase(it);
    // step_batch_size pads to one set of sizes: a lone variant keeps what it captured, several
    // keep graphs only when each captured every size.
    if (graphs->empty() || (variants.size() > 1 && graphs->size() != sizes.size())) {
      step_graphs_.clear();
      step_graph_logits_.clear();
      break;
    }
    step_graphs_[variant] = std::move(graphs);
  }
  if (hidden) backend_.zero(chained_hidden_);  // the captures ran padding through it
  if (!step_graphs_.empty()) {
    const std::vector<int> got = step_graphs_.begin()->second->sizes();
    LOG_INFO("CUDA graphs of {} draft steps: batch sizes {}..{} ({} graphs over {} variant(s))", method(),
             got.front(), got.back(), num_step_graphs(), variants.size());
  }
  return num_catch_up_graphs() + num_step_graphs();
}

}  // namespace specula
