// TensorParallelModel: the ranks of a split model run as one; see tensor_parallel_model.h.
#include "model/tensor_parallel_model.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/thread_stacks.h"
#include "model/deepseek.h"
#include "model/llama.h"
#include "model/sharded_weight_source.h"
#include "model/tensor_parallel_plan.h"
#include "model/tensor_parallel_rehearsals.h"
#include "model/weight_quantization.h"

namespace specula {
namespace {

// One thread per rank from 1 on, kept for the model's life: run() hands every rank the same job
// (rank 0 runs it on the caller's thread) and returns when all have finished it. A rank that
// fails aborts the communicators so that the others leave their collectives instead of waiting.
class RankThreads {
 public:
  RankThreads(int size, std::function<void()> on_failure)
      : errors_(static_cast<size_t>(size)), on_failure_(std::move(on_failure)) {
    for (int rank = 1; rank < size; ++rank) threads_.emplace_back([this, rank] { loop(rank); });
  }

  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void run(const std::function<void(int rank)>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = static_cast<int>(threads_.size());
      for (std::exception_ptr& e : errors_) e = nullptr;
      first_failed_ = -1;
      ++generation_;
    }
    work_.notify_all();
    run_rank(job, 0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    // The first failure is the cause; the others are ranks that its abort woke.
    if (first_failed_ >= 0) std::rethrow_exception(errors_[static_cast<size_t>(first_failed_)]);
  }

 private:
  void run_rank(const std::function<void(int)>& job, int rank) {
    try {
      job(rank);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        errors_[static_cast<size_t>(rank)] = std::current_exception();
        if (first_failed_ < 0) first_failed_ = rank;
      }
      on_failure_();
    }
  }

  void loop(int rank) {
    name_current_thread(fmt::format("specula-rank{}", rank));  // the step watchdog reports its stack
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      run_rank(*job, rank);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --pending_;
      }
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;  // by rank
  int first_failed_ = -1;                   // the rank whose failure aborted the others
  std::function<void()> on_failure_;
  std::vector<std::thread> threads_;
};

// Makes `backend`'s device the calling thread's while it lives, then `home`'s again.
class BoundTo {
 public:
  BoundTo(Backend& backend, Backend& home) : home_(home) { backend.bind_thread(); }
  ~BoundTo() { home_.bind_thread(); }

 private:
  Backend& home_;
};

// A rank's copies of the step's inputs on its own device (persistent buffers that grow). A buffer
// outgrown is kept, not freed: a graph recorded earlier copies into it at every replay.
class RankInputs {
 public:
  // Grows the buffers for `in` (on the calling thread, binding the rank's device only to
  // allocate: never while the ranks' collectives run, where an allocation could wait for a GPU
  // that waits for a peer).
  void reserve(Backend& backend, Backend& home, const ForwardInput& in) {
    for (auto [storage, src] : {std::pair{&token_ids_, &in.token_ids}, std::pair{&positions_, &in.positions},
                                std::pair{&logits_indices_, &in.logits_indices},
                                std::pair{&query_start_loc_, &in.attn.query_start_loc},
                                std::pair{&seq_lens_, &in.attn.seq_lens}, std::pair{&block_tables_, &in.attn.block_tables},
                                std::pair{&slot_mapping_, &in.attn.slot_mapping}}) {
      if (!src->defined() || src->numel() == 0) continue;
      if (storage->defined() && storage->dtype() == src->dtype() && storage->numel() >= src->numel()) continue;
      BoundTo device(backend, home);
      if (storage->defined()) outgrown_.push_back(*storage);
      *storage = backend.empty({std::max<int64_t>(src->numel(), 2 * (storage->defined() ? storage->numel() : 0))},
                               src->dtype());
    }
  }

  // Copies the step's inputs into the buffers reserve() sized, on the rank's stream.
  ForwardInput stage(Backend& backend, const ForwardInput& in) {
    ForwardInput mine = in;
    mine.token_ids = stage(backend, token_ids_, in.token_ids);
    mine.positions = stage(backend, positions_, in.positions);
    mine.logits_indices = stage(backend, logits_indices_, in.logits_indices);
    mine.attn.query_start_loc = stage(backend, query_start_loc_, in.attn.query_start_loc);
    mine.attn.seq_lens = stage(backend, seq_lens_, in.attn.seq_lens);
    mine.attn.block_tables = stage(backend, block_tables_, in.attn.block_tables);
    mine.attn.slot_mapping = stage(backend, slot_mapping_, in.attn.slot_mapping);
    return mine;
  }

