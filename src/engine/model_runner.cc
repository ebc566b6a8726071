#include "engine/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "core/error.h"
#include "core/phase_profile.h"
#include "sampling/rejection_sampler.h"
#include "engine/scheduler_output.h"
#include "engine/speculator.h"

namespace specula {

namespace {
int ceil_div(int a, int b) { return (a + b - 1) / b; }

// SPECULA_LAUNCH_AHEAD=0 turns the launch-ahead and the catch-up ahead off (for comparing).
bool launch_ahead_enabled() {
  const char* v = std::getenv("SPECULA_LAUNCH_AHEAD");
  return v == nullptr || std::string_view(v) != "0";
}

// Byte offsets of a step's input arrays in the packed upload: the 8-byte slots first, the block
// table (whose width varies from step to step) last, so that the arrays a graph reads depend only
// on its tokens, logits rows and sequences.
struct InputLayout {
  size_t slots = 0, tokens = 0, positions = 0, logits_indices = 0, query_start_loc = 0, seq_lens = 0,
         block_tables = 0, bytes = 0;
};

InputLayout input_layout(int64_t t, int64_t num_logits, int64_t num_seqs, int64_t table_entries) {
  InputLayout l;
  size_t at = 0;
  auto take = [&](size_t& field, int64_t n, size_t width) {
    field = at;
    at += static_cast<size_t>(n) * width;
  };
  take(l.slots, t, sizeof(int64_t));
  take(l.tokens, t, sizeof(int32_t));
  take(l.positions, t, sizeof(int32_t));
  take(l.logits_indices, num_logits, sizeof(int32_t));
  take(l.query_start_loc, num_seqs + 1, sizeof(int32_t));
  take(l.seq_lens, num_seqs, sizeof(int32_t));
  take(l.block_tables, table_entries, sizeof(int32_t));
  l.bytes = at;
  return l;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Tensor byte_view(const Tensor& bytes, size_t offset, int64_t n, DType dtype) {
  return Tensor::from_blob(static_cast<char*>(bytes.data()) + offset, {n}, dtype, bytes.device(),
                           std::make_shared<Tensor>(bytes));
}
}  // namespace

StepCounts ModelExecutor::counts_of(const ModelRunnerOutput& out) {
  StepCounts c;
  c.num_sampled.reserve(out.sampled_token_ids.size());
  for (const std::vector<int32_t>& t : out.sampled_token_ids) c.num_sampled.push_back(static_cast<int>(t.size()));
  c.draft_token_ids = out.draft_token_ids;
  c.spec_depth = out.spec_depth;
  c.proposer_launched_ahead = out.proposer_launched_ahead;
  return c;
}

StepCounts ModelExecutor::submit(const SchedulerOutput& scheduled, const HostWork& host_work) {
  submitted_.push_back(execute(scheduled));
  StepCounts counts = counts_of(submitted_.back());
  if (host_work) host_work();
  return counts;
}

ModelRunnerOutput ModelExecutor::collect() {
  SPECULA_CHECK(!submitted_.empty(), "internal error: no submitted step to collect");
  ModelRunnerOutput out = std::move(submitted_.front());
  submitted_.pop_front();
  return out;
}

ModelRunner::ModelRunner(Model& model, Backend& backend, Sampler& sampler, const ModelRunnerConfig& config)
    : model_(model), backend_(backend), sampler_(sampler), rejection_sampler_(make_cpu_rejection_sampler(backend)),
      config_(config) {
  SPECULA_CHECK(config.num_blocks > 0, "model runner: the KV cache needs at least one block");
  const KVCacheSpec spec = model.kv_cache_spec();
  const DType dtype = config.kv_cache_dtype.value_or(backend.compute_dtype());
  kv_.resize(static_cast<size_t>(spec.num_layers));
  // An fp8 cache takes the scales it is given, else the checkpoint's where it has them (1.0
  // otherwise).
  const std::vector<KVCacheScales> scales =
      dtype != DType::kF8E4M3               ? std::vector<KVCacheScales>{}
      : !config.kv_cache_scales.empty() ? config.kv_cache_scales
                                        : model.kv_cache_scales();
  SPECULA_CHECK(scales.empty() || scales.size() == kv_.size(),
                "internal error: {} KV cache scales for {} cache layers", scales.size(), kv_.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    kv_[i].k_scale = scales[i].k;
    kv_[i].v_scale = scales[i].v;
  }
  for (KVCacheLayer& layer : kv_) {
    layer.k = backend.empty({config.num_blocks, config.block_size, spec.num_kv_heads, spec.head_dim}, dtype);
    layer.v = backend.empty({config.num_blocks, config.block_size, spec.num_kv_heads, spec.v_head_dim}, dtype);
    // Device memory is zeroed so that no uninitialised NaN pattern can reach a kernel that reads a
    // whole block and masks afterwards (0 * NaN = NaN). Host memory is not: a large allocation is
    // fresh zero pages from the OS, mapped only as the cache fills, and the CPU attention reads no
    // slot past seq_len; touching gigabytes up front would only cost startup time and RSS.
    if (backend.device() != Device::kCPU) {
      backend.zero(layer.k);
      if (layer.v.numel() > 0) backend.zero(layer.v);
    }
  }

  const int64_t max_tokens = config.max_num_batched_tokens;
  const int64_t max_seqs = config.max_num_seqs;
  const int64_t max_blocks_per_seq = ceil_div(config.max_model_len + config.num_speculative_tokens, config.block_size);
  const int64_t max_logits = max_tokens + max_seqs * (1 + config.num_speculative_tokens);
  auto host = [&](Tensor& h, int64_t n, DType t) { h = Tensor::empty({n}, t, Device::kCPU); };
  host(h_tokens_, max_tokens, DType::kI32);
  host(h_positions_, max_tokens, DType::kI32);
  host(h_slots_, max_tokens, DType::kI64);
  host(h_qsl_, max_seqs + 1, DType::kI32);
  host(h_seq_lens_, max_seqs, DType::kI32);
  host(h_block_tables_, max_seqs * max_blocks_per_seq, DType::kI32);
  host(h_logits_idx_, max_logits, DType::kI32);
  const int64_t packed_bytes = static_cast<int64_t>(
      input_layout(max_tokens, max_logits, max_seqs, max_seqs * max_blocks_per_seq).bytes);
  for (Tensor& packed : h_packed_) packed = backend.empty_host({packed_bytes}, DType::kU8);
  d_inputs_ = backend.empty({packed_bytes}, DType::kU8);
  if (config.num_speculative_tokens > 0) {
    const int64_t verify_rows = max_seqs * (1 + config.num_speculative_tokens);
    std::vector<int32_t> names(static_cast<size_t>(verify_rows));
    for (size_t i = 0; i < names.size(); ++i) names[i] = -(1 + static_cast<int32_t>(i));
    verify_row_names_ = backend.empty({verify_rows}, DType::kI32);
    backend.copy(Tensor::from_i32(names), verify_row_names_);
    verified_tokens_ = backend.empty({verify_rows}, DType::kI32);
    backend.synchronize();
  }
}

ModelRunner::~ModelRunner() {
  // A deferred step's results (or drafts) are still being copied into pinned memory.
  try {
    if (pending_) sampler_.finish_sample();
    if (drafts_on_device_) speculator_->finish_drafts();
  } catch (const std::exception&) {
  }
}

StepCounts ModelRunner::submit(const SchedulerOutput& scheduled, const HostWork& host_work) {
  host_work_ = host_work;
  ModelRunnerOutput out;
  try {
    out = run_step(scheduled, /*may_defer=*/true);
  } catch (...) {
    host_work_ = nullptr;
    throw;
  }
  if (!pending_) {
    ready_.push_back(std::move(out));
    StepCounts counts = counts_of(ready_.back());
    run_host_work();
    return counts;
  }
  StepCounts counts;
  counts.num_sampled.assign(scheduled.scheduled.size(), 0);
  for (const auto& [s, id] : pending_->samplers) counts.num_sampled[s] = 1;
  counts.draft_token_ids.resize(scheduled.scheduled.size());
  counts.spec_depth = out.spec_depth;
  counts.proposer_launched_ahead = out.proposer_launched_ahead;
  pending_->out = std::move(out);
  run_host_work();
  return counts;
}

void ModelRunner::run_host_work() {
  if (!host_work_) return;
  const HostWork work = std::move(host_work_);
  host_work_ = nullptr;
  phase_profile::Scope p("runner.host_work");
  work();
}

ModelRunnerOutput ModelRunner::collect() {
  // The oldest step first: a step still pending is newer than any ready one (the next step's
  // host work collects the one before it while this one runs).
  if (ready_.empty()) finish_pending();
  SPECULA_CHECK(!ready_.empty(), "internal error: no submitted step to collect");
  ModelRunnerOutput out = std::move(ready_.front());
  ready_.pop_front();
  return out;
}

std::vector<int32_t> ModelRunner::finish_pending() {
  std::vector<int32_t> tokens;
  if (!pending_) return tokens;
  PendingStep step = std::move(*pending_);
  pending_.reset();
  // The states first: a failed wait leaves no request waiting for a pending row.
  std::vector<RequestState*> states(step.samplers.size(), nullptr);
  for (size_t i = 0; i < step.samplers.size(); ++i) {
    auto it = requests_.find(step.samplers[i].second);
    if (it == requests_.end() || it->second.pending_row != static_cast<int>(i)) continue;
    it->second.pending_row = -1;
    states[i] = &it->second;
  }
  std::vector<SampledToken> sampled = [&] {
    phase_profile::Scope p("runner.wait_for_tokens");
    return sampler_.finish_sample();
  }();
  SPECULA_CHECK(sampled.size() == step.samplers.size(), "internal error: {} tokens for {} deferred rows",
                sampled.size(), step.samplers.size());
  // Its time from when the device could start it (its launch, or the step before it ending) to
  // its tokens: what a plain step costs while the host's work is hidden (async scheduling).
  const double ready = now_seconds();
  if (speculator_ && step.num_timed_seqs > 0)
    speculator_->record_target_step(step.num_timed_seqs, 1, ready - std::max(step.launched_at, last_results_at_));
  last_results_at_ = ready;
  tokens.reserve(sampled.size());
  for (size_t i = 0; i < sampled.size(); ++i) {
    const size_t s = step.samplers[i].first;
    if (states[i]) states[i]->tokens.push_back(sampled[i].token);
    step.out.sampled_token_ids[s] = {sampled[i].token};
    if (sampled[i].logprobs) step.out.logprobs[s].push_back(std::move(*sampled[i].logprobs));
    tokens.push_back(sampled[i].token);
  }
  ready_.push_back(std::move(step.out));
  return tokens;
}

double ModelRunner::collect_drafts(std::vector<RequestPlan>& plans) {
  double ready = 0.0;
  if (drafts_on_device_) {
    drafts_on_device_ = false;
    draft_source_ = Tensor();
    std::vector<std::vector<int32_t>> values = [&] {
      phase_profile::Scope p("runner.wait_for_drafts");
      return speculator_->finish_drafts();
    }();
    ready = now_seconds();
    last_results_at_ = ready;
    SPECULA_CHECK(values.size() == draft_owners_.size(), "internal error: {} draft lists collected for {} requests",
                  values.size(), draft_owners_.size());
    for (size_t i = 0; i < values.size(); ++i) {
      auto it = requests_.find(draft_owners_[i]);
      if (it == requests_.end() || it->second.draft_first < 0) continue;
      it->second.draft_first = -1;
      it->second.drafts = std::move(values[i]);
    }
  }
  for (RequestPlan& plan : plans) {
    if (std::find(plan.drafts.begin(), plan.drafts.end(), kPlaceholderToken) == plan.drafts.end()) continue;
    plan.collected_drafts.assign(plan.drafts.begin(), plan.drafts.end());
    for (size_t j = 0; j < plan.collected_drafts.size(); ++j)
      if (plan.collected_drafts[j] == kPlaceholderToken)
        plan.collected_drafts[j] = draft_input_token(*plan.state, static_cast<int>(j));
    plan.drafts = plan.collected_drafts;
  }
  return ready;
}

int32_t ModelRunner::draft_input_token(const RequestState& st, int j) const {
  if (st.draft_first >= 0) return -(1 + st.draft_first + j * draft_stride_);
  SPECULA_CHECK(j < static_cast<int>(st.drafts.size()), "internal error: draft {} of a request with {} collected drafts",
                j, st.drafts.size());
  return st.drafts[static_cast<size_t>(j)];
}

void ModelRunner::set_rejection_sampler(std::unique_ptr<RejectionSampler> sampler) {
  SPECULA_CHECK(sampler != nullptr, "set_rejection_sampler: null sampler");
  rejection_sampler_ = std::move(sampler);
}

void ModelRunner::update_states(const SchedulerOutput& scheduled) {
  for (const std::vector<std::string>* ids : {&scheduled.finished_req_ids, &scheduled.preempted_req_ids}) {
    for (const std::string& id : *ids) {
      requests_.erase(id);
      if (speculator_) speculator_->drop_request(id);
    }
  }
  for (const NewRequestData& d : scheduled.new_requests) {
    RequestState s;
    s.tokens = d.prompt_token_ids;
    s.tokens.insert(s.tokens.end(), d.output_token_ids.begin(), d.output_token_ids.end());
    s.num_prompt_tokens = static_cast<int>(d.prompt_token_ids.size());
    s.params = d.params;
    s.seed = d.sampling_seed;
    s.min_tokens_stop_ids = d.min_tokens_stop_ids;
    s.want_prompt_logprobs = d.want_prompt_logprobs;
    s.block_ids = d.block_ids;
    requests_[d.req_id] = std::move(s);
  }
  for (const ScheduledRequest& r : scheduled.scheduled) {
    auto it = requests_.find(r.req_id);
    SPECULA_CHECK(it != requests_.end(), "internal error: model runner has no state for request {}", r.req_id);
    if (it->second.num_cached_tokens < 0) it->second.num_cached_tokens = r.num_computed_tokens;
    it->second.block_ids.insert(it->second.block_ids.end(), r.new_block_ids.begin(), r.new_block_ids.end());
  }
}

ModelRunner::DeviceInputs ModelRunner::input_views(int t, int num_logits, int num_seqs, int64_t table_entries) const {
  const InputLayout l = input_layout(t, num_logits, num_seqs, table_entries);
  DeviceInputs d;
  d.slots = byte_view(d_inputs_, l.slots, t, DType::kI64);
  d.token_ids = byte_view(d_inputs_, l.tokens, t, DType::kI32);
  d.positions = byte_view(d_inputs_, l.positions, t, DType::kI32);
  d.logits_indices = byte_view(d_inputs_, l.logits_indices, num_logits, DType::kI32);
  d.query_start_loc = byte_view(d_inputs_, l.query_start_loc, num_seqs + 1, DType::kI32);
  d.seq_lens = byte_view(d_inputs_, l.seq_lens, num_seqs, DType::kI32);
  d.block_tables = byte_view(d_inputs_, l.block_tables, table_entries, DType::kI32);
  return d;
}

ModelRunner::DeviceInputs ModelRunner::upload_inputs(int t, int num_logits, int num_seqs, int64_t table_entries) {
  const InputLayout l = input_layout(t, num_logits, num_seqs, table_entries);
  packed_index_ ^= 1;
  Tensor& packed = h_packed_[packed_index_];
  char* p = packed.data_as<char>();
  auto pack = [&](size_t offset, const Tensor& host, int64_t n) {
    std::memcpy(p + offset, host.data(), static_cast<size_t>(n) * dtype_size(host.dtype()));
  };
  pack(l.slots, h_slots_, t);
  pack(l.tokens, h_tokens_, t);
  pack(l.positions, h_positions_, t);
  pack(l.logits_indices, h_logits_idx_, num_logits);
  pack(l.query_start_loc, h_qsl_, num_seqs + 1);
  pack(l.seq_lens, h_seq_lens_, num_seqs);
  pack(l.block_tables, h_block_tables_, table_entries);
  Tensor dst = d_inputs_.slice(0, static_cast<int64_t>(l.bytes));
  if (l.bytes > 0) backend_.copy(packed.slice(0, static_cast<int64_t>(l.bytes)), dst);
  return input_views(t, num_logits, num_seqs, table_entries);
}

ForwardInput ModelRunner::prepare_inputs(const SchedulerOutput& scheduled, std::vector<RequestPlan>& plans) {
  // Without a step pending the device is idle from here on, as the step's timing expects; with
  // one, the packed upload alternates buffers (upload_inputs). At most one kind of value is left
  // on the device: both are fed as -(1 + index).
  SPECULA_ASSERT(!(pending_ && drafts_on_device_));
  if (!pending_ && !drafts_on_device_) backend_.synchronize();
  ragged_rows_ = 0;
  const int bs = config_.block_size;
  const int num_seqs = static_cast<int>(scheduled.scheduled.size());
  SPECULA_CHECK(num_seqs <= config_.max_num_seqs && scheduled.total_num_scheduled_tokens <= config_.max_num_batched_tokens,
                "internal error: step of {} sequences / {} tokens exceeds the runner's capacity", num_seqs,
                scheduled.total_num_scheduled_tokens);
  int32_t* tokens = h_tokens_.data_as<int32_t>();
  int32_t* positions = h_positions_.data_as<int32_t>();
  int64_t* slots = h_slots_.data_as<int64_t>();
  int32_t* qsl = h_qsl_.data_as<int32_t>();
  int32_t* seq_lens = h_seq_lens_.data_as<int32_t>();
  int32_t* logits_idx = h_logits_idx_.data_as<int32_t>();

  plans.assign(static_cast<size_t>(num_seqs), RequestPlan{});
  int max_blocks = 1;
  int t = 0, num_logits = 0, max_query = 0, max_seq = 0;
  qsl[0] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const ScheduledRequest& r = scheduled.scheduled[s];
    RequestState& st = requests_.at(r.req_id);
    RequestPlan& plan = plans[s];
    plan.state = &st;
    plan.sched = &r;
    plan.first_token_row = t;
    const int start = r.num_computed_tokens;
    const int n = r.num_scheduled_tokens;
    const int num_spec = static_cast<int>(r.spec_token_ids.size());
    const int n_known = n - num_spec;
    // A token the pending step samples goes in as -(1 + its row): the device feed or
    // resolve_pending_tokens() replaces it.
    const int num_tokens = st.num_known_tokens();
    SPECULA_CHECK(n > 0 && start + n_known <= num_tokens,
                  "internal error: request {} scheduled tokens [{}, {}) but has {} tokens", r.req_id, start,
                  start + n_known, num_tokens);
    const int seq_len = start + n;
    SPECULA_CHECK(ceil_div(seq_len, bs) <= static_cast<int>(st.block_ids.size()),
                  "internal error: request {} needs {} KV blocks, holds {}", r.req_id, ceil_div(seq_len, bs),
                  st.block_ids.size());
    plan.drafts = r.spec_token_ids;
    for (int j = 0; j < n; ++j) {
      const int pos = start + j;
      if (j >= n_known)
        tokens[t + j] = r.spec_token_ids[j - n_known] != kPlaceholderToken ? r.spec_token_ids[j - n_known]
                                                                           : draft_input_token(st, j - n_known);
      else
        tokens[t + j] = pos < static_cast<int>(st.tokens.size()) ? st.tokens[pos] : -(1 + st.pending_row);
      positions[t + j] = pos;
      slots[t + j] = static_cast<int64_t>(st.block_ids[pos / bs]) * bs + pos % bs;
    }
    // Prompt logprobs: row at position p predicts prompt token p + 1.
    if (st.want_prompt_logprobs && start < st.num_prompt_tokens - 1) {
      const int end = std::min(start + n_known, st.num_prompt_tokens - 1);
      plan.first_prompt_row = num_logits;
      plan.num_prompt_rows = end - start;
      plan.first_prompt_position = start + 1;
      for (int p = start; p < end; ++p) logits_idx[num_logits++] = t + (p - start);
    }
    // A request samples once its chunk reaches its last known token: one row, or k+1 to verify.
    if (start + n_known == num_tokens) {
      plan.first_sample_row = num_logits;
      plan.num_sample_rows = num_spec + 1;
      for (int j = 0; j <= num_spec; ++j) logits_idx[num_logits++] = t + n_known - 1 + j;
    }
    t += n;
    qsl[s + 1] = t;
    seq_lens[s] = seq_len;
    max_query = std::max(max_query, n);
    max_seq = std::max(max_seq, seq_len);
    max_blocks = std::max(max_blocks, ceil_div(seq_len, bs));
  }
  SPECULA_ASSERT(t == scheduled.total_num_scheduled_tokens);

