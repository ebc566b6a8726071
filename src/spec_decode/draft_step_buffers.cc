#include "spec_decode/draft_step_buffers.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace specula {

int64_t draft_kv_slot(const ProposerRequest& r, int pos, int block_size, std::string_view cache) {
  const size_t block = static_cast<size_t>(pos / block_size);
  SPECULA_CHECK(block < r.block_ids.size(), "internal error: {} position {} of request {} has no block ({} held)",
                cache, pos, r.req_id, r.block_ids.size());
  return static_cast<int64_t>(r.block_ids[block]) * block_size + pos % block_size;
}

void DraftStepBuffers::allocate(Backend& backend, int max_num_seqs, int max_blocks_per_seq, int block_size,
                                const char* cache, int max_chain_steps) {
  backend_ = &backend;
  cache_ = cache;
  block_size_ = block_size;
  max_blocks_per_seq_ = max_blocks_per_seq;
  const int64_t s = max_num_seqs, w = max_blocks_per_seq;
  tokens_.allocate(backend, s, DType::kI32);
  positions_.allocate(backend, s, DType::kI32);
  slots_.allocate(backend, s, DType::kI64);
  seq_lens_.allocate(backend, s, DType::kI32);
  tables_.allocate(backend, s * w, DType::kI32);
  qsl_host_.resize(static_cast<size_t>(s) + 1);
  std::iota(qsl_host_.begin(), qsl_host_.end(), 0);
  qsl_ = backend.empty({s + 1}, DType::kI32);
  backend.copy(Tensor::from_i32(qsl_host_), qsl_);
  logits_idx_ = backend.empty({s}, DType::kI32);
  backend.copy(Tensor::from_i32(std::vector<int32_t>(qsl_host_.begin(), qsl_host_.end() - 1)), logits_idx_);
  seq_lens_host_.assign(static_cast<size_t>(s), 1);
  max_chain_steps_ = max_chain_steps;
  if (max_chain_steps > 0) {
    chain_positions_.allocate(backend, s * max_chain_steps, DType::kI32);
    chain_slots_.allocate(backend, s * max_chain_steps, DType::kI64);
    chain_seq_lens_.allocate(backend, s * max_chain_steps, DType::kI32);
  }
}

void DraftStepBuffers::fill_row(const ProposeBatch& batch, const std::vector<AttendedBlocks>& attended,
                                const std::vector<size_t>& rows, int row, int step, const std::vector<int>& num_drafts,
                                int first_back, int32_t& position, int64_t& slot, int32_t& seq_len) const {
  if (row >= static_cast<int>(rows.size())) {
    position = 0;
    slot = -1;
    seq_len = 1;
    return;
  }
  const size_t i = rows[static_cast<size_t>(row)];
  const ProposerRequest& r = batch.requests[i];
  const int first = static_cast<int>(r.tokens.size()) - first_back;  // the row draft 1 came from
  if (num_drafts[i] >= step) {
    // Draft `step` comes from draft step-1, one position further along.
    position = first + step - 1;
    slot = draft_kv_slot(r, position, block_size_, cache_);
  } else {  // done drafting: idle on its last real position without writing
    position = first;
    slot = -1;
  }
  seq_len = position + 1 - attended[i].removed * block_size_;
}

void DraftStepBuffers::fill_tables(const ProposeBatch& batch, const std::vector<AttendedBlocks>& attended,
                                   const std::vector<size_t>& rows, int padded) {
  const int w = max_blocks_per_seq_;
  int32_t* tables = tables_.host.data_as<int32_t>();
  // Padding rows attend to position 0 of the first real row's first block, which holds valid
  // K/V: finite values for kernels that read before they mask.
  const int32_t pad_block = batch.requests[rows.front()].block_ids.front();
  for (int row = 0; row < padded; ++row) {
    int32_t* dst = tables + static_cast<size_t>(row) * w;
    if (row >= static_cast<int>(rows.size())) {
      std::fill(dst, dst + w, 0);
      dst[0] = pad_block;
      continue;
    }
    const std::span<const int32_t> blocks = attended[rows[static_cast<size_t>(row)]].blocks;
    const size_t used = std::min(blocks.size(), static_cast<size_t>(w));
    std::copy(blocks.begin(), blocks.begin() + used, dst);
    std::fill(dst + used, dst + w, 0);
  }
}

