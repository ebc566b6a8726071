// The token embedding of a model that may be split over tensor-parallel ranks: the whole table on
// one rank; on N ranks each holds V / N rows (vocab-parallel, as Megatron and vLLM split it), looks
// up the ids that fall in its rows, writes zeros for the others and the ranks' outputs are summed
// (exact: every row is one rank's values plus zeros).
#pragma once

#include "backend/backend.h"
#include "model/tensor_parallel_plan.h"

namespace specula {

// out [T, H] = the embeddings of ids I32 [T]; `table` is [V, H] (size 1) or rank tp.rank's rows
// [V / N, H], the vocabulary's rows tp.rank * V / N onwards.
void embed_tokens(Backend& backend, const TensorParallelRank& tp, const Tensor& ids, const Tensor& table, Tensor& out);

}  // namespace specula
