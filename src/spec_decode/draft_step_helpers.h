// Small pieces the model-running proposers (draft_model_proposer.h, mtp_proposer.h) share: the
// per-request state map with its q-store slots, a host-staged device tensor, the K/V slot of a
// position, the sampling row of a draft, and the draft's own paged cache. Their step and catch-up
// input buffers are in draft_step_buffers.h and draft_catch_up_buffers.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "sampling/draft_sampler.h"
#include "spec_decode/proposer.h"

namespace specula {

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// A run of one request's positions [from, to) through a proposer's catch-up forward.
struct CatchUpPiece {
  size_t req = 0;         // index into the batch
  int from = 0, to = 0;
  bool drafts = false;    // its last row samples the first draft
};

// Host staging (pinned where the backend has it, so uploads are asynchronous: a pageable one
// waits for the stream, some fifteen of them a step) and its device twin. Rewriting the host side
// must wait for the copies out of it (Backend::synchronize).
struct StagedTensor {
  Tensor host, device;
  void allocate(Backend& backend, int64_t n, DType type);
  // Copies host[0, n) into device[0, n) (nothing when n == 0); returns device[0, n).
  Tensor upload(Backend& backend, int64_t n);
};

// The paged K/V slot of position `pos` of `r`; `cache` names the cache in the error.
int64_t draft_kv_slot(const ProposerRequest& r, int pos, int block_size, std::string_view cache);

// The sampling row of the token at `position` == context.size(), `context` being the request's
// tokens followed by the drafts so far: exactly the settings the target's verification row of
// that position will use.
SamplingRow draft_sampling_row(const ProposerRequest& r, int logits_row, int position,
                               const std::vector<int32_t>& context);

// A proposer's own paged cache on the target's blocks: one layer per spec layer, zeroed on a
// device as the target's cache is (model_runner.cc), left to the OS's zero pages on the host.
std::vector<KVCacheLayer> allocate_draft_kv_cache(Backend& backend, const KVCacheSpec& spec, int num_blocks,
                                                  int block_size);

// The requests a proposer tracks, each with a slot: its k rows of the q store. `State` has an
// `int slot`. Slots are handed out lowest first and come back when a request is dropped.
template <class State>
class DraftRequestStates {
 public:
  DraftRequestStates(int max_num_seqs, int num_speculative_tokens, std::string_view method)
      : max_num_seqs_(max_num_seqs), num_speculative_tokens_(num_speculative_tokens), method_(method) {
    for (int s = max_num_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
  }

  State& get_or_add(std::string_view req_id) {
    auto it = states_.find(std::string(req_id));
    if (it != states_.end()) return it->second;
    SPECULA_CHECK(!free_slots_.empty(), "internal error: {} proposer tracks more than max_num_seqs ({}) requests",
                  method_, max_num_seqs_);
    State st;
    st.slot = free_slots_.back();
    free_slots_.pop_back();
    return states_.emplace(std::string(req_id), std::move(st)).first->second;
  }
  State& at(std::string_view req_id) { return states_.at(std::string(req_id)); }
  const State* find(std::string_view req_id) const {
    auto it = states_.find(std::string(req_id));
    return it == states_.end() ? nullptr : &it->second;
  }
  void drop(std::string_view req_id) {
    auto it = states_.find(std::string(req_id));
    if (it == states_.end()) return;
    free_slots_.push_back(it->second.slot);
    states_.erase(it);
  }
  // The first q-store row of the request's drafts; -1 when untracked.
  int q_row(std::string_view req_id) const {
    const State* st = find(req_id);
    return st ? st->slot * num_speculative_tokens_ : -1;
  }

 private:
  int max_num_seqs_, num_speculative_tokens_;
  std::string method_;
  std::unordered_map<std::string, State> states_;
  std::vector<int> free_slots_;
};

}  // namespace specula
