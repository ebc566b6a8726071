// The inputs of a proposer's catch-up forward (draft_model_proposer.h, mtp_proposer.h): host
// staging and device twins of [max_num_batched_tokens] token rows and [max_num_seqs] sequences,
// in one of two layouts:
//   - varlen: each piece's positions back to back, block tables as wide as the widest piece
//     (the eager forward);
//   - uniform: `rows` rows per request at a padded batch size, block tables at full width (the
//     layout of a catch-up graph, whose replay reads these same buffers).
// What goes in the token rows (the draft's own tokens, MTP's next token and hidden row) is the
// proposer's; this holds the buffers and the metadata both layouts build the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "spec_decode/draft_step_helpers.h"

namespace specula {

class DraftCatchUpBuffers {
 public:
  void allocate(Backend& backend, int max_tokens, int max_num_seqs, int max_blocks_per_seq, int block_size);

  // Varlen block tables: row s holds piece s's blocks up to seq_lens.host[s], then zeros to
  // `width` (seq_lens must be filled).
  void fill_varlen_tables(const ProposeBatch& batch, const std::vector<CatchUpPiece>& pieces, int width);
  // Uploads the varlen staging (t token rows, num_seqs sequences, num_logits logits rows, tables
  // `width` wide) and returns its forward input.
  ForwardInput upload_varlen(int num_seqs, int t, int num_logits, int max_query, int max_seq, int width);

  // The uniform layout's input of `size` requests of `rows` rows, from the device buffers; the
  // caller sets logits_indices and the host lengths (seq_lens_host, max_seq_len).
  ForwardInput uniform_input(int size, int rows) const;
  // Uploads an all-padding uniform batch of `most` requests for a capture: `rows` tokens 0 at
  // positions 0..rows-1, slot -1, length rows, block 0 (the runner's padding). No sync.
  void upload_uniform_padding(int most, int rows);

  StagedTensor tokens, positions, slots, qsl, seq_lens, tables, logits_idx;

 private:
  Backend* backend_ = nullptr;
  int block_size_ = 0;
  int max_blocks_per_seq_ = 0;
};

}  // namespace specula
