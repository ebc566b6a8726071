#include "spec_decode/ngram_proposer.h"

#include <algorithm>

namespace specula {

std::vector<int32_t> ngram_lookup(std::span<const int32_t> tokens, int min_n, int max_n, int k) {
  const int len = static_cast<int>(tokens.size());
  if (k <= 0 || min_n < 1 || len <= min_n) return {};
  max_n = std::min(max_n, len - 1);
  // Scan earlier end points e (the occurrence is tokens[e - n, e), followed by tokens[e]) from
  // the most recent back; keep the longest match, the most recent among equals. The match length
  // at e is the common suffix of tokens[0, e) and tokens[0, len), at most max_n.
  int best_len = 0, best_end = -1;
  for (int e = len - 1; e >= min_n; --e) {
    int m = 0;
    while (m < max_n && m < e && tokens[e - 1 - m] == tokens[len - 1 - m]) ++m;
    if (m > best_len) {
      best_len = m;
      best_end = e;
      if (m == max_n) break;
    }
  }
  if (best_len < min_n) return {};
  const int n = std::min(k, len - best_end);
  return std::vector<int32_t>(tokens.begin() + best_end, tokens.begin() + best_end + n);
}

void NgramProposer::propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) {
  drafts.assign(batch.requests.size(), {});
  if (batch.depth <= 0) return;
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    const ProposerRequest& r = batch.requests[i];
    if (!r.sampled || r.max_drafts <= 0) continue;
    drafts[i] = ngram_lookup(r.tokens, min_n_, max_n_, std::min(batch.depth, r.max_drafts));
  }
}

}  // namespace specula
