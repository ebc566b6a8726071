// NCCL communicators; see nccl_communicator.h.
#include "backend/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <set>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/peer_all_reduce.h"
#include "core/error.h"
#include "core/logging.h"

namespace specula {
namespace {

// All-reduces up to this size take the one-shot peer kernel (a batch-64 row block of a 4096-wide
// model in bf16); larger ones NCCL's ring, which moves fewer bytes per GPU.
constexpr size_t kPeerAllReduceMaxBytes = size_t{512} << 10;

// The few NCCL entry points specula calls, from libnccl.so.2 opened at run time.
struct NcclLibrary {
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;

  static const NcclLibrary& get() {
    static NcclLibrary lib;
    static std::once_flag once;
    std::call_once(once, [] { lib.open(); });
    return lib;
  }

  void check(ncclResult_t r, const char* what) const {
    if (r != ncclSuccess) throw Error(fmt::format("{}: NCCL error {} ({})", what, static_cast<int>(r), error_string(r)));
  }

 private:
  void open() {
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    SPECULA_CHECK(handle != nullptr, "tensor parallel on CUDA needs NCCL: cannot open libnccl.so.2 ({}); put its folder "
                  "on LD_LIBRARY_PATH", dlerror());
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      SPECULA_CHECK(fn != nullptr, "libnccl.so.2 lacks {}", name);
    };
    sym(comm_init_all, "ncclCommInitAll");
    sym(comm_destroy, "ncclCommDestroy");
    sym(comm_abort, "ncclCommAbort");
    sym(all_reduce, "ncclAllReduce");
    sym(all_gather, "ncclAllGather");
    sym(error_string, "ncclGetErrorString");
  }
};

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    default: break;
  }
  throw Error(fmt::format("tensor parallel: NCCL collectives take F32, F16 or BF16 tensors, got {}", dtype_name(t)));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, CudaBackend& backend, std::shared_ptr<PeerAllReduceGroup> peer)
      : comm_(comm), rank_(rank), size_(size), backend_(backend), peer_(std::move(peer)) {}
  ~NcclCommunicator() override {
    const NcclLibrary& nccl = NcclLibrary::get();
    if (aborted_) return;  // ncclCommAbort freed it
    int current = 0;
    cudaGetDevice(&current);
    cudaSetDevice(backend_.device_index());
    nccl.comm_destroy(comm_);
    cudaSetDevice(current);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(Tensor& t) override {
    cuda_check::on_gpu(t, "all_reduce_sum", "t");
    if (rehearsing_) return;
    count_entered();
    if (peer_ && peer_->fits(t)) {
      peer_->all_reduce_sum(rank_, t, backend_.stream());
      return;
    }
    NcclLibrary::get().check(NcclLibrary::get().all_reduce(t.data(), t.data(), static_cast<size_t>(t.numel()),
                                                           nccl_type(t.dtype()), ncclSum, comm_, backend_.stream()),
                             "tensor parallel all_reduce_sum");
  }

  // NCCL gathers the ranks' blocks one after another ([size][R][C]); rows of one element each
  // (R = 1, batch-1 decode) are already the [1, size * C] row, else each block's columns are
  // copied into place with one 2-D copy.
  void all_gather_columns(const Tensor& in, Tensor& out) override {
    cuda_check::on_gpu(in, "all_gather_columns", "in");
    cuda_check::on_gpu(out, "all_gather_columns", "out");
    cuda_check::same_dtype(in, out, "all_gather_columns", "in", "out");
    const int64_t cols = in.size(-1), rows = cols == 0 ? 0 : in.numel() / cols;
    SPECULA_CHECK(out.numel() == rows * cols * size_, "all_gather_columns: out {} must hold {} ranks' {}",
                  out.describe(), size_, in.describe());
    const NcclLibrary& nccl = NcclLibrary::get();
    if (rows <= 1) {
      if (rehearsing_) return;
      count_entered();
      nccl.check(nccl.all_gather(in.data(), out.data(), static_cast<size_t>(in.numel()), nccl_type(in.dtype()), comm_,
                                 backend_.stream()),
                 "tensor parallel all_gather_columns");
      return;
    }
    Tensor blocks = backend_.scratch({size_, rows, cols}, in.dtype());  // before a rehearsal returns: it counts
    if (rehearsing_) return;
    count_entered();
    nccl.check(nccl.all_gather(in.data(), blocks.data(), static_cast<size_t>(in.numel()), nccl_type(in.dtype()), comm_,
                               backend_.stream()),
               "tensor parallel all_gather_columns");
    const size_t elem = dtype_size(in.dtype());
    for (int k = 0; k < size_; ++k) {
      check_cuda(cudaMemcpy2DAsync(static_cast<uint8_t*>(out.data()) + static_cast<size_t>(k * cols) * elem,
                                   static_cast<size_t>(size_ * cols) * elem,
                                   static_cast<const uint8_t*>(blocks.data()) + static_cast<size_t>(k * rows * cols) * elem,
                                   static_cast<size_t>(cols) * elem, static_cast<size_t>(cols) * elem,
                                   static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, backend_.stream()),
                 "all_gather_columns: placing a rank's columns");
    }
  }

  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    if (peer_) peer_->abort();
    NcclLibrary::get().comm_abort(comm_);
  }

 private:
  ncclComm_t comm_;
  int rank_, size_;
  CudaBackend& backend_;
  std::shared_ptr<PeerAllReduceGroup> peer_;  // small all-reduces; null: NCCL for all
  bool aborted_ = false;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<Backend*>& ranks,
                                                                   bool custom_all_reduce) {
  std::vector<CudaBackend*> cuda;
  std::vector<int> devices;
  for (Backend* b : ranks) {
    auto* c = dynamic_cast<CudaBackend*>(b);
    SPECULA_CHECK(c != nullptr, "tensor parallel: NCCL needs CUDA backends, got {}", b->name());
    cuda.push_back(c);
    devices.push_back(c->device_index());
  }
  SPECULA_CHECK(std::set<int>(devices.begin(), devices.end()).size() == devices.size(),
                "tensor parallel: two ranks on one GPU");
  const NcclLibrary& nccl = NcclLibrary::get();
  std::vector<ncclComm_t> comms(ranks.size());
  int current = 0;
  cudaGetDevice(&current);
  // Every connection is made here rather than at a collective's first call, where NCCL allocates
  // device memory while a peer's kernel may already wait (see Communicator::set_rehearsal).
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  // NCCL allocates its buffers with cudaMalloc, outside our caching allocator: what that caches
  // (an earlier engine's freed KV cache, tens of GiB) would leave NCCL too little ("unhandled
  // cuda error"). Nothing runs while a model loads, so the frees' device waits cost nothing.
  CudaCachingAllocator::instance().release_cached();
  const ncclResult_t init = nccl.comm_init_all(comms.data(), static_cast<int>(comms.size()), devices.data());
  if (init != ncclSuccess) {  // most often an allocation that failed: what the host and each GPU had left
    const double gib = 1 << 30;
    std::string memory = fmt::format("; host: {:.2f} GiB available",
                                     static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE) / gib);
    for (int d : devices) {
      size_t free_b = 0, total_b = 0;
      cudaSetDevice(d);
      cudaMemGetInfo(&free_b, &total_b);
      memory += fmt::format("; GPU {}: {:.2f} of {:.2f} GiB free", d, free_b / gib, total_b / gib);
    }
    cudaSetDevice(current);
    (void)cudaGetLastError();
    throw Error(fmt::format("ncclCommInitAll: NCCL error {} ({}){} (NCCL_DEBUG=INFO says more)", static_cast<int>(init),
                            nccl.error_string(init), memory));
  }
  // A graph of the split model starts each rank's share with a copy of the step's inputs from rank
  // 0's GPU; peer access makes that one direct copy over NVLink / PCIe (where the GPUs allow it).
  for (int from : devices)
    for (int to : devices) {
      int can = 0;
      if (from == to || cudaDeviceCanAccessPeer(&can, from, to) != cudaSuccess || !can) continue;
      cudaSetDevice(from);
      const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
        throw Error(fmt::format("tensor parallel: GPU {} cannot map GPU {}'s memory ({})", from, to, cudaGetErrorString(e)));
      (void)cudaGetLastError();
    }
  cudaSetDevice(current);
  std::shared_ptr<PeerAllReduceGroup> peer =
      custom_all_reduce ? PeerAllReduceGroup::create(devices, kPeerAllReduceMaxBytes) : nullptr;
  if (custom_all_reduce && !peer)
    LOG_WARN("Custom all-reduce: off (the GPUs do not all map each other's memory); NCCL all-reduces everything");
  else if (peer)
    LOG_INFO("Custom all-reduce: one peer-to-peer kernel for all-reduces up to {} KiB, NCCL beyond",
             kPeerAllReduceMaxBytes >> 10);
  else
    LOG_INFO("Custom all-reduce: off (--disable-custom-all-reduce); NCCL all-reduces everything");
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t r = 0; r < ranks.size(); ++r)
    out.push_back(std::make_unique<NcclCommunicator>(comms[r], static_cast<int>(r), static_cast<int>(ranks.size()),
                                                     *cuda[r], peer));
  return out;
}

}  // namespace specula