 private:
  static Tensor stage(Backend& backend, Tensor& storage, const Tensor& src) {
    if (!src.defined() || src.numel() == 0) return src;
    SPECULA_CHECK(storage.defined() && storage.numel() >= src.numel(), "tensor parallel: inputs staged unreserved");
    Tensor view = storage.slice(0, src.numel()).reshape(src.shape());
    backend.copy(src, view);
    return view;
  }

  Tensor token_ids_, positions_, logits_indices_, query_start_loc_, seq_lens_, block_tables_, slot_mapping_;
  std::vector<Tensor> outgrown_;
};

// What the ranks beyond rank 0 record while rank 0's stream records a graph (by rank; rank 0's
// entries stay empty): each rank's graph of its forward, the forward's outputs (which keep the
// rank's scratch chunk, and so the graph's activations, alive) and the failure of a rank.
struct RankCapture {
  explicit RankCapture(size_t size) : graphs(size), outputs(size), errors(size) {}
  int forwards = 0;
  std::vector<std::unique_ptr<DeviceGraph>> graphs;
  std::vector<ForwardOutput> outputs;
  std::vector<std::string> errors;
};

// A graph of the split model: rank 0's recording of the caller's work, with the other ranks'
// recordings of their share of its forward. A replay launches them all, each rank's once the work
// issued so far on rank 0's stream (the step's inputs) has run: the rank's graph starts by copying
// those inputs to its device.
class TensorParallelGraph final : public DeviceGraph {
 public:
  TensorParallelGraph(std::unique_ptr<DeviceGraph> rank0, RankCapture capture, const std::vector<Backend*>& backends)
      : rank0_(std::move(rank0)), capture_(std::move(capture)), backends_(backends) {}

  ~TensorParallelGraph() override {
    Backend& home = *backends_.front();
    for (size_t r = 1; r < backends_.size(); ++r) {
      BoundTo device(*backends_[r], home);
      capture_.graphs[r].reset();
    }
  }

  void replay() override {
    Backend& home = *backends_.front();
    for (size_t r = 1; r < backends_.size(); ++r) {
      backends_[r]->wait_for(home);
      BoundTo device(*backends_[r], home);
      capture_.graphs[r]->replay();
    }
    rank0_->replay();
  }

 private:
  std::unique_ptr<DeviceGraph> rank0_;
  RankCapture capture_;
  std::vector<Backend*> backends_;
};

// One rank's model from its shard of the weights, and the shard plan of its architecture.
using RankModelFactory =
    std::function<std::unique_ptr<Model>(WeightSource& shard, Backend& backend, const TensorParallelRank& tp)>;
using ShardPlan = WeightShard (*)(const std::string& name, const ModelConfig& config, int rank, int size);

class TensorParallelModel final : public Model {
 public:
  TensorParallelModel(const ModelConfig& config, WeightSource& weights, Backend& rank0_backend, int size,
                      const RankBackendFactory& make_backend, bool custom_all_reduce, ShardPlan plan,
                      const RankModelFactory& make_model)
      : config_(config) {
    backends_.push_back(&rank0_backend);
    rehearsals_ = TensorParallelRehearsals([&rank0_backend](int64_t rows) { return rank0_backend.matmul_rows_class(rows); });
    for (int rank = 1; rank < size; ++rank) {
      BoundTo home(rank0_backend, rank0_backend);  // a CUDA backend's constructor binds its device
      owned_backends_.push_back(make_backend(rank));
      SPECULA_CHECK(owned_backends_.back() && owned_backends_.back()->device() == rank0_backend.device(),
                    "tensor parallel: rank {}'s backend is not a {} backend like rank 0's", rank,
                    device_name(rank0_backend.device()));
      backends_.push_back(owned_backends_.back().get());
    }
    communicators_ = make_communicators(backends_, custom_all_reduce);
    const char* loading = std::getenv("CUDA_MODULE_LOADING");
    if (rank0_backend.device() == Device::kCUDA && !(loading && std::string(loading) == "EAGER"))
      LOG_WARN("Tensor parallel on CUDA with lazy kernel loading: a kernel's first launch may wait for its GPU while "
               "NCCL kernels wait for each other, a hang; set CUDA_MODULE_LOADING=EAGER before CUDA starts "
               "(specula's -tp flag does)");
    threads_ = std::make_unique<RankThreads>(size, [this] {
      for (auto& c : communicators_) c->abort();
    });
    // The ranks load their shards at once, each on its thread with its device bound.
    models_.resize(static_cast<size_t>(size));
    threads_->run([&](int rank) {
      Backend& backend = *backends_[static_cast<size_t>(rank)];
      backend.bind_thread();
      ShardedWeightSource shard(weights, rank, size, [&config, plan, rank, size](const std::string& name) {
        return plan(name, config, rank, size);
      });
      models_[static_cast<size_t>(rank)] =
          make_model(shard, backend, TensorParallelRank{rank, size, communicators_[static_cast<size_t>(rank)].get()});
      backend.synchronize();  // the rank's uploads are done before its staging buffers go
    });
    rank0_backend.bind_thread();
    rank_kv_.resize(static_cast<size_t>(size));
    rank_inputs_.resize(static_cast<size_t>(size));
  }

