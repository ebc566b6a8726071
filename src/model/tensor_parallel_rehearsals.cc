#include "model/tensor_parallel_rehearsals.h"

namespace specula {

TensorParallelRehearsals::Kind TensorParallelRehearsals::needed(const ForwardInput& step) {
  const AttentionMetadata& md = step.attn;
  const int64_t width =
      md.block_tables.defined() && md.block_tables.ndim() == 2 ? md.block_tables.size(1) : md.max_seq_len;
  const std::array<int64_t, 6> sizes{step.token_ids.numel(), step.logits_indices.numel(), md.num_seqs,
                                     md.max_query_len, width, md.num_seqs * width};
  bool larger = false;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > largest_[i]) {
      largest_[i] = sizes[i];
      larger = true;
    }
  auto rows_class = [this](int64_t rows) { return rows_class_ ? rows_class_(rows) : rows; };
  const bool new_tokens = tokens_run_.insert(rows_class(sizes[0])).second;
  const bool new_logits_rows = logits_rows_run_.insert(rows_class(sizes[1])).second;
  ++steps_;
  if (!larger && !new_tokens && !new_logits_rows) return Kind::kNone;
  ++rehearsed_;
  if (!larger) return Kind::kAsIs;
  ++at_longest_;
  return Kind::kAtLongest;
}

}  // namespace specula
