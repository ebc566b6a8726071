#include "model/vocab_parallel_embedding.h"

#include "backend/communicator.h"

namespace specula {

void embed_tokens(Backend& backend, const TensorParallelRank& tp, const Tensor& ids, const Tensor& table, Tensor& out) {
  if (tp.size == 1) {
    backend.embedding(ids, table, out);
    return;
  }
  backend.vocab_parallel_embedding(ids, table, tp.rank * table.size(0), out);
  tp.communicator->all_reduce_sum(out);
}

}  // namespace specula
