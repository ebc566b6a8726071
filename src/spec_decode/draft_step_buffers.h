// The static inputs of a padded draft step: drafts 2..k of a model-running proposer
// (model_proposer.h) run one decode row per drafting request over these buffers, at a padded
// batch size, so that a step reads nothing else and a CUDA graph captured over them replays with
// new contents (prepare() refills them with plain copies before each step). A greedy chain
// (draft_chain.h) stages all its steps here at once. What a step computes (the draft
// model, an MTP layer with its chained hidden state) is the proposer's; this is only its inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "engine/speculator.h"
#include "spec_decode/staged_tensor.h"

namespace specula {

// The paged K/V slot of position `pos` of `r` on its block table; `cache` names the cache in the
// error.
int64_t draft_kv_slot(const ProposerRequest& r, int pos, int block_size, std::string_view cache);

// What a request's rows attend to in the proposer's cache: its blocks but those whose entries are
// all another request's (positions shed under load), which come before every row it runs, so that
// keys are these blocks' positions in order and a row's length is its position + 1 less
// `removed` blocks. Writes still go to the request's own slots.
struct AttendedBlocks {
  std::span<const int32_t> blocks;
  int removed = 0;
};

class DraftStepBuffers {
 public:
  // [max_num_seqs] rows; block tables [max_num_seqs, max_blocks_per_seq]. `cache` names the
  // proposer's cache in errors. max_chain_steps: the longest chain prepare_chain stages (0: none).
  void allocate(Backend& backend, int max_num_seqs, int max_blocks_per_seq, int block_size, const char* cache,
                int max_chain_steps = 0);

  // Fills the first `padded` rows for draft `step` (2..k) of the requests `rows` (batch indices):
  // row i's input is draft step-1 at position tokens.size() - first_back + step - 1, where the row
  // that sampled draft 1 sits at tokens.size() - first_back. A row that has all its drafts idles
  // on that position without writing K/V; rows past the real ones are padding. The block tables
  // only upload when `upload_tables` (they do not change between the steps of one propose).
  // Waits for the previous step's uploads first (pinned staging).
  // `attended`: per request of the batch, what it attends to.
  void prepare(const ProposeBatch& batch, const std::vector<AttendedBlocks>& attended, const std::vector<size_t>& rows,
               int step, int padded, const std::vector<std::vector<int32_t>>& drafts,
               const std::vector<int>& num_drafts, bool upload_tables, int first_back);
  // A chain: drafts 2..1+steps run back to back with no host round trip, each step's tokens
  // written on the device (by the caller's argmax) into tokens(). prepare_chain stages every
  // step's positions, slots and lengths at once (rows as prepare() fills them for that step) and
  // uploads them with the block tables; load_chain_step(j) then makes step j current with device
  // copies enqueued behind the previous step's forward (and sets the host lengths input() reports).
  // Waits for the last chain's uploads first (pinned staging), not for other work.
  void prepare_chain(const ProposeBatch& batch, const std::vector<AttendedBlocks>& attended,
                     const std::vector<size_t>& rows, int steps, int padded, const std::vector<int>& num_drafts,
                     int first_back);
  void load_chain_step(int step);
  // Launch-ahead: moves the staged chain (rows: the first num_requests requests of the batch) by
  // the drafts each accepted (backend/accepted_shift.h), on the device.
  void shift_chain(const Tensor& inputs, const Tensor& sampled, int k, int num_requests);
  // The staged chain as a fused chain's inputs (Model::decoder_chain): rows, steps, positions,
  // slots and block tables, every step's rows at once, and where each step's draft sits.
  void fill_chain(DecoderChain& chain) const;
  // The static token input of the first `padded` rows.
  Tensor tokens(int padded) const { return tokens_.device.slice(0, padded); }

  // The forward input of the first `padded` rows, with the lengths prepare() set.
  ForwardInput input(int padded) const;
  // The same for a graph capture: every row claims `longest` (launch shapes come from the host
  // metadata; the kernels read the true lengths at replay).
  ForwardInput capture_input(int padded, int longest) const;
  // An all-padding batch of `most` rows, for a capture: token 0 at position 0, no K/V write, one
  // key in block 0 (zeroed or written K/V: finite). Synchronizes before and after.
  void fill_padding(int most);

 private:
  ForwardInput input_shell(int padded) const;
  // Row `row`'s position, slot and length in draft step `step` (its token aside); padding rows
  // past the real ones write nothing at position 0.
  void fill_row(const ProposeBatch& batch, const std::vector<AttendedBlocks>& attended, const std::vector<size_t>& rows,
                int row, int step, const std::vector<int>& num_drafts, int first_back, int32_t& position,
                int64_t& slot, int32_t& seq_len) const;
  // Block table rows of the first `padded` rows into the host side of tables_ (padding rows
  // attend to `pad_block`'s first entry); the caller uploads them.
  void fill_tables(const ProposeBatch& batch, const std::vector<AttendedBlocks>& attended,
                   const std::vector<size_t>& rows, int padded);

  Backend* backend_ = nullptr;
  int block_size_ = 0;
  int max_blocks_per_seq_ = 0;
  const char* cache_ = "";
  StagedTensor tokens_, positions_, slots_, seq_lens_, tables_;
  // One query row per sequence: query_start_loc and the logits rows are 0, 1, 2, ... whatever
  // the batch, so they are uploaded once.
  Tensor qsl_, logits_idx_;
  std::vector<int32_t> qsl_host_, seq_lens_host_;
  int max_seq_len_ = 1;
  // The staged chain: step j's rows at offset (j - 2) * chain_padded_.
  StagedTensor chain_positions_, chain_slots_, chain_seq_lens_;
  std::unique_ptr<DeviceEvent> chain_uploaded_;  // after the last chain's uploads
  int max_chain_steps_ = 0, chain_steps_ = 0, chain_padded_ = 0;
  int chain_lens_slack_ = 0;  // the staged lengths are this much short of the true ones at most
  int chain_first_back_ = 1;  // prepare_chain's first_back: a step's draft sits this far past its row
};

}  // namespace specula
