// ModelRunner: CUDA graphs of uniform decode steps (declared in model_runner.h).
//
// A uniform step is one in which every scheduled sequence runs the same number r of query rows and
// every row is a logits row, in order: pure decode (r = 1), and speculative verification where
// every request verifies r - 1 drafts (r = 2 .. 1 + num_speculative_tokens). A uniform step of n
// sequences runs as the captured graph of (the smallest padded size B >= n, r); so does a ragged
// decode step, its sequences padded to the longest one's r rows (pad_ragged_decode). The graph reads
// its inputs from the runner's device input buffer at the offsets of a step of B*r tokens and B
// sequences (token, position, slot, logits-index, query-start and length arrays; input_views),
// and from a full-width block table, which the step fills by one pinned host-to-device copy (and
// one strided device copy of the table) before the replay. Sequences n..B-1 are padding that cannot disturb the real ones: r
// tokens 0 at positions 0..r-1, slot -1 (no K/V write), a sequence of length r whose keys are the
// first entries of whatever its block-table row holds (valid block ids: the table starts zeroed
// and only ever receives real ids), and their own logits rows.
//
// Launch shapes baked into a graph come from host-side metadata at capture time: the number of
// sequences and r (which also decide split-KV decode vs flash attention in the CUDA backend, the
// same way at capture as at any replay of that graph), and the longest sequence length: every
// captured sequence claims the longest length the block table allows, so the decode attention
// picks the split count it would for the longest sequence, and its kernels read the true lengths
// from the device at replay. Decode graphs come in a second set captured for sequences of at most
// short_decode_graph_len tokens, which steps of only such sequences replay: there the decode
// attention of a small batch launches a few key splits that merge inside the launch, where the set
// sized for max_model_len launches 32 and a merge kernel after them, a launch more a layer
// (docs/PERFORMANCE.md: batch-1 steps ~3 % shorter on the H200).
// The outputs (logits, hidden states) live in the scratch arena at addresses the capture fixed;
// the runner keeps those tensors, and with them the arena chunk, alive. Graphs share that chunk
// with each other and with eager steps (and with a proposer's graphs): a graph's outputs are
// valid until the next forward on the backend, as eager outputs are, which is all execute() and
// the proposers rely on (logits are sampled and verified, and an MTP proposer copies the hidden
// rows it needs, before any other forward runs).
#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "core/logging.h"
#include "engine/model_runner.h"

