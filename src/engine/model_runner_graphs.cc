// ModelRunner: CUDA graphs of pure-decode steps (declared in model_runner.h).
//
// A decode step of n sequences runs as the captured graph of the smallest padded size B >= n.
// The graph reads its inputs from the runner's static device buffers (the first B entries of the
// token, position, slot, query-start, length and logits-index buffers, and a full-width block
// table), which the step fills by ordinary pinned host-to-device copies before the replay. Rows
// n..B-1 are padding that cannot disturb the real ones: token 0 at position 0, slot -1 (no K/V
// write), a one-token sequence whose single key is entry 0 of whatever its block-table row holds
// (a valid block id: the table starts zeroed and only ever receives real ids), logits row i.
//
// Launch shapes baked into a graph come from host-side metadata at capture time; every captured
// sequence claims the longest length the block table allows, so the decode attention picks the
// split count it would for the longest sequence, and its kernels read the true lengths from the
// device at replay. The outputs (logits, hidden states) live in the scratch arena at addresses the
// capture fixed; the runner keeps those tensors, and with them the arena chunk, alive.
#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "engine/model_runner.h"

namespace specula {

size_t ModelRunner::num_decode_graphs() const { return graphs_ ? graphs_->size() : 0; }

ForwardInput ModelRunner::static_decode_input(int size, bool for_capture) {
  const int bs = config_.block_size;
  const int width = static_cast<int>(d_graph_block_tables_.size(1));
  ForwardInput in;
  in.token_ids = d_tokens_.slice(0, size);
  in.positions = d_positions_.slice(0, size);
  in.logits_indices = d_logits_idx_.slice(0, size);
  AttentionMetadata& md = in.attn;
  md.num_seqs = size;
  md.num_tokens = size;
  md.max_query_len = 1;
  md.block_size = bs;
  md.query_start_loc = d_qsl_.slice(0, size + 1);
  md.seq_lens = d_seq_lens_.slice(0, size);
  md.slot_mapping = d_slots_.slice(0, size);
  md.block_tables = d_graph_block_tables_.slice(0, size);
  md.query_start_loc_host.resize(static_cast<size_t>(size) + 1);
  for (int s = 0; s <= size; ++s) md.query_start_loc_host[s] = s;
  if (for_capture) {
    md.seq_lens_host.assign(static_cast<size_t>(size), width * bs);
  } else {
    const int32_t* lens = h_seq_lens_.data_as<int32_t>();
    md.seq_lens_host.assign(lens, lens + size);
  }
  md.max_seq_len = 0;
  for (int32_t l : md.seq_lens_host) md.max_seq_len = std::max(md.max_seq_len, l);
  return in;
}

size_t ModelRunner::capture_decode_graphs(const std::vector<int>& batch_sizes) {
  if (batch_sizes.empty()) return 0;
  graphs_ = std::make_unique<PaddedGraphs>(backend_);
  graph_outputs_.clear();
  const int64_t width = (config_.max_model_len + config_.num_spec_tokens + config_.block_size - 1) / config_.block_size;
  d_graph_block_tables_ = backend_.empty({config_.max_num_seqs, width}, DType::kI32);
  backend_.zero(d_graph_block_tables_);
  std::vector<int> sizes;
  for (int s : batch_sizes)
    if (s > 0 && s <= config_.max_num_seqs) sizes.push_back(s);
  try {
    graphs_->capture(sizes, [&](int size) {
      // Only outside capture: fill the static buffers with an all-padding batch (the capture
      // itself must not copy from the host).
      if (graph_outputs_.count(size) == 0 || !graph_outputs_[size].logits.defined()) {
        backend_.synchronize();
        int32_t* tokens = h_tokens_.data_as<int32_t>();
        int32_t* positions = h_positions_.data_as<int32_t>();
        int64_t* slots = h_slots_.data_as<int64_t>();
        int32_t* qsl = h_qsl_.data_as<int32_t>();
        int32_t* lens = h_seq_lens_.data_as<int32_t>();
        int32_t* logits_idx = h_logits_idx_.data_as<int32_t>();
        qsl[0] = 0;
        for (int s = 0; s < size; ++s) {
          tokens[s] = 0;
          positions[s] = 0;
          slots[s] = -1;
          qsl[s + 1] = s + 1;
          lens[s] = 1;
          logits_idx[s] = s;
        }
        upload(h_tokens_, d_tokens_, size);
        upload(h_positions_, d_positions_, size);
        upload(h_slots_, d_slots_, size);
        upload(h_qsl_, d_qsl_, size + 1);
        upload(h_seq_lens_, d_seq_lens_, size);
        upload(h_logits_idx_, d_logits_idx_, size);
        backend_.synchronize();
      }
      graph_outputs_[size] = model_.forward(static_decode_input(size, /*for_capture=*/true), kv_);
    });
  } catch (const Error& e) {
    LOG_WARN("CUDA graphs: {}; decode steps of more than {} sequences run eagerly", e.what(),
             graphs_->empty() ? 0 : graphs_->sizes().back());
  }
  // Drop the warm-up outputs of sizes whose capture failed.
  for (auto it = graph_outputs_.begin(); it != graph_outputs_.end();)
    it = graphs_->padded_size(it->first) == it->first ? std::next(it) : graph_outputs_.erase(it);
  return graphs_->size();
}

int ModelRunner::decode_graph_size(int num_seqs, int t, int num_logits) const {
  if (!graphs_ || graphs_->empty() || t != num_seqs || num_logits != num_seqs) return 0;
  const int32_t* idx = h_logits_idx_.data_as<int32_t>();
  for (int s = 0; s < num_seqs; ++s)
    if (idx[s] != s) return 0;
  return graphs_->padded_size(num_seqs);
}

ForwardInput ModelRunner::decode_graph_inputs(int size, int num_seqs, int max_blocks) {
  int32_t* tokens = h_tokens_.data_as<int32_t>();
  int32_t* positions = h_positions_.data_as<int32_t>();
  int64_t* slots = h_slots_.data_as<int64_t>();
  int32_t* qsl = h_qsl_.data_as<int32_t>();
  int32_t* lens = h_seq_lens_.data_as<int32_t>();
  int32_t* logits_idx = h_logits_idx_.data_as<int32_t>();
  for (int s = num_seqs; s < size; ++s) {
    tokens[s] = 0;
    positions[s] = 0;
    slots[s] = -1;
    qsl[s + 1] = s + 1;
    lens[s] = 1;
    logits_idx[s] = s;
  }
  upload(h_tokens_, d_tokens_, size);
  upload(h_positions_, d_positions_, size);
  upload(h_slots_, d_slots_, size);
  upload(h_qsl_, d_qsl_, size + 1);
  upload(h_seq_lens_, d_seq_lens_, size);
  upload(h_logits_idx_, d_logits_idx_, size);
  // The step's block-table rows go up as compactly as prepare_inputs laid them out, then into the
  // first columns of the static full-width table (one strided device copy).
  Tensor compact = upload(h_block_tables_, d_block_tables_, static_cast<int64_t>(num_seqs) * max_blocks)
                       .reshape({num_seqs, max_blocks});
  Tensor rows = d_graph_block_tables_.slice(0, num_seqs);
  backend_.copy_columns(compact, 0, rows, 0, max_blocks);
  graph_size_ = size;
  return static_decode_input(size, /*for_capture=*/false);
}

ForwardOutput ModelRunner::forward_step(const ForwardInput& input) {
  const int size = graph_size_;
  graph_size_ = 0;
  if (size > 0) {
    SPECULA_CHECK(graphs_->replay(size), "internal error: no decode graph of size {}", size);
    return graph_outputs_.at(size);
  }
  return model_.forward(input, kv_);
}

}  // namespace specula
