// CUDA backend: what the engine needs from the device beyond the ops — the memory query of the
// memory plan, CUDA-graph capture, the device token sampler and the launch-ahead's shift.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_engine_kernels.h"
#include "backend/cuda/cuda_token_sampler.h"

namespace specula {
namespace {

class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override {
    cudaStreamSynchronize(stream_);  // a replay may still be running
    cudaGraphExecDestroy(exec_);
  }
  void replay() override { check_cuda(cudaGraphLaunch(exec_, stream_), "CUDA graph replay"); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

Tensor CudaBackend::empty_host(Shape shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) {
    SPECULA_CHECK(d >= 0, "empty_host: negative dimension in shape {}", shape_str(shape));
    n *= d;
  }
  const size_t bytes = std::max<size_t>(static_cast<size_t>(n) * dtype_size(dtype), 1);
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "empty_host: cudaHostAlloc");
  std::shared_ptr<void> owner(p, [](void* q) { cudaFreeHost(q); });
  return Tensor::from_blob(p, std::move(shape), dtype, Device::kCPU, std::move(owner));
}

bool CudaBackend::idle() {
  const cudaError_t e = cudaStreamQuery(stream_);
  if (e != cudaSuccess && e != cudaErrorNotReady) (void)cudaGetLastError();  // the asking thread's error state
  return e != cudaErrorNotReady;
}

std::optional<DeviceMemoryInfo> CudaBackend::memory_info() {
  check_cuda(cudaSetDevice(device_index_), "memory_info: cudaSetDevice");
  DeviceMemoryInfo info;
  check_cuda(cudaMemGetInfo(&info.free, &info.total), "memory_info: cudaMemGetInfo");
  const CudaMemoryStats stats = CudaCachingAllocator::instance().stats(device_index_);
  info.allocated = stats.in_use_bytes;
  info.cached = stats.cached_bytes;
  return info;
}

std::unique_ptr<DeviceGraph> CudaBackend::capture_graph(const std::function<void()>& work) {
  // Thread-local mode: only this thread's calls are checked (and forbidden) during the capture,
  // so another engine or an HTTP thread touching CUDA elsewhere cannot break it.
  check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "CUDA graph: begin capture");
  auto abandon = [&] {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream_, &partial);
    if (partial) cudaGraphDestroy(partial);
    (void)cudaGetLastError();
  };
  try {
    work();
  } catch (const std::exception& e) {
    abandon();
    throw Error(fmt::format("CUDA graph capture failed: {}", e.what()));
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (end != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw Error(fmt::format("CUDA graph capture failed: the captured work synchronised, allocated or read the device "
                            "from the host ({})",
                            cudaGetErrorString(end)));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(inst, "CUDA graph: instantiate");
  // Upload now, so that the first replay costs no more than later ones.
  const cudaError_t up = cudaGraphUpload(exec, stream_);
  if (up != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    check_cuda(up, "CUDA graph: upload");
  }
  return std::make_unique<CudaGraph>(exec, stream_);
}

std::unique_ptr<TokenSampler> CudaBackend::make_token_sampler(int max_rows, int64_t vocab) {
  return std::make_unique<CudaTokenSampler>(*this, max_rows, vocab);
}

void CudaBackend::shift_by_accepted(const AcceptedShift& a) {
  const char* op = "shift_by_accepted";
  cuda_check::index_vector(a.inputs, DType::kI32, op, "inputs");
  cuda_check::index_vector(a.sampled, DType::kI32, op, "sampled");
  cuda_check::index_vector(a.positions, DType::kI32, op, "positions");
  if (a.slots.defined()) {
    cuda_check::index_vector(a.slots, DType::kI64, op, "slots");
    cuda_check::dtype(a.block_tables, DType::kI32, op, "block_tables");
    SPECULA_CHECK(a.block_tables.ndim() == 2 && a.block_tables.size(0) >= a.num_requests && a.block_size > 0,
                  "{}: block tables {} for {} requests", op, a.block_tables.describe(), a.num_requests);
  }
  if (a.seq_lens.defined()) cuda_check::index_vector(a.seq_lens, DType::kI32, op, "seq_lens");
  SPECULA_CHECK(a.inputs.numel() >= static_cast<int64_t>(a.num_requests) * (a.k + 1) &&
                    a.sampled.numel() >= static_cast<int64_t>(a.num_requests) * (a.k + 1),
                "{}: {} requests of {} drafts over inputs {}, sampled {}", op, a.num_requests, a.k,
                a.inputs.describe(), a.sampled.describe());
  if (a.tokens.defined()) {
    cuda_check::index_vector(a.tokens, DType::kI32, op, "tokens");
    SPECULA_CHECK(a.entries == 2, "{}: tokens over {} entries (two)", op, a.entries);
  }
  cuda::AcceptedShiftParams p;
  p.inputs = a.inputs.data_as<int32_t>();
  p.sampled = a.sampled.data_as<int32_t>();
  p.num_requests = a.num_requests;
  p.k = a.k;
  p.positions = a.positions.data_as<int32_t>();
  p.slots = a.slots.defined() ? a.slots.data_as<int64_t>() : nullptr;
  p.entries = a.entries;
  p.request_stride = a.request_stride;
  p.entry_stride = a.entry_stride;
  p.seq_lens = a.seq_lens.defined() ? a.seq_lens.data_as<int32_t>() : nullptr;
  p.seq_lens_request_stride = a.seq_lens_request_stride;
  p.seq_lens_entry_stride = a.seq_lens_entry_stride;
  p.block_tables = a.block_tables.defined() ? a.block_tables.data_as<int32_t>() : nullptr;
  p.width = a.block_tables.defined() ? a.block_tables.size(1) : 0;
  p.block_size = a.block_size;
  p.tokens = a.tokens.defined() ? a.tokens.data_as<int32_t>() : nullptr;
  check_cuda(cuda::launch_shift_by_accepted(p, stream_), op);
}

}  // namespace specula
