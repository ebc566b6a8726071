#include "spec_decode/draft_catch_up_buffers.h"

#include <algorithm>

namespace specula {

void DraftCatchUpBuffers::allocate(Backend& backend, int max_tokens, int max_num_seqs, int max_blocks_per_seq,
                                   int block_size) {
  backend_ = &backend;
  block_size_ = block_size;
  max_blocks_per_seq_ = max_blocks_per_seq;
  const int64_t t = max_tokens, s = max_num_seqs, w = max_blocks_per_seq;
  tokens.allocate(backend, t, DType::kI32);
  positions.allocate(backend, t, DType::kI32);
  slots.allocate(backend, t, DType::kI64);
  qsl.allocate(backend, s + 1, DType::kI32);
  seq_lens.allocate(backend, s, DType::kI32);
  tables.allocate(backend, s * w, DType::kI32);
  logits_idx.allocate(backend, s, DType::kI32);
}

void DraftCatchUpBuffers::fill_varlen_tables(const ProposeBatch& batch, const std::vector<CatchUpPiece>& pieces,
                                             int width) {
  const int32_t* lens = seq_lens.host.data_as<int32_t>();
  int32_t* rows = tables.host.data_as<int32_t>();
  for (size_t s = 0; s < pieces.size(); ++s) {
    const ProposerRequest& r = batch.requests[pieces[s].req];
    const int used = ceil_div(lens[s], block_size_);
    int32_t* row = rows + s * static_cast<size_t>(width);
    std::copy(r.block_ids.begin(), r.block_ids.begin() + used, row);
    std::fill(row + used, row + width, 0);
  }
}

ForwardInput DraftCatchUpBuffers::upload_varlen(int num_seqs, int t, int num_logits, int max_query, int max_seq,
                                                int width) {
  Backend& backend = *backend_;
  ForwardInput in;
  in.token_ids = tokens.upload(backend, t);
  in.positions = positions.upload(backend, t);
  in.logits_indices = logits_idx.upload(backend, num_logits);
  AttentionMetadata& md = in.attn;
  md.num_seqs = num_seqs;
  md.num_tokens = t;
  md.max_query_len = max_query;
  md.max_seq_len = max_seq;
  md.block_size = block_size_;
  md.query_start_loc = qsl.upload(backend, num_seqs + 1);
  md.seq_lens = seq_lens.upload(backend, num_seqs);
  md.slot_mapping = slots.upload(backend, t);
  md.block_tables = tables.upload(backend, static_cast<int64_t>(num_seqs) * width).reshape({num_seqs, width});
  const int32_t* q = qsl.host.data_as<int32_t>();
  const int32_t* lens = seq_lens.host.data_as<int32_t>();
  md.query_start_loc_host.assign(q, q + num_seqs + 1);
  md.seq_lens_host.assign(lens, lens + num_seqs);
  return in;
}

ForwardInput DraftCatchUpBuffers::uniform_input(int size, int rows) const {
  const int w = max_blocks_per_seq_;
  const int t = size * rows;
  ForwardInput in;
  in.token_ids = tokens.device.slice(0, t);
  in.positions = positions.device.slice(0, t);
  AttentionMetadata& md = in.attn;
  md.num_seqs = size;
  md.num_tokens = t;
  md.max_query_len = rows;
  md.block_size = block_size_;
  md.query_start_loc = qsl.device.slice(0, size + 1);
  md.seq_lens = seq_lens.device.slice(0, size);
  md.slot_mapping = slots.device.slice(0, t);
  md.block_tables = tables.device.slice(0, static_cast<int64_t>(size) * w).reshape({size, w});
  md.query_start_loc_host.resize(static_cast<size_t>(size) + 1);
  for (int s = 0; s <= size; ++s) md.query_start_loc_host[static_cast<size_t>(s)] = s * rows;
  return in;
}

void DraftCatchUpBuffers::upload_uniform_padding(int most, int rows) {
  Backend& backend = *backend_;
  const int64_t w = max_blocks_per_seq_;
  int32_t* q = qsl.host.data_as<int32_t>();
  q[0] = 0;
  for (int s = 0; s < most; ++s) {
    for (int j = 0; j < rows; ++j) {
      tokens.host.data_as<int32_t>()[s * rows + j] = 0;
      positions.host.data_as<int32_t>()[s * rows + j] = j;
      slots.host.data_as<int64_t>()[s * rows + j] = -1;
    }
    q[s + 1] = (s + 1) * rows;
    seq_lens.host.data_as<int32_t>()[s] = rows;
  }
  std::fill_n(tables.host.data_as<int32_t>(), static_cast<size_t>(most) * w, 0);
  tokens.upload(backend, static_cast<int64_t>(most) * rows);
  positions.upload(backend, static_cast<int64_t>(most) * rows);
  slots.upload(backend, static_cast<int64_t>(most) * rows);
  qsl.upload(backend, most + 1);
  seq_lens.upload(backend, most);
  tables.upload(backend, most * w);
}

}  // namespace specula
