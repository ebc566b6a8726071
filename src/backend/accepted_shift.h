// Speculative decoding's launch-ahead (spec_decode/README.md): under async scheduling a proposer
// launches its next catch-up and drafts before the host has read the step's verification. It
// stages them on the host as if every request had accepted no draft; Backend::shift_by_accepted
// then moves them on the device by the drafts each request did accept.
#pragma once

#include "core/tensor.h"

namespace specula {

struct AcceptedShift {
  // Request i (< num_requests) verified k drafts: rows i * (k + 1) + j of `inputs` (I32: its last
  // token, then drafts 1..k, as the target's forward read them) and of `sampled` (I32: the
  // target's token of each row). It accepted a_i = the number of leading j in 1..k with
  // inputs[i * (k + 1) + j] == sampled[i * (k + 1) + j - 1]: the acceptance of deterministic
  // drafts (sampling/rejection_math.h), whose rows sample exactly as plain sampling does.
  Tensor inputs, sampled;
  int num_requests = 0;
  int k = 0;
  // The staged rows. Entry e (< entries) of request i sits at i * request_stride + e *
  // entry_stride of `positions` (I32: += a_i) and `slots` (I64: where >= 0, the slot of the new
  // position through row i of block_tables, I32 [>= num_requests, width]; -1 past its width).
  Tensor positions, slots;
  int entries = 0, request_stride = 0, entry_stride = 0;
  // I32, += a_i: one per request at i * seq_lens_request_stride when seq_lens_entry_stride is 0,
  // else one per entry at i * seq_lens_request_stride + e * seq_lens_entry_stride.
  // slots, seq_lens and block_tables may be left undefined: `positions` are then plain row
  // indices moved by a_i (a hidden-state proposer's catch-up: the row its first draft and its
  // chain start from).
  Tensor seq_lens;
  int seq_lens_request_stride = 0, seq_lens_entry_stride = 0;
  Tensor block_tables;
  int block_size = 0;
  // Optional (I32, entries == 2): a tokens-only catch-up of positions s + a_i and s + a_i + 1 (s:
  // the verification's first position): entry 0 gets inputs[i * (k + 1) + a_i], the last
  // accepted token, entry 1 sampled[i * (k + 1) + a_i], the target's token after it.
  Tensor tokens;
};

}  // namespace specula