void DraftStepBuffers::prepare(const ProposeBatch& batch, const std::vector<AttendedBlocks>& attended,
                               const std::vector<size_t>& rows, int step, int padded,
                               const std::vector<std::vector<int32_t>>& drafts, const std::vector<int>& num_drafts,
                               bool upload_tables, int first_back) {
  Backend& backend = *backend_;
  backend.synchronize();  // pinned staging: the previous step's uploads must have run
  int32_t* tokens = tokens_.host.data_as<int32_t>();
  int32_t* positions = positions_.host.data_as<int32_t>();
  int64_t* slots = slots_.host.data_as<int64_t>();
  int32_t* seq_lens = seq_lens_.host.data_as<int32_t>();
  max_seq_len_ = 1;
  for (int row = 0; row < padded; ++row) {
    fill_row(batch, attended, rows, row, step, num_drafts, first_back, positions[row], slots[row], seq_lens[row]);
    max_seq_len_ = std::max(max_seq_len_, seq_lens[row]);
    if (row >= static_cast<int>(rows.size())) {
      tokens[row] = 0;
      continue;
    }
    const size_t i = rows[static_cast<size_t>(row)];
    // Draft `step`'s input is draft step-1; a row done drafting idles on its last token.
    tokens[row] = num_drafts[i] >= step ? drafts[i][static_cast<size_t>(step - 2)] : batch.requests[i].tokens.back();
  }
  StagedUploads uploads(backend);
  uploads.add(tokens_, padded);
  uploads.add(positions_, padded);
  uploads.add(slots_, padded);
  uploads.add(seq_lens_, padded);
  if (upload_tables) {
    fill_tables(batch, attended, rows, padded);
    uploads.add(tables_, static_cast<int64_t>(padded) * max_blocks_per_seq_);
  }
  uploads.run();
  std::copy(seq_lens, seq_lens + padded, seq_lens_host_.begin());
}

void DraftStepBuffers::prepare_chain(const ProposeBatch& batch, const std::vector<AttendedBlocks>& attended,
                                     const std::vector<size_t>& rows, int steps, int padded,
                                     const std::vector<int>& num_drafts, int first_back) {
  SPECULA_CHECK(steps >= 1 && steps <= max_chain_steps_,
                "internal error: a draft chain of {} steps (buffers for {})", steps, max_chain_steps_);
  Backend& backend = *backend_;
  // Pinned staging: the last chain's uploads must have run. An event, not a synchronisation: the
  // proposer stages the chain while its catch-up forward runs.
  if (chain_uploaded_) chain_uploaded_->wait();
  int32_t* positions = chain_positions_.host.data_as<int32_t>();
  int64_t* slots = chain_slots_.host.data_as<int64_t>();
  int32_t* seq_lens = chain_seq_lens_.host.data_as<int32_t>();
  for (int j = 0; j < steps; ++j)
    for (int row = 0; row < padded; ++row) {
      const int at = j * padded + row;
      fill_row(batch, attended, rows, row, j + 2, num_drafts, first_back, positions[at], slots[at], seq_lens[at]);
    }
  const int64_t n = static_cast<int64_t>(steps) * padded;
  fill_tables(batch, attended, rows, padded);
  StagedUploads uploads(backend);
  uploads.add(chain_positions_, n);
  uploads.add(chain_slots_, n);
  uploads.add(chain_seq_lens_, n);
  uploads.add(tables_, static_cast<int64_t>(padded) * max_blocks_per_seq_);
  uploads.run();
  chain_uploaded_ = backend.record_event();
  chain_steps_ = steps;
  chain_padded_ = padded;
  chain_lens_slack_ = 0;
  chain_first_back_ = first_back;
}

void DraftStepBuffers::shift_chain(const Tensor& inputs, const Tensor& sampled, int k, int num_requests) {
  SPECULA_CHECK(chain_steps_ > 0 && num_requests <= chain_padded_,
                "internal error: a launch-ahead of {} requests over a chain of {} rows", num_requests, chain_padded_);
  const int64_t n = static_cast<int64_t>(chain_steps_) * chain_padded_, w = max_blocks_per_seq_;
  AcceptedShift shift;
  shift.inputs = inputs;
  shift.sampled = sampled;
  shift.num_requests = num_requests;
  shift.k = k;
  shift.positions = chain_positions_.device.slice(0, n);
  shift.slots = chain_slots_.device.slice(0, n);
  shift.entries = chain_steps_;
  shift.request_stride = 1;
  shift.entry_stride = chain_padded_;
  shift.seq_lens = chain_seq_lens_.device.slice(0, n);
  shift.seq_lens_request_stride = 1;
  shift.seq_lens_entry_stride = chain_padded_;
  shift.block_tables = tables_.device.slice(0, chain_padded_ * w).reshape({chain_padded_, w});
  shift.block_size = block_size_;
  backend_->shift_by_accepted(shift);
  // On the CPU the device side is host memory, which load_chain_step reads (true lengths).
  chain_lens_slack_ = backend_->device() == Device::kCPU ? 0 : k;
}