  // Block tables only as wide as this step needs; unused entries point at block 0 and are never
  // read (attention stops at seq_lens).
  int32_t* tables = h_block_tables_.data_as<int32_t>();
  for (int s = 0; s < num_seqs; ++s) {
    const std::vector<int32_t>& ids = plans[s].state->block_ids;
    const int used = ceil_div(seq_lens[s], bs);
    int32_t* row = tables + static_cast<size_t>(s) * max_blocks;
    std::copy(ids.begin(), ids.begin() + used, row);
    std::fill(row + used, row + max_blocks, 0);
  }

  int graph_rows = 0;
  int graph_size = uniform_graph_size(num_seqs, t, num_logits, graph_rows);
  if (graph_size == 0) graph_size = pad_ragged_decode(num_seqs, t, num_logits, plans, graph_rows);
  // Async scheduling: the pending step's tokens go into this step's inputs on the device (the
  // uploads come from the other staging set; the device runs them after the pending step). A
  // sampler that cannot feed them has them on the host already.
  const bool feed = pending_ && sampler_.can_feed_started();
  if (pending_ && !feed) {
    const std::vector<int32_t> sampled = finish_pending();
    const int n = graph_size > 0 ? graph_size * graph_rows : t;
    for (int i = 0; i < n; ++i)
      if (tokens[i] < 0) tokens[i] = sampled.at(static_cast<size_t>(-(tokens[i] + 1)));
  }
  ForwardInput in = graph_size > 0 ? graph_step_inputs(graph_size, graph_rows, num_seqs, max_blocks)
                                   : eager_step_inputs(num_seqs, t, num_logits, max_query, max_seq, max_blocks);
  if (feed) {
    sampler_.feed_started_tokens(in.token_ids);
    ++fed_steps_;
  }
  if (drafts_on_device_) backend_.feed_tokens(in.token_ids, draft_source_);
  return in;
}

ForwardInput ModelRunner::eager_step_inputs(int num_seqs, int t, int num_logits, int max_query, int max_seq,
                                            int max_blocks) {
  const int32_t* qsl = h_qsl_.data_as<int32_t>();
  const int32_t* seq_lens = h_seq_lens_.data_as<int32_t>();
  const DeviceInputs d = upload_inputs(t, num_logits, num_seqs, static_cast<int64_t>(num_seqs) * max_blocks);
  ForwardInput in;
  in.token_ids = d.token_ids;
  in.positions = d.positions;
  in.logits_indices = d.logits_indices;
  AttentionMetadata& md = in.attn;
  md.num_seqs = num_seqs;
  md.num_tokens = t;
  md.max_query_len = max_query;
  md.max_seq_len = max_seq;
  md.block_size = config_.block_size;
  md.query_start_loc = d.query_start_loc;
  md.seq_lens = d.seq_lens;
  md.slot_mapping = d.slots;
  md.block_tables = d.block_tables.reshape({num_seqs, max_blocks});
  md.query_start_loc_host.assign(qsl, qsl + num_seqs + 1);
  md.seq_lens_host.assign(seq_lens, seq_lens + num_seqs);
  return in;
}

ModelRunnerOutput ModelRunner::execute(const SchedulerOutput& scheduled) {
  SPECULA_CHECK(!pending_ && ready_.empty(), "internal error: execute() while submitted steps are uncollected");
  return run_step(scheduled, /*may_defer=*/false);
}

ModelRunnerOutput ModelRunner::run_step(const SchedulerOutput& scheduled, bool may_defer) {
  update_states(scheduled);
  ModelRunnerOutput out;
  const size_t num_seqs = scheduled.scheduled.size();
  out.sampled_token_ids.resize(num_seqs);
  out.logprobs.resize(num_seqs);
  out.prompt_logprobs.resize(num_seqs);
  if (num_seqs == 0) {
    finish_pending();
    std::vector<RequestPlan> none;
    collect_drafts(none);
    return out;
  }

  backend_.reset_scratch();
  std::vector<RequestPlan> plans;
  ForwardInput input = [&] {
    phase_profile::Scope p("runner.prepare_inputs");
    return prepare_inputs(scheduled, plans);
  }();
  // A step that verifies no drafts asks the speculator for its depth before its forward: at depth
  // 0 with nothing for the proposer to see (adaptive depth's idle stretches), the step is a plain
  // one (propose() is not called for it, and its target forward leaves out the features only a
  // proposer reads).
  bool skip_proposer = false;
  if (speculator_) {
    // (a grammar-cut draft is recorded as a verification before the choice)
    bool verifies = false, cut = false, prompts = false;
    int num_plain = 0;
    for (const RequestPlan& plan : plans) {
      if (plan.first_sample_row >= 0) {
        verifies = verifies || !plan.drafts.empty();
        num_plain += plan.drafts.empty() ? 1 : 0;
      }
      cut = cut || plan.sched->num_grammar_cut_drafts > 0;
      // a prompt chunk, or a prompt's last token alone (the rest from the prefix cache)
      prompts = prompts || plan.sched->num_scheduled_tokens != 1 ||
                plan.sched->num_computed_tokens < plan.state->num_prompt_tokens;
    }
    skip_proposer = !verifies && !cut && num_plain > 0 && speculator_->skip_step(num_plain, prompts);
  }
  input.with_aux_hidden_states = !skip_proposer;
  const auto t0 = std::chrono::steady_clock::now();
  ForwardOutput fwd;
  {
    phase_profile::Scope p(graph_size_ > 0 ? "runner.forward (graph)" : "runner.forward (eager)");
    fwd = forward_step(input);
    if (phase_profile::synchronizing()) backend_.synchronize();
  }
  // The pending step's tokens or drafts (fed to this step on the device) reach the host while
  // this forward runs; everything below reads the requests' tokens. A forward queued behind the
  // previous step's draft work starts when that ends: its time counts from then.
  finish_pending();
  const double drafts_ready = collect_drafts(plans);

  // Structured outputs' token masks, on the host while the device runs the forward.
  const std::vector<size_t> mask_offset_of = fill_grammar_masks(plans);

  // Sampling rows. Drafts are appended to the request's tokens for the duration of sampling, so
  // that row j of a verification sees (and penalises) the j drafts before it.
  std::vector<SamplingRow> rows;
  std::vector<size_t> first_row_of(num_seqs, 0);
  for (size_t s = 0; s < num_seqs; ++s) {
    RequestPlan& plan = plans[s];
    if (plan.first_sample_row < 0) continue;
    RequestState& st = *plan.state;
    const std::span<const int32_t> drafts = plan.drafts;
    const int num_tokens = static_cast<int>(st.tokens.size());
    st.tokens.insert(st.tokens.end(), drafts.begin(), drafts.end());
    first_row_of[s] = rows.size();
    const uint32_t* masks = plan.sched->grammar ? grammar_masks_.data() + mask_offset_of[s] : nullptr;
    const size_t mask_words = plan.sched->grammar ? static_cast<size_t>(plan.sched->grammar->mask_words()) : 0;
    for (int j = 0; j < plan.num_sample_rows; ++j) {
      SamplingRow row;
      row.logits_row = plan.first_sample_row + j;
      row.params = st.params.get();
      row.seed = st.seed;
      row.position = num_tokens + j;
      row.prompt_token_ids = std::span<const int32_t>(st.tokens.data(), static_cast<size_t>(st.num_prompt_tokens));
      row.output_token_ids = std::span<const int32_t>(st.tokens.data() + st.num_prompt_tokens,
                                                      static_cast<size_t>(num_tokens + j - st.num_prompt_tokens));
      if (st.num_output_tokens() - static_cast<int>(drafts.size()) + j < st.params->min_tokens)
        row.masked_token_ids = st.min_tokens_stop_ids;
      row.logprobs = st.params->logprobs;
      if (masks) row.allowed_token_mask = std::span<const uint32_t>(masks + j * mask_words, mask_words);
      rows.push_back(row);
    }
  }
  // Requests without drafts sample one row; verifications go to the rejection sampler.
  std::vector<SamplingRow> plain;
  std::vector<VerifyRequest> verify;
  std::vector<size_t> index_of(num_seqs, 0);
  for (size_t s = 0; s < num_seqs; ++s) {
    const RequestPlan& plan = plans[s];
    if (plan.first_sample_row < 0) continue;
    const std::span<const int32_t> drafts = plan.drafts;
    if (drafts.empty()) {
      index_of[s] = plain.size();
      plain.push_back(rows[first_row_of[s]]);
    } else {
      index_of[s] = verify.size();
      verify.push_back(VerifyRequest{std::span<const SamplingRow>(rows.data() + first_row_of[s], drafts.size() + 1),
                                     drafts, speculator_ ? speculator_->draft_probs_row(plan.sched->req_id) : -1});
    }
  }
  if (skip_proposer) out.spec_depth = 0;
  // Deferred: nothing after sampling needs the tokens on the host this step. A step whose
  // proposer only catches up may be too, where the sampler feeds its tokens on the device.
  bool defer = may_defer && verify.empty() && !plain.empty() && sampler_.can_defer(plain);
  for (size_t s = 0; s < num_seqs && defer; ++s) defer = plans[s].num_prompt_rows == 0;
  const bool catch_up = defer && speculator_ && !skip_proposer;
  std::vector<SampledToken> sampled;
  if (defer && (!speculator_ || skip_proposer || catch_up)) {
    {
      phase_profile::Scope p("runner.sample (deferred)");
      sampler_.start_sample(fwd.logits, plain);
    }
    // (whether the sampler feeds its tokens on the device is known once it started)
    if (!catch_up || (sampler_.can_feed_started() && catch_up_ahead(plans, input, fwd))) {
      // (the time of a step whose proposer caught up is not a plain step's)
      defer_sampling(plans, std::chrono::duration<double>(t0.time_since_epoch()).count(), !catch_up);
      if (catch_up) {
        out.spec_depth = 0;
        out.proposer_launched_ahead = true;
      }
      return out;
    }
    run_host_work();
    sampled = sampler_.finish_sample();  // the speculator launched nothing: a synchronous step
  } else if (!plain.empty()) {
    run_host_work();
    phase_profile::Scope p("runner.sample");
    sampled = sampler_.sample(fwd.logits, plain);
  }
  bool started = false;
  std::vector<std::vector<int32_t>> ahead_drafts;
  const int ahead_depth = may_defer && plain.empty() && !verify.empty()
                              ? launch_ahead(plans, input, fwd, verify, started, ahead_drafts)
                              : -1;
  std::vector<VerifyResult> verified;
  if (!verify.empty()) run_host_work();  // (the device runs the verification, and what went ahead)
  {
    phase_profile::Scope p("runner.verify");
    verified = started ? rejection_sampler_->finish_verify()
                       : rejection_sampler_->verify(fwd.logits, speculator_ ? speculator_->draft_probs() : nullptr, verify);
  }
  const double target_start = std::max(std::chrono::duration<double>(t0.time_since_epoch()).count(), drafts_ready);
  last_results_at_ = now_seconds();
  const double target_seconds = last_results_at_ - target_start;
  last_target_seconds_ = target_seconds;

  std::optional<phase_profile::Scope> accept_phase(std::in_place, "runner.accept");
  for (size_t s = 0; s < num_seqs; ++s) {
    RequestPlan& plan = plans[s];
    RequestState& st = *plan.state;
    if (plan.first_sample_row >= 0) {
      const size_t num_drafts = plan.drafts.size();
      st.tokens.resize(st.tokens.size() - num_drafts);
      std::vector<int32_t> accepted;
      const int cut = plan.sched->num_grammar_cut_drafts;
      if (num_drafts == 0) {
        if (speculator_ && cut > 0) speculator_->record_verification(plan.sched->req_id, cut, 0);
        SampledToken& tok = sampled[index_of[s]];
        accepted.push_back(tok.token);
        if (tok.logprobs) out.logprobs[s].push_back(std::move(*tok.logprobs));
      } else {
        VerifyResult& v = verified[index_of[s]];
        accepted = std::move(v.tokens);
        out.logprobs[s] = std::move(v.logprobs);
        if (speculator_)
          speculator_->record_verification(plan.sched->req_id, static_cast<int>(num_drafts) + cut,
                                           static_cast<int>(accepted.size()) - 1);
      }
      st.tokens.insert(st.tokens.end(), accepted.begin(), accepted.end());
      out.sampled_token_ids[s] = std::move(accepted);
    }
    if (plan.num_prompt_rows > 0) {
      std::vector<int> lrows(static_cast<size_t>(plan.num_prompt_rows));
      std::vector<int32_t> targets(lrows.size());
      for (int i = 0; i < plan.num_prompt_rows; ++i) {
        lrows[i] = plan.first_prompt_row + i;
        targets[i] = st.tokens[plan.first_prompt_position + i];
      }
      std::vector<PositionLogprobs> lp = sampler_.logprobs_of(fwd.logits, lrows, targets, *st.params->prompt_logprobs);
      PromptLogprobsChunk& chunk = out.prompt_logprobs[s];
      const bool from_start = plan.first_prompt_position == 1;
      chunk.start = from_start ? 0 : plan.first_prompt_position;
      if (from_start) chunk.entries.push_back(std::nullopt);  // the first prompt token has no logprob
      for (PositionLogprobs& p : lp) chunk.entries.push_back(std::move(p));
    }
  }
  accept_phase.reset();
  if (speculator_) {
    phase_profile::Scope p("runner.propose");
    record_target_cost(plans, target_seconds);
    if (ahead_depth >= 0) {
      std::vector<int> accepted;
      for (size_t s = 0; s < num_seqs; ++s) accepted.push_back(static_cast<int>(out.sampled_token_ids[s].size()) - 1);
      speculator_->settle_ahead(accepted);
      out.draft_token_ids = std::move(ahead_drafts);
      out.spec_depth = ahead_depth;
      out.proposer_launched_ahead = true;
      adopt_drafts_on_device(plans);
    } else if (!skip_proposer) {
      propose_drafts(plans, fwd, target_seconds, may_defer, out);
    }
  }
  return out;
}

void ModelRunner::defer_sampling(const std::vector<RequestPlan>& plans, double launched_at, bool timed) {
  pending_.emplace();
  bool uniform = timed;
  for (const RequestPlan& plan : plans)
    uniform = uniform && plan.first_sample_row >= 0 && plan.sched->num_scheduled_tokens == 1;
  if (uniform) pending_->num_timed_seqs = static_cast<int>(plans.size());
  pending_->launched_at = launched_at;
  for (size_t s = 0; s < plans.size(); ++s) {
    if (plans[s].first_sample_row < 0) continue;
    plans[s].state->pending_row = static_cast<int>(pending_->samplers.size());
    pending_->samplers.emplace_back(s, plans[s].sched->req_id);
  }
}

bool ModelRunner::catch_up_ahead(std::vector<RequestPlan>& plans, const ForwardInput& input, const ForwardOutput& fwd) {
  static const bool enabled = launch_ahead_enabled();
  const int n = static_cast<int>(plans.size());
  if (!enabled || ragged_rows_ > 0 || static_cast<int64_t>(n) > verified_tokens_.numel()) return false;
  for (int s = 0; s < n; ++s) {
    const RequestPlan& plan = plans[static_cast<size_t>(s)];
    if (plan.first_sample_row != s || plan.sched->num_scheduled_tokens != 1 || plan.sched->grammar ||
        plan.first_token_row != s)
      return false;
  }
  phase_profile::Scope phase("runner.propose (catch-up ahead)");
  // The sampled tokens on the device, row s the token of request s (a name -(1 + s) the
  // sampler's feed replaces), for the catch-up rows that read them.
  Tensor sampled = verified_tokens_.slice(0, n);
  backend_.copy(verify_row_names_.slice(0, n), sampled);
  sampler_.feed_started_tokens(sampled);
  ProposeBatch batch;
  batch.may_leave_drafts_on_device = true;
  batch.target_seconds = last_target_seconds_;
  batch.ahead = ProposeBatch::LaunchAhead{input.token_ids.slice(0, n), sampled, 0};
  batch.target_hidden_states = fwd.hidden_states;
  batch.target_aux_hidden_states = fwd.aux_hidden_states;
  for (int s = 0; s < n; ++s) {
    RequestPlan& plan = plans[static_cast<size_t>(s)];
    RequestState& st = *plan.state;
    // Its token of this step, named as in `sampled`, until the proposer has staged it.
    st.tokens.push_back(-(1 + s));
    ProposerRequest p = proposer_request(plan);
    p.tokens = st.tokens;
    p.sampled = true;
    p.num_target_computed = plan.sched->num_computed_tokens + 1;
    p.max_drafts = max_drafts_at(st, static_cast<int>(st.tokens.size()));
    batch.requests.push_back(p);
  }
  std::vector<std::vector<int32_t>> drafts;
  int depth = -1;
  try {
    depth = speculator_->propose_ahead(batch, drafts);
  } catch (...) {
    for (RequestPlan& plan : plans) plan.state->tokens.pop_back();
    throw;
  }
  for (RequestPlan& plan : plans) plan.state->tokens.pop_back();
  if (depth < 0) return false;
  SPECULA_CHECK(depth == 0 && !speculator_->drafts_on_device(), "internal error: a catch-up ahead drafted (depth {})",
                depth);
  ++steps_launched_ahead_;
  return true;
}

ProposerRequest ModelRunner::proposer_request(const RequestPlan& plan) const {
  const RequestState& st = *plan.state;
  const ScheduledRequest& r = *plan.sched;
  ProposerRequest p;
  p.req_id = r.req_id;
  p.num_prompt_tokens = st.num_prompt_tokens;
  p.num_cached_tokens = std::max(st.num_cached_tokens, 0);
  p.block_ids = st.block_ids;
  p.params = st.params.get();
  p.seed = st.seed;
  p.min_tokens_stop_ids = st.min_tokens_stop_ids;
  p.first_row = plan.first_token_row;
  p.num_rows = r.num_scheduled_tokens;
  p.first_position = r.num_computed_tokens;
  return p;
}

int ModelRunner::max_drafts_at(const RequestState& st, int num_tokens) const {
  // No input position may reach max_model_len, and drafts past max_tokens would only be dropped.
  int most = std::min(speculator_->num_speculative_tokens(), config_.max_model_len - 1 - num_tokens);
  if (st.params->max_tokens) most = std::min(most, *st.params->max_tokens - (num_tokens - st.num_prompt_tokens) - 1);
  return std::max(0, most);
}

int ModelRunner::launch_ahead(std::vector<RequestPlan>& plans, const ForwardInput& input, const ForwardOutput& fwd,
                              std::span<const VerifyRequest> verify, bool& started,
                              std::vector<std::vector<int32_t>>& drafts) {
  started = false;
  static const bool enabled = launch_ahead_enabled();
  if (!enabled || !speculator_ || !speculator_->leaves_drafts_on_device() || ragged_rows_ > 0) return -1;
  // Every request verifies k drafts in its k + 1 rows, in batch order.
  const int k = static_cast<int>(plans.front().drafts.size());
  const int n = static_cast<int>(plans.size());
  for (int s = 0; s < n; ++s) {
    const RequestPlan& plan = plans[static_cast<size_t>(s)];
    // Its drafts next step must not depend on what it accepts (max_tokens, max_model_len near).
    const int num_tokens = static_cast<int>(plan.state->tokens.size()) + 1;  // with all k accepted
    if (k == 0 || static_cast<int>(plan.drafts.size()) != k || plan.first_sample_row < 0 ||
        max_drafts_at(*plan.state, num_tokens) != max_drafts_at(*plan.state, num_tokens - k) ||
        plan.num_prompt_rows > 0 || plan.sched->grammar || plan.sched->num_grammar_cut_drafts > 0 ||
        plan.sched->num_scheduled_tokens != k + 1 || plan.first_token_row != s * (k + 1) ||
        static_cast<int64_t>(n) * (k + 1) > verified_tokens_.numel())
      return -1;
  }
  if (!rejection_sampler_->can_start_verify(verify)) return -1;
  const int rows = n * (k + 1);
  {
    phase_profile::Scope p("runner.verify (start)");
    rejection_sampler_->start_verify(fwd.logits, speculator_->draft_probs(), verify);
    started = true;
  }
  phase_profile::Scope phase("runner.propose (ahead)");
  Tensor sampled = verified_tokens_.slice(0, rows);
  backend_.copy(verify_row_names_.slice(0, rows), sampled);
  if (!rejection_sampler_->feed_verified_tokens(sampled)) return -1;
  ProposeBatch batch;
  batch.may_leave_drafts_on_device = true;
  batch.target_seconds = last_target_seconds_;
  batch.ahead = ProposeBatch::LaunchAhead{input.token_ids.slice(0, rows), sampled, k};
  batch.target_hidden_states = fwd.hidden_states;  // a hidden-state proposer's catch-up reads them
  batch.target_aux_hidden_states = fwd.aux_hidden_states;
  for (RequestPlan& plan : plans) {
    RequestState& st = *plan.state;
    const ScheduledRequest& r = *plan.sched;
    // Its tokens hold the drafts now: as if it accepted none, its last token and then the one it
    // surely gains, in the first draft's place (the verification truncates the drafts).
    const size_t last = st.tokens.size() - static_cast<size_t>(k);
    st.tokens[last] = kPlaceholderToken;
    ProposerRequest p = proposer_request(plan);
    p.tokens = std::span<const int32_t>(st.tokens.data(), last + 1);
    p.sampled = true;
    p.verified_drafts = true;
    p.num_target_computed = r.num_computed_tokens + r.num_scheduled_tokens - k;
    p.max_drafts = max_drafts_at(st, static_cast<int>(st.tokens.size()) + 1);  // all accepted
    batch.requests.push_back(p);
  }
  int depth = -1;
  try {
    depth = speculator_->propose_ahead(batch, drafts);
  } catch (...) {
    started = false;
    try {
      rejection_sampler_->finish_verify();
    } catch (...) {
    }
    throw;
  }
  if (depth >= 0) ++steps_launched_ahead_;
  return depth;
}

std::vector<size_t> ModelRunner::fill_grammar_masks(const std::vector<RequestPlan>& plans) {
  std::vector<size_t> offset_of(plans.size(), 0);
  size_t total = 0;
  for (size_t s = 0; s < plans.size(); ++s) {
    const ScheduledRequest& sched = *plans[s].sched;
    if (!sched.grammar || plans[s].first_sample_row < 0) continue;
    offset_of[s] = total;
    total += static_cast<size_t>(sched.grammar->mask_words()) * (plans[s].drafts.size() + 1);
  }
  if (total == 0) return offset_of;
  phase_profile::Scope p("runner.grammar_masks");
  grammar_masks_.resize(total);  // kept between steps: no allocation once it has grown
  for (size_t s = 0; s < plans.size(); ++s) {
    const ScheduledRequest& sched = *plans[s].sched;
    if (!sched.grammar || plans[s].first_sample_row < 0) continue;
    const std::span<const int32_t> drafts = plans[s].drafts;
    const size_t rows = drafts.size() + 1;
    const std::span<uint32_t> masks(grammar_masks_.data() + offset_of[s],
                                    static_cast<size_t>(sched.grammar->mask_words()) * rows);
    // The scheduler kept the drafts up to the first one the grammar forbids (a request with a
    // grammar never has drafts left on the device: the greedy chain does not take it).
    const int valid = sched.grammar->fill_draft_masks(drafts, masks);
    SPECULA_ASSERT(valid + 1 >= static_cast<int>(drafts.size()));
  }
  return offset_of;
}

void ModelRunner::record_target_cost(const std::vector<RequestPlan>& plans, double target_seconds) {
  // The cost model learns from steps in which every request decoded with the same number of rows,
  // and from ragged decode steps padded to r rows (they cost what an r-row step costs): under load
  // the probes from depth 0 (a few requests with one draft) are the only multi-row steps, and
  // without them the verification cost there stayed the prior's guess.
  const int rows = ragged_rows_ > 0 ? ragged_rows_ : plans.front().sched->num_scheduled_tokens;
  bool uniform = true;
  for (const RequestPlan& plan : plans)
    uniform = uniform && plan.first_sample_row >= 0 &&
              (ragged_rows_ > 0 || (plan.sched->num_scheduled_tokens == rows && plan.num_sample_rows == rows));
  if (uniform) speculator_->record_target_step(static_cast<int>(plans.size()), rows, target_seconds);
}

void ModelRunner::propose_drafts(const std::vector<RequestPlan>& plans, const ForwardOutput& fwd, double target_seconds,
                                 bool may_leave_on_device, ModelRunnerOutput& out) {
  ProposeBatch batch;
  batch.may_leave_drafts_on_device = may_leave_on_device;
  batch.target_seconds = target_seconds;
  batch.target_hidden_states = fwd.hidden_states;
  batch.target_aux_hidden_states = fwd.aux_hidden_states;
  for (size_t s = 0; s < plans.size(); ++s) {
    const RequestPlan& plan = plans[s];
    const RequestState& st = *plan.state;
    const ScheduledRequest& r = *plan.sched;
    ProposerRequest p = proposer_request(plan);
    p.tokens = st.tokens;
    p.sampled = plan.first_sample_row >= 0;
    p.verified_drafts = !r.spec_token_ids.empty();
    const int num_drafts = static_cast<int>(r.spec_token_ids.size());
    const int accepted_drafts = p.sampled ? static_cast<int>(out.sampled_token_ids[s].size()) - 1 : 0;
    p.num_target_computed = r.num_computed_tokens + r.num_scheduled_tokens - num_drafts + accepted_drafts;
    if (p.sampled) p.max_drafts = max_drafts_at(st, static_cast<int>(st.tokens.size()));
    if (p.sampled && r.grammar) {
      p.grammar = r.grammar;
      p.grammar_pending = out.sampled_token_ids[s];
    }
    batch.requests.push_back(p);
  }
  out.spec_depth = speculator_->propose(batch, out.draft_token_ids);
  SPECULA_CHECK(may_leave_on_device || !speculator_->drafts_on_device(),
                "internal error: drafts left on the device of a synchronous step");
  adopt_drafts_on_device(plans);
}

void ModelRunner::adopt_drafts_on_device(const std::vector<RequestPlan>& plans) {
  const DraftsOnDevice* on_device = speculator_->drafts_on_device();
  if (!on_device) return;
  SPECULA_CHECK(on_device->first.size() == plans.size(),
                "internal error: drafts left on the device for {} of {} requests", on_device->first.size(), plans.size());
  drafts_on_device_ = true;
  draft_source_ = on_device->tokens;
  draft_stride_ = on_device->stride;
  draft_owners_.clear();
  for (size_t s = 0; s < plans.size(); ++s) {
    draft_owners_.push_back(plans[s].sched->req_id);
    plans[s].state->draft_first = on_device->first[s];
    plans[s].state->drafts.clear();
  }
  ++steps_with_drafts_on_device_;
}

}  // namespace specula