  ~TensorParallelModel() override {
    if (rehearsals_.steps() > 0)
      LOG_INFO("Tensor parallel: {} of {} forwards ran first as a rehearsal (new sizes: collectives off; {} of them "
               "at the longest lengths; {:.3f} s in all)",
               rehearsals_.rehearsed(), rehearsals_.steps(), rehearsals_.rehearsed_at_longest(), rehearsals_.seconds());
  }

  const ModelConfig& config() const override { return config_; }
  KVCacheSpec kv_cache_spec() const override { return models_.front()->kv_cache_spec(); }
  std::vector<KVCacheScales> kv_cache_scales() const override { return models_.front()->kv_cache_scales(); }

  // Per rank: the collectives its host has entered and whether its device has run all it was
  // given. Ranks that entered fewer are stuck on the host before a collective; equal counts with
  // busy devices wait inside one (a peer's kernel or NCCL waiting for a rank).
  std::string progress() const override {
    std::string out;
    for (size_t r = 0; r < backends_.size(); ++r)
      out += fmt::format("{}rank {}: {} collectives entered, device {}", r ? "; " : "", r,
                         communicators_[r]->collectives_entered(), backends_[r]->idle() ? "idle" : "busy");
    return out;
  }

  // Rank 0 runs on the caller's thread over the engine's inputs and cache; every other rank on
  // its thread over copies of the inputs on its device, taken once the work that wrote them on
  // rank 0's device has run (wait_for). The ranks' collectives order the rest: rank 0's device
  // cannot pass a layer's all-reduce before every rank has reached it, so the inputs are not
  // rewritten under a copy.
  ForwardOutput forward(const ForwardInput& input, std::vector<KVCacheLayer>& kv) override {
    match_rank_caches(kv);
    Backend& home = *backends_.front();
    const bool host_memory = home.device() == Device::kCPU;
    if (!host_memory)
      for (size_t rank = 1; rank < backends_.size(); ++rank) rank_inputs_[rank].reserve(*backends_[rank], home, input);
    if (capture_) return capture_forward(input, kv);
    if (!host_memory)
      for (size_t rank = 1; rank < backends_.size(); ++rank) backends_[rank]->wait_for(home);
    const TensorParallelRehearsals::Kind rehearsal = rehearsals_.needed(input);
    if (rehearsal != TensorParallelRehearsals::Kind::kNone) {
      const auto start = std::chrono::steady_clock::now();
      rehearse(input, kv, rehearsal == TensorParallelRehearsals::Kind::kAtLongest);
      rehearsals_.add_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return run_ranks(input, kv);
  }

  // Rank 0's stream records `work`; every forward of this model in it has the other ranks record
  // their share on their streams at the same time (capture_forward), each on its own thread.
  std::unique_ptr<DeviceGraph> capture_graph(Backend& backend, const std::function<void()>& work) override {
    Backend& home = *backends_.front();
    SPECULA_CHECK(&backend == &home, "tensor parallel: a graph of the split model is recorded on rank 0's backend");
    RankCapture capture(backends_.size());
    capture_ = &capture;
    std::unique_ptr<DeviceGraph> rank0;
    try {
      rank0 = home.capture_graph(work);
    } catch (...) {
      capture_ = nullptr;
      throw;
    }
    capture_ = nullptr;
    if (!rank0 || capture.forwards == 0) return rank0;  // no graphs on this backend, or no forward in the work
    return std::make_unique<TensorParallelGraph>(std::move(rank0), std::move(capture), backends_);
  }

  // The embedding and the lm_head are split by vocabulary rows: each rank lends its rows, put
  // together (on rank 0's device) for the proposer that asks for them (MTP, EAGLE heads that share
  // the target's), which holds the copy as long as it needs it.
  Tensor shared_weight(const std::string& name) const override {
    if (name != "lm_head.weight" && name != "model.embed_tokens.weight") return models_.front()->shared_weight(name);
    return assemble_rows(name);
  }

  // The residual stream is replicated: rank 0's copy of the features is the model's.
  void set_aux_hidden_state_layers(const std::vector<int>& layers) override {
    models_.front()->set_aux_hidden_state_layers(layers);
  }

 private:
  // Ranks from 1 on get caches shaped like the engine's (rank 0's) whenever it hands a new one
  // (the memory plan's trial cache, a calibration cache, then the real one). A cache is known by
  // its first bytes and its size: a new one may reuse a freed one's address.
  void match_rank_caches(const std::vector<KVCacheLayer>& kv) {
    std::vector<std::pair<const void*, int64_t>> key;
    for (const KVCacheLayer& layer : kv) key.emplace_back(layer.k.data(), layer.k.numel());
    if (key == kv_key_) return;
    for (size_t rank = 1; rank < models_.size(); ++rank) {
      Backend& backend = *backends_[rank];
      BoundTo device(backend, *backends_.front());
      std::vector<KVCacheLayer>& mine = rank_kv_[rank];
      mine.clear();
      for (const KVCacheLayer& layer : kv) {
        KVCacheLayer copy;
        copy.k_scale = layer.k_scale;
        copy.v_scale = layer.v_scale;
        for (auto [from, to] : {std::pair{&layer.k, &copy.k}, std::pair{&layer.v, &copy.v}}) {
          if (!from->defined()) continue;
          *to = backend.empty(from->shape(), from->dtype());
          backend.zero(*to);
        }
        mine.push_back(copy);
      }
    }
    kv_key_ = std::move(key);
  }

  // Every rank's forward at once, rank 0's outputs.
  ForwardOutput run_ranks(const ForwardInput& input, std::vector<KVCacheLayer>& kv) {
    const bool host_memory = backends_.front()->device() == Device::kCPU;
    ForwardOutput out;
    threads_->run([&](int rank) {
      const size_t r = static_cast<size_t>(rank);
      backends_[r]->bind_thread();
      if (rank == 0) {
        out = models_.front()->forward(input, kv);
        return;
      }
      const ForwardInput mine = host_memory ? input : rank_inputs_[r].stage(*backends_[r], input);
      models_[r]->forward(mine, rank_kv_[r]);
    });
    return out;
  }

  // A rehearsal of `input` (see tensor_parallel_rehearsals.h), then every rank grows its scratch
  // arena to the rehearsal's peak while no collective is pending. At the longest lengths, on CUDA
  // it claims for every sequence the longest length its block-table row allows, as a graph
  // capture does (decode attention splits longer sequences over more scratch; its kernels read
  // the true lengths on the device). On the CPU, where attention reads the host lengths, it runs
  // as it is: it changes nothing there but runs, so that CI covers it.
  void rehearse(const ForwardInput& input, std::vector<KVCacheLayer>& kv, bool at_longest) {
    ForwardInput rehearsal = input;
    AttentionMetadata& md = rehearsal.attn;
    if (at_longest && backends_.front()->device() != Device::kCPU && md.block_tables.defined() &&
        md.block_tables.ndim() == 2) {
      const int32_t longest = static_cast<int32_t>(md.block_tables.size(1) * md.block_size);
      md.seq_lens_host.assign(md.seq_lens_host.size(), longest);
      md.max_seq_len = longest;
    }
    for (auto& c : communicators_) c->set_rehearsal(true);
    try {
      run_ranks(rehearsal, kv);
    } catch (...) {
      for (auto& c : communicators_) c->set_rehearsal(false);
      throw;
    }
    for (auto& c : communicators_) c->set_rehearsal(false);
    threads_->run([&](int rank) {
      Backend& backend = *backends_[static_cast<size_t>(rank)];
      backend.bind_thread();
      backend.synchronize();
      backend.reset_scratch();  // grows the arena to the rehearsal's peak
    });
    for (size_t rank = 1; rank < backends_.size(); ++rank) backends_[rank]->wait_for(*backends_.front());
  }

  // A forward inside capture_graph: rank 0 records on the caller's thread, rank r on its own into
  // a graph of its device that first copies the step's inputs from rank 0's device (at replay,
  // after TensorParallelGraph's wait). Nothing runs, so a failure here aborts no collective: it
  // fails the recording instead.
  ForwardOutput capture_forward(const ForwardInput& input, std::vector<KVCacheLayer>& kv) {
    RankCapture& capture = *capture_;
    SPECULA_CHECK(capture.forwards == 0, "tensor parallel: a graph may record one forward of the split model");
    ++capture.forwards;
    ForwardOutput out;
    threads_->run([&](int rank) {
      const size_t r = static_cast<size_t>(rank);
      try {
        if (rank == 0) {
          out = models_.front()->forward(input, kv);
          return;
        }
        Backend& backend = *backends_[r];
        backend.bind_thread();
        backend.reset_scratch();  // before recording: the arena grows to the warm-up's peak
        capture.graphs[r] = backend.capture_graph([&] {
          capture.outputs[r] = models_[r]->forward(rank_inputs_[r].stage(backend, input), rank_kv_[r]);
        });
        SPECULA_CHECK(capture.graphs[r] != nullptr, "rank {}'s backend records no graphs", rank);
      } catch (const std::exception& e) {
        capture.errors[r] = e.what();
      }
    });
    for (size_t r = 0; r < capture.errors.size(); ++r)
      SPECULA_CHECK(capture.errors[r].empty(), "tensor parallel rank {}: {}", r, capture.errors[r]);
    return out;
  }

  // The whole of a weight split by rows: every rank's rows, copied into one tensor of rank 0's.
  Tensor assemble_rows(const std::string& name) const {
    std::vector<Tensor> parts;
    int64_t rows = 0;
    for (const auto& model : models_) {
      parts.push_back(model->shared_weight(name));
      if (!parts.back().defined() || parts.back().ndim() != 2) return Tensor();
      rows += parts.back().size(0);
    }
    Backend& home = *backends_.front();
    Tensor whole = home.empty({rows, parts.front().size(1)}, parts.front().dtype());
    int64_t at = 0;
    for (const Tensor& part : parts) {
      Tensor dst = whole.slice(at, at + part.size(0));
      home.copy(part, dst);
      at += part.size(0);
    }
    home.synchronize();
    return whole;
  }

  ModelConfig config_;
  std::vector<std::unique_ptr<Backend>> owned_backends_;  // ranks 1..size-1
  std::vector<Backend*> backends_;                        // by rank
  std::vector<std::unique_ptr<Communicator>> communicators_;  // by rank
  std::vector<std::unique_ptr<Model>> models_;            // by rank
  std::vector<std::vector<KVCacheLayer>> rank_kv_;        // by rank (rank 0's is the engine's)
  std::vector<std::pair<const void*, int64_t>> kv_key_;   // the engine cache rank_kv_ matches
  std::vector<RankInputs> rank_inputs_;                   // by rank (rank 0 reads the engine's)
  RankCapture* capture_ = nullptr;                        // while capture_graph records
  TensorParallelRehearsals rehearsals_;                   // which steps run first with the collectives off
  std::unique_ptr<RankThreads> threads_;                  // last: joined before the models go
};

}  // namespace

std::unique_ptr<Model> create_tensor_parallel_model(const ModelConfig& config, WeightSource& weights,
                                                    Backend& rank0_backend, const ModelOptions& options) {
  const int size = options.tensor_parallel_size;
  check_tensor_parallel(config, size);
  SPECULA_CHECK(static_cast<bool>(options.make_rank_backend),
                "--tensor-parallel-size {}: no backend factory for the ranks beyond the first", size);
  std::unique_ptr<Model> model;
  if (config.is_deepseek()) {
    model = std::make_unique<TensorParallelModel>(
        config, weights, rank0_backend, size, options.make_rank_backend, options.custom_all_reduce,
        deepseek_weight_shard,
        [&](WeightSource& shard, Backend& backend, const TensorParallelRank& tp) {
          return create_deepseek_model(config, shard, backend, options, tp);
        });
  } else {
    const WeightQuantization quantization = resolve_weight_quantization(config, options.quantization);
    model = std::make_unique<TensorParallelModel>(
        config, weights, rank0_backend, size, options.make_rank_backend, options.custom_all_reduce, llama_weight_shard,
        [&](WeightSource& shard, Backend& backend, const TensorParallelRank& tp) {
          return create_llama_model(config, shard, backend, quantization, tp);
        });
  }
  const ModelConfig mine = rank_config(config, size);
  LOG_INFO("Tensor parallel: {} split over {} ranks ({} heads{}, {} of {} vocabulary rows per rank)",
           architecture_name(config.arch), size, mine.num_attention_heads,
           config.is_deepseek() ? fmt::format(", experts of {} channels", mine.moe_intermediate_size)
                                : fmt::format(" / {} kv heads", mine.num_key_value_heads),
           config.vocab_size / size, config.vocab_size);
  return model;
}

}  // namespace specula