void DraftStepBuffers::load_chain_step(int step) {
  SPECULA_CHECK(step >= 2 && step < 2 + chain_steps_, "internal error: step {} of a {}-step draft chain", step,
                chain_steps_);
  Backend& backend = *backend_;
  const int64_t p = chain_padded_, off = (step - 2) * p;
  Tensor positions = positions_.device.slice(0, p), slots = slots_.device.slice(0, p),
         seq_lens = seq_lens_.device.slice(0, p);
  backend.copy(chain_positions_.device.slice(off, off + p), positions);
  backend.copy(chain_slots_.device.slice(off, off + p), slots);
  backend.copy(chain_seq_lens_.device.slice(off, off + p), seq_lens);
  // The host's lengths (launch shapes, the CPU's attention): on the CPU the device side is host
  // memory and holds the true ones (a launch-ahead moves them there); elsewhere the staged ones
  // with the slack a launch-ahead may add.
  const Tensor& staged = backend.device() == Device::kCPU ? chain_seq_lens_.device : chain_seq_lens_.host;
  const int32_t* lens = staged.data_as<int32_t>() + off;
  for (int64_t r = 0; r < p; ++r) seq_lens_host_[static_cast<size_t>(r)] = lens[r] + chain_lens_slack_;
  max_seq_len_ = *std::max_element(seq_lens_host_.begin(), seq_lens_host_.begin() + p);
}

void DraftStepBuffers::fill_chain(DecoderChain& chain) const {
  const int64_t n = static_cast<int64_t>(chain_steps_) * chain_padded_, w = max_blocks_per_seq_;
  chain.rows = chain_padded_;
  chain.steps = chain_steps_;
  chain.positions = chain_positions_.device.slice(0, n);
  chain.slots = chain_slots_.device.slice(0, n);
  chain.block_tables = tables_.device.slice(0, chain_padded_ * w).reshape({chain_padded_, w});
  chain.block_size = block_size_;
  // Step j's row sits at tokens.size() - first_back + j - 1 and draws draft j, at tokens.size() + j - 1.
  chain.draw_offset = chain_first_back_;
}

ForwardInput DraftStepBuffers::input_shell(int padded) const {
  const int w = max_blocks_per_seq_;
  ForwardInput in;
  in.token_ids = tokens_.device.slice(0, padded);
  in.positions = positions_.device.slice(0, padded);
  in.logits_indices = logits_idx_.slice(0, padded);
  AttentionMetadata& md = in.attn;
  md.num_seqs = padded;
  md.num_tokens = padded;
  md.max_query_len = 1;
  md.block_size = block_size_;
  md.query_start_loc = qsl_.slice(0, padded + 1);
  md.seq_lens = seq_lens_.device.slice(0, padded);
  md.slot_mapping = slots_.device.slice(0, padded);
  md.block_tables = tables_.device.slice(0, static_cast<int64_t>(padded) * w).reshape({padded, w});
  md.query_start_loc_host.assign(qsl_host_.begin(), qsl_host_.begin() + padded + 1);
  return in;
}

ForwardInput DraftStepBuffers::input(int padded) const {
  ForwardInput in = input_shell(padded);
  in.attn.seq_lens_host.assign(seq_lens_host_.begin(), seq_lens_host_.begin() + padded);
  in.attn.max_seq_len = max_seq_len_;
  return in;
}

ForwardInput DraftStepBuffers::capture_input(int padded, int longest) const {
  ForwardInput in = input_shell(padded);
  in.attn.seq_lens_host.assign(static_cast<size_t>(padded), longest);
  in.attn.max_seq_len = longest;
  return in;
}

void DraftStepBuffers::fill_padding(int most) {
  Backend& backend = *backend_;
  const int64_t w = max_blocks_per_seq_;
  backend.synchronize();
  std::fill_n(tokens_.host.data_as<int32_t>(), most, 0);
  std::fill_n(positions_.host.data_as<int32_t>(), most, 0);
  std::fill_n(slots_.host.data_as<int64_t>(), most, int64_t{-1});
  std::fill_n(seq_lens_.host.data_as<int32_t>(), most, 1);
  std::fill_n(tables_.host.data_as<int32_t>(), static_cast<size_t>(most) * w, 0);
  tokens_.upload(backend, most);
  positions_.upload(backend, most);
  slots_.upload(backend, most);
  seq_lens_.upload(backend, most);
  tables_.upload(backend, most * w);
  backend.synchronize();
}

}  // namespace specula