namespace specula {

size_t ModelRunner::num_decode_graphs() const {
  size_t n = short_decode_graphs_ ? short_decode_graphs_->size() : 0;
  n += featureless_decode_.size() + featureless_short_decode_.size();
  for (const auto& [rows, graphs] : graphs_) n += graphs->size();
  return n;
}

size_t ModelRunner::num_verify_graphs() const {
  size_t n = 0;
  for (const auto& [rows, graphs] : graphs_)
    if (rows > 1) n += graphs->size();
  return n;
}

int64_t ModelRunner::num_graph_replays(int rows) const {
  auto it = graph_replays_.find(rows);
  return it == graph_replays_.end() ? 0 : it->second;
}

ForwardInput ModelRunner::static_decode_input(int size, int rows, bool for_capture, int capture_len) {
  const int bs = config_.block_size;
  const int width = static_cast<int>(d_graph_block_tables_.size(1));
  const int t = size * rows;
  const DeviceInputs d = input_views(t, t, size, 0);
  ForwardInput in;
  in.token_ids = d.token_ids;
  in.positions = d.positions;
  in.logits_indices = d.logits_indices;
  AttentionMetadata& md = in.attn;
  md.num_seqs = size;
  md.num_tokens = t;
  md.max_query_len = rows;
  md.block_size = bs;
  md.query_start_loc = d.query_start_loc;
  md.seq_lens = d.seq_lens;
  md.slot_mapping = d.slots;
  md.block_tables = d_graph_block_tables_.slice(0, size);
  md.query_start_loc_host.resize(static_cast<size_t>(size) + 1);
  for (int s = 0; s <= size; ++s) md.query_start_loc_host[s] = s * rows;
  if (for_capture) {
    md.seq_lens_host.assign(static_cast<size_t>(size), capture_len > 0 ? capture_len : width * bs);
  } else {
    const int32_t* lens = h_seq_lens_.data_as<int32_t>();
    md.seq_lens_host.assign(lens, lens + size);
  }
  md.max_seq_len = 0;
  for (int32_t l : md.seq_lens_host) md.max_seq_len = std::max(md.max_seq_len, l);
  return in;
}

ModelRunner::DeviceInputs ModelRunner::upload_padded_graph_inputs(int first_padding_seq, int size, int rows,
                                                                  int64_t table_entries) {
  int32_t* tokens = h_tokens_.data_as<int32_t>();
  int32_t* positions = h_positions_.data_as<int32_t>();
  int64_t* slots = h_slots_.data_as<int64_t>();
  int32_t* qsl = h_qsl_.data_as<int32_t>();
  int32_t* lens = h_seq_lens_.data_as<int32_t>();
  int32_t* logits_idx = h_logits_idx_.data_as<int32_t>();
  qsl[0] = 0;
  for (int s = first_padding_seq; s < size; ++s) {
    for (int j = 0; j < rows; ++j) {
      const int row = s * rows + j;
      tokens[row] = 0;
      positions[row] = j;
      slots[row] = -1;
      logits_idx[row] = row;
    }
    qsl[s + 1] = (s + 1) * rows;
    lens[s] = rows;
  }
  return upload_inputs(size * rows, size * rows, size, table_entries);
}

bool ModelRunner::capture_graph_set(int rows, const std::vector<int>& sizes, int capture_len, bool with_aux,
                                    std::unique_ptr<PaddedGraphs>& graphs, std::map<int, ForwardOutput>& outputs) {
  graphs = std::make_unique<PaddedGraphs>(
      backend_, [this](const std::function<void()>& work) { return model_.capture_graph(backend_, work); });
  try {
    graphs->capture(sizes, [&](int size) {
      // Only outside capture (the warm-up run): fill the static buffers with an all-padding
      // batch (the capture itself must not copy from the host).
      if (outputs.count(size) == 0 || !outputs[size].logits.defined()) {
        backend_.synchronize();
        upload_padded_graph_inputs(0, size, rows, 0);
        backend_.synchronize();
      }
      ForwardInput in = static_decode_input(size, rows, /*for_capture=*/true, capture_len);
      in.with_aux_hidden_states = with_aux;
      outputs[size] = model_.forward(in, kv_);
    });
  } catch (const Error& e) {
    LOG_WARN("CUDA graphs: {}; steps of {} row(s) per sequence and more than {} sequences run eagerly", e.what(), rows,
             graphs->empty() ? 0 : graphs->sizes().back());
  }
  // Drop the warm-up outputs of sizes whose capture failed.
  for (auto it = outputs.begin(); it != outputs.end();)
    it = graphs->padded_size(it->first) == it->first ? std::next(it) : outputs.erase(it);
  return !graphs->empty();
}

size_t ModelRunner::capture_decode_graphs(const std::vector<int>& batch_sizes) {
  graphs_.clear();
  graph_outputs_.clear();
  short_decode_graphs_.reset();
  short_graph_outputs_.clear();
  featureless_decode_ = {};
  featureless_short_decode_ = {};
  if (batch_sizes.empty()) return 0;
  const int64_t width = (config_.max_model_len + config_.num_speculative_tokens + config_.block_size - 1) / config_.block_size;
  d_graph_block_tables_ = backend_.empty({config_.max_num_seqs, width}, DType::kI32);
  backend_.zero(d_graph_block_tables_);

  // (rows, sizes) to capture: decode for every size; verification of r - 1 drafts per request
  // only when speculating, for sizes whose step fits the token buffers and up to
  // kMaxVerifyGraphBatch sequences (each r adds as many graphs again; 256, so that verification
  // at 256 requests replays graphs too: why, in docs/PERFORMANCE.md).
  std::vector<std::pair<int, std::vector<int>>> plan;
  int max_tokens = 0;
  std::pair<int, int> largest{0, 0};  // (size, rows) of the step with the most rows
  for (int rows = 1; rows <= 1 + std::max(0, config_.num_speculative_tokens); ++rows) {
    std::vector<int> sizes;
    for (int s : batch_sizes) {
      if (s <= 0 || s > config_.max_num_seqs || s * rows > config_.max_num_batched_tokens) continue;
      if (rows > 1 && s > kMaxVerifyGraphBatch) continue;
      sizes.push_back(s);
      if (s * rows > max_tokens) {
        max_tokens = s * rows;
        largest = {s, rows};
      }
    }
    if (!sizes.empty()) plan.emplace_back(rows, std::move(sizes));
  }
  if (plan.empty()) return 0;

  // One eager run of the largest step first: the scratch arena grows to fit it at the reset, so
  // every capture after it carves from one chunk instead of leaving a chunk per growth behind.
  backend_.synchronize();
  upload_padded_graph_inputs(0, largest.first, largest.second, 0);
  model_.forward(static_decode_input(largest.first, largest.second, /*for_capture=*/true), kv_);
  backend_.synchronize();
  backend_.reset_scratch();

  for (const auto& [rows, sizes] : plan) {
    std::unique_ptr<PaddedGraphs> graphs;
    if (!capture_graph_set(rows, sizes, 0, /*with_aux=*/true, graphs, graph_outputs_[rows])) {
      graph_outputs_.erase(rows);
      continue;
    }
    std::vector<int> got = graphs->sizes();
    LOG_INFO("CUDA graphs of {} steps ({} row(s) per sequence): batch sizes {}..{} ({} graphs)",
             rows == 1 ? "decode" : "verification", rows, got.front(), got.back(), got.size());
    graphs_[rows] = std::move(graphs);
  }
  const int short_len = config_.short_decode_graph_len;
  if (graphs_.count(1) && short_len > 0 && short_len < width * config_.block_size &&
      capture_graph_set(1, graphs_.at(1)->sizes(), short_len, /*with_aux=*/true, short_decode_graphs_,
                        short_graph_outputs_)) {
    LOG_INFO("CUDA graphs of decode steps of sequences up to {} tokens: {} graphs", short_len,
             short_decode_graphs_->size());
  } else {
    short_decode_graphs_.reset();
  }
  // A model that returns EAGLE-3's features: the decode graphs once more without them, for the
  // steps no proposer reads (adaptive depth 0). On the H200 the embedded target's three feature
  // copies were ~9 us of a ~150 us step at concurrency 1 (docs/PERFORMANCE.md).
  const auto returns_aux = [](const std::map<int, ForwardOutput>& outputs) {
    return !outputs.empty() && outputs.begin()->second.aux_hidden_states.defined();
  };
  // SPECULA_FEATURELESS_GRAPHS=0 captures none (idle steps then replay the graphs that copy the
  // features): for measuring what the extra graphs cost the other steps, if anything.
  const char* featureless_env = std::getenv("SPECULA_FEATURELESS_GRAPHS");
  if (graphs_.count(1) && returns_aux(graph_outputs_[1]) && !(featureless_env && featureless_env[0] == '0')) {
    if (!capture_graph_set(1, graphs_.at(1)->sizes(), 0, /*with_aux=*/false, featureless_decode_.graphs,
                           featureless_decode_.outputs))
      featureless_decode_ = {};
    if (short_decode_graphs_ &&
        !capture_graph_set(1, short_decode_graphs_->sizes(), short_len, /*with_aux=*/false,
                           featureless_short_decode_.graphs, featureless_short_decode_.outputs))
      featureless_short_decode_ = {};
    LOG_INFO("CUDA graphs of decode steps without the EAGLE-3 features: {} graphs",
             featureless_decode_.size() + featureless_short_decode_.size());
  }
  return num_decode_graphs();
}

int ModelRunner::uniform_graph_size(int num_seqs, int t, int num_logits, int& rows) const {
  rows = 0;
  if (graphs_.empty() || num_seqs <= 0 || t % num_seqs != 0 || num_logits != t) return 0;
  const int r = t / num_seqs;
  auto it = graphs_.find(r);
  if (it == graphs_.end()) return 0;
  const int32_t* qsl = h_qsl_.data_as<int32_t>();
  for (int s = 1; s <= num_seqs; ++s)
    if (qsl[s] != s * r) return 0;
  const int32_t* idx = h_logits_idx_.data_as<int32_t>();
  for (int i = 0; i < t; ++i)
    if (idx[i] != i) return 0;
  const int size = it->second->padded_size(num_seqs);
  if (size > 0) rows = r;
  return size;
}

// Speculative decoding makes decode steps ragged wherever requests verify different numbers of
// drafts (one near its max_tokens or max_model_len drafts fewer; adaptive probes draft for a few
// requests only): on the H100 at 64 requests a third of the steps of k = 3 ran eagerly, 2.4 ms
// each against 0.29 ms for the graph. Padding every sequence to the longest one's r rows costs
// only the extra rows' work. Sequence s keeps its real rows first, at their positions; the rows
// after them continue the positions with token 0 and slot -1 (no K/V write), and its length
// becomes start + r, so that under the causal mask (row j sees positions <= length - r + j) its
// real rows see exactly what they would eagerly, and nothing of the padding rows. Those read
// whatever the cache holds past the real positions (valid block ids, finite values) and their
// logits are never sampled.
int ModelRunner::pad_ragged_decode(int num_seqs, int t, int num_logits, std::vector<RequestPlan>& plans, int& rows) {
  rows = 0;
  if (graphs_.empty() || num_seqs <= 0 || num_logits != t) return 0;
  int r = 0;
  for (const RequestPlan& plan : plans) {
    const int n = plan.sched->num_scheduled_tokens;
    // Decode rows only: it samples from every row it runs (its last token, then its drafts).
    if (plan.first_sample_row != plan.first_token_row || plan.num_sample_rows != n || plan.num_prompt_rows > 0)
      return 0;
    r = std::max(r, n);
  }
  auto it = graphs_.find(r);
  if (it == graphs_.end()) return 0;
  const int size = it->second->padded_size(num_seqs);
  if (size == 0) return 0;
  int32_t* tokens = h_tokens_.data_as<int32_t>();
  int32_t* positions = h_positions_.data_as<int32_t>();
  int64_t* slots = h_slots_.data_as<int64_t>();
  int32_t* qsl = h_qsl_.data_as<int32_t>();
  int32_t* lens = h_seq_lens_.data_as<int32_t>();
  int32_t* logits_idx = h_logits_idx_.data_as<int32_t>();
  // Last sequence first: a row only moves to a higher index (s * r + j >= qsl[s] + j).
  for (int s = num_seqs - 1; s >= 0; --s) {
    const int from = qsl[s], n = qsl[s + 1] - qsl[s], to = s * r;
    const int start = positions[from];
    for (int j = r - 1; j >= 0; --j) {
      if (j < n) {
        tokens[to + j] = tokens[from + j];
        positions[to + j] = positions[from + j];
        slots[to + j] = slots[from + j];
      } else {
        tokens[to + j] = 0;
        positions[to + j] = start + j;
        slots[to + j] = -1;
      }
    }
    lens[s] = start + r;
    RequestPlan& plan = plans[static_cast<size_t>(s)];
    plan.first_token_row = to;
    plan.first_sample_row = to;
  }
  for (int s = 0; s <= num_seqs; ++s) qsl[s] = s * r;
  for (int i = 0; i < num_seqs * r; ++i) logits_idx[i] = i;
  ++ragged_graph_steps_;
  ragged_rows_ = r;
  rows = r;
  return size;
}

ForwardInput ModelRunner::graph_step_inputs(int size, int rows, int num_seqs, int max_blocks) {
  // The step's block-table rows go up as compactly as prepare_inputs laid them out, then into the
  // first columns of the static full-width table (one strided device copy).
  const DeviceInputs d =
      upload_padded_graph_inputs(num_seqs, size, rows, static_cast<int64_t>(num_seqs) * max_blocks);
  Tensor compact = d.block_tables.reshape({num_seqs, max_blocks});
  Tensor table_rows = d_graph_block_tables_.slice(0, num_seqs);
  backend_.copy_columns(compact, 0, table_rows, 0, max_blocks);
  graph_size_ = size;
  graph_rows_ = rows;
  const int32_t* lens = h_seq_lens_.data_as<int32_t>();
  graph_short_ = rows == 1 && short_decode_graphs_ && short_decode_graphs_->padded_size(num_seqs) == size &&
                 *std::max_element(lens, lens + size) <= config_.short_decode_graph_len;
  return static_decode_input(size, rows, /*for_capture=*/false);
}

ForwardOutput ModelRunner::forward_step(const ForwardInput& input) {
  const int size = graph_size_, rows = graph_rows_;
  const bool short_graph = graph_short_;
  graph_size_ = 0;
  graph_rows_ = 0;
  graph_short_ = false;
  // A step that leaves out the features replays the graph captured without them, where there is one.
  GraphSet& featureless = short_graph ? featureless_short_decode_ : featureless_decode_;
  if (size > 0 && rows == 1 && !input.with_aux_hidden_states && featureless.graphs &&
      featureless.graphs->replay(size)) {
    ++graph_replays_[rows];
    short_graph_replays_ += short_graph ? 1 : 0;
    ++featureless_graph_replays_;
    return featureless.outputs.at(size);
  }
  if (size > 0 && short_graph) {
    SPECULA_CHECK(short_decode_graphs_->replay(size), "internal error: no short decode graph of batch size {}", size);
    ++graph_replays_[rows];
    ++short_graph_replays_;
    return short_graph_outputs_.at(size);
  }
  if (size > 0) {
    SPECULA_CHECK(graphs_.count(rows) && graphs_.at(rows)->replay(size),
                  "internal error: no graph of batch size {} with {} row(s) per sequence", size, rows);
    ++graph_replays_[rows];
    return graph_outputs_.at(rows).at(size);
  }
  return model_.forward(input, kv_);
}

}  // namespace specula
