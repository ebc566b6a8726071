// CUDA backend: construction, memory (persistent, scratch arena), copies, casts, zero.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_batched_gemm.h"
#include "backend/cuda/cuda_decoder_forward.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"

namespace specula {
namespace {

// CUDA backends alive in the process: more than one is tensor parallelism (CublasLtGemm's
// candidate timing then stays off).
std::atomic<int> live_backends{0};

cudaStream_t make_stream(int device_index) {
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "CUDA backend: cudaGetDeviceCount");
  SPECULA_CHECK(device_index >= 0 && device_index < count, "CUDA backend: device index {} is out of range ({} GPUs)",
                device_index, count);
  check_cuda(cudaSetDevice(device_index), "CUDA backend: cudaSetDevice");
  cudaStream_t stream = nullptr;
  // Non-blocking: no implicit synchronisation with the legacy default stream, which would both
  // serialise unrelated work and break stream capture.
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "CUDA backend: cudaStreamCreate");
  return stream;
}

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

bool is_pinned(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

}  // namespace

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(fmt::format("{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err)));
}

CudaBackend::CudaBackend(int device_index)
    : device_index_(device_index), stream_(make_stream(device_index)), arena_(stream_) {
  register_allocator(Device::kCUDA, &CudaCachingAllocator::instance());
  check_cuda(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_index),
             "CUDA backend: SM count");
  int smem_optin = 0;
  check_cuda(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index),
             "CUDA backend: shared memory per block");
  smem_budget_ = smem_optin - 1024;  // the chain kernel's static shared memory (its DSMEM map)
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device_index), "CUDA backend: device properties");
  device_name_ = prop.name;
  if (prop.major >= 9) decode_cluster_splits_ = cuda::kMaxClusterSplits;  // clusters with DSMEM
  gemm_ = std::make_unique<CublasLtGemm>(stream_);
  ++live_backends;
  // Not under tensor parallelism, nor once serving (start_serving).
  gemm_->set_tuning_allowed([this] { return live_backends.load() == 1 && !serving_; });
  // SPECULA_FP8_GEMV_ROWS=N: FP8 weights take the GEMV up to N rows (benchmarks compare the paths).
  if (const char* rows = std::getenv("SPECULA_FP8_GEMV_ROWS")) set_gemv_max_rows(DType::kF8E4M3, std::atoi(rows));
  batched_gemm_ = std::make_unique<CublasLtBatchedGemm>(stream_);
  check_cuda(cudaEventCreateWithFlags(&handoff_, cudaEventDisableTiming), "CUDA backend: cudaEventCreate");
  const char* copy_stream = std::getenv("SPECULA_COPY_STREAM");
  if (!(copy_stream && std::strcmp(copy_stream, "0") == 0)) {
    copy_stream_ = make_stream(device_index);
    check_cuda(cudaEventCreateWithFlags(&copy_fork_, cudaEventDisableTiming), "CUDA backend: cudaEventCreate");
  }
  if (std::getenv("SPECULA_FUSED_FORWARD_TRACE"))  // here: never while a graph is being captured
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&forward_trace_),
                          sizeof(unsigned long long) * sm_count_ * cuda::kForwardTraceEvents),
               "CUDA backend: fused forward trace buffer");
}

CudaBackend::~CudaBackend() {
  --live_backends;
  report_forward_trace();
  gemm_.reset();
  batched_gemm_.reset();
  if (handoff_ != nullptr) cudaEventDestroy(handoff_);
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  if (copy_fork_ != nullptr) cudaEventDestroy(copy_fork_);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

void CudaBackend::bind_thread() { check_cuda(cudaSetDevice(device_index_), "CUDA backend: cudaSetDevice"); }

void CudaBackend::wait_for(Backend& other) {
  auto* o = dynamic_cast<CudaBackend*>(&other);
  if (o == this) return;
  if (o == nullptr) {
    other.synchronize();
    return;
  }
  check_cuda(cudaEventRecord(o->handoff_, o->stream_), "wait_for: cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream_, o->handoff_, 0), "wait_for: cudaStreamWaitEvent");
}

namespace {

class StreamEvent : public DeviceEvent {
 public:
  explicit StreamEvent(cudaStream_t stream) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "record_event: cudaEventCreate");
    const cudaError_t recorded = cudaEventRecord(event_, stream);
    if (recorded != cudaSuccess) {
      cudaEventDestroy(event_);
      check_cuda(recorded, "record_event: cudaEventRecord");
    }
  }
  ~StreamEvent() override { cudaEventDestroy(event_); }
  void wait() override { check_cuda(cudaEventSynchronize(event_), "DeviceEvent::wait"); }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceEvent> CudaBackend::record_event() { return std::make_unique<StreamEvent>(stream_); }

cudaStream_t CudaBackend::copy_stream() {
  if (copy_stream_ == nullptr) return stream_;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream_, &capture), "copy_stream: cudaStreamIsCapturing");
  return capture == cudaStreamCaptureStatusNone ? copy_stream_ : stream_;
}

cudaStream_t CudaBackend::copy_stream_after_work() {
  cudaStream_t copies = copy_stream();
  if (copies == stream_) return stream_;
  check_cuda(cudaEventRecord(copy_fork_, stream_), "copy_stream_after_work: cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(copies, copy_fork_, 0), "copy_stream_after_work: cudaStreamWaitEvent");
  return copies;
}

std::unique_ptr<DeviceEvent> CudaBackend::copy_to_host_async(const Tensor& src, Tensor& dst) {
  SPECULA_CHECK(src.defined() && dst.defined() && src.dtype() == dst.dtype() && src.numel() == dst.numel(),
                "copy_to_host_async: source {} and destination {} differ in dtype or element count", src.describe(),
                dst.describe());
  SPECULA_CHECK(!src.is_cpu() && dst.is_cpu() && is_pinned(dst.data()),
                "copy_to_host_async: {} to {} is not device memory into pinned host memory", src.describe(),
                dst.describe());
  cudaStream_t copies = copy_stream_after_work();
  check_cuda(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToHost, copies),
             "copy_to_host_async");
  return std::make_unique<StreamEvent>(copies);
}

std::string CudaBackend::name() const {
  return fmt::format("cuda:{} ({}, {} SMs, bf16)", device_index_, device_name_, sm_count_);
}

int CudaBackend::tuned_gemm_plans() const { return gemm_->tuned_plans(); }

Tensor CudaBackend::empty(Shape shape, DType dtype) { return Tensor::empty(std::move(shape), dtype, Device::kCUDA); }

Tensor CudaBackend::scratch(Shape shape, DType dtype) { return arena_.allocate(shape, dtype); }

void CudaBackend::reset_scratch() { arena_.reset(); }

bool CudaBackend::on_this_device(const void* p) const {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice && attr.device == device_index_;
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  SPECULA_CHECK(src.defined() && dst.defined(), "copy: source {} or destination {} is an empty tensor",
                src.describe(), dst.describe());
  SPECULA_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
                "copy: source {} and destination {} differ in dtype or element count", src.describe(),
                dst.describe());
  const size_t bytes = src.nbytes();
  if (bytes == 0 || src.data() == dst.data()) return;
  if (src.is_cpu() && dst.is_cpu()) {
    std::memmove(dst.data(), src.data(), bytes);
    return;
  }
  if (!src.is_cpu() && !dst.is_cpu()) {
    // On this GPU and small (a forward's residual or row copies): a kernel in the overlapped
    // chain, where a copy node stops the kernels around it from overlapping.
    if (cuda::device_copy_as_kernel(static_cast<int64_t>(bytes)) && on_this_device(src.data()) &&
        on_this_device(dst.data())) {
      check_cuda(cuda::launch_copy_columns(src.data(), 0, dst.data(), 0, 1, static_cast<int64_t>(bytes),
                                           static_cast<int64_t>(dtype_size(src.dtype())), stream_),
                 "copy (device, kernel)");
      return;
    }
    // Default: the pointers say which GPUs (a tensor-parallel rank copies from rank 0's device).
    check_cuda(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDefault, stream_), "copy (device)");
    return;
  }
  const bool to_device = src.is_cpu();
  const void* host = to_device ? src.data() : dst.data();
  check_cuda(cudaMemcpyAsync(dst.data(), src.data(), bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                             stream_),
             to_device ? "copy (host to device)" : "copy (device to host)");
  // Pageable host memory: wait, so that the buffer may be reused (H2D) or read (D2H) at once.
  if (!is_pinned(host)) check_cuda(cudaStreamSynchronize(stream_), "copy: waiting for a pageable transfer");
}

void CudaBackend::copy_many(std::span<const CopyPair> pairs) {
  // Host-to-device pairs from pinned memory as one kernel; anything else (or too many) as copies.
  cuda::CopyRanges ranges;
  bool one_kernel = pairs.size() >= 2 && pairs.size() <= static_cast<size_t>(cuda::kMaxCopyRanges);
  for (size_t i = 0; one_kernel && i < pairs.size(); ++i) {
    const Tensor& src = pairs[i].src;
    const Tensor& dst = pairs[i].dst;
    SPECULA_CHECK(src.defined() && dst.defined() && src.dtype() == dst.dtype() && src.numel() == dst.numel(),
                  "copy_many: pair {}: source {} and destination {} differ in dtype or element count", i,
                  src.describe(), dst.describe());
    cudaPointerAttributes attr{};
    if (!src.is_cpu() || dst.is_cpu() || cudaPointerGetAttributes(&attr, src.data()) != cudaSuccess ||
        attr.type != cudaMemoryTypeHost || attr.devicePointer == nullptr) {
      (void)cudaGetLastError();
      one_kernel = false;
      break;
    }
    if (src.nbytes() == 0) continue;
    ranges.src[ranges.count] = attr.devicePointer;
    ranges.dst[ranges.count] = dst.data();
    ranges.bytes[ranges.count] = static_cast<int64_t>(src.nbytes());
    ++ranges.count;
  }
  if (!one_kernel) {
    Backend::copy_many(pairs);
    return;
  }
  check_cuda(cuda::launch_copy_ranges(ranges, stream_), "copy_many");
}

void CudaBackend::cast(const Tensor& src, Tensor& dst) {
  SPECULA_CHECK(src.defined() && dst.defined(), "cast: source {} or destination {} is an empty tensor",
                src.describe(), dst.describe());
  SPECULA_CHECK(is_float_dtype(src.dtype()) && is_float_dtype(dst.dtype()),
                "cast: only F32/F16/BF16 convert, got {} -> {}", src.describe(), dst.describe());
  SPECULA_CHECK(src.numel() == dst.numel(), "cast: source {} and destination {} differ in element count",
                src.describe(), dst.describe());
  SPECULA_CHECK(src.device() == dst.device(), "cast: source {} and destination {} are on different devices",
                src.describe(), dst.describe());
  if (src.dtype() == dst.dtype()) {
    copy(src, dst);
    return;
  }
  if (src.is_cpu()) {  // host tensors (e.g. weights before upload): convert through fp32 chunks
    const int64_t n = src.numel();
    constexpr int64_t kChunk = 4096;
    std::vector<float> buf(kChunk);
    const size_t in_size = dtype_size(src.dtype()), out_size = dtype_size(dst.dtype());
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const size_t len = static_cast<size_t>(std::min(kChunk, n - begin));
      convert_to_f32(static_cast<const char*>(src.data()) + begin * in_size, src.dtype(), buf.data(), len);
      convert_from_f32(buf.data(), dst.dtype(), static_cast<char*>(dst.data()) + begin * out_size, len);
    }
    return;
  }
  check_cuda(cuda::launch_cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(), stream_), "cast");
}

void CudaBackend::zero(Tensor& t) {
  SPECULA_CHECK(t.defined(), "zero: empty tensor");
  if (t.nbytes() == 0) return;
  if (t.is_cpu()) {
    std::memset(t.data(), 0, t.nbytes());
    return;
  }
  check_cuda(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream_), "zero");
}

void CudaBackend::synchronize() {
  check_cuda(cudaStreamSynchronize(stream_), "synchronize");
  if (copy_stream_ != nullptr) check_cuda(cudaStreamSynchronize(copy_stream_), "synchronize (copies)");
}

// ---- shared argument checks ----

namespace cuda_check {

void on_gpu(const Tensor& t, const char* op, const char* param) {
  SPECULA_CHECK(t.defined(), "{}: {} is an empty tensor", op, param);
  SPECULA_CHECK(t.device() == Device::kCUDA, "{}: {} must be on the GPU, got {}", op, param, t.describe());
}

void float_tensor(const Tensor& t, const char* op, const char* param) {
  on_gpu(t, op, param);
  SPECULA_CHECK(t.dtype() == DType::kBF16 || t.dtype() == DType::kF32, "{}: {} must be BF16 or F32, got {}", op,
                param, t.describe());
}

void dtype(const Tensor& t, DType dtype, const char* op, const char* param) {
  on_gpu(t, op, param);
  SPECULA_CHECK(t.dtype() == dtype, "{}: {} must be {}, got {}", op, param, dtype_name(dtype), t.describe());
}

void index_vector(const Tensor& t, DType dtype, const char* op, const char* param) {
  on_gpu(t, op, param);
  SPECULA_CHECK(t.dtype() == dtype && t.ndim() == 1, "{}: {} must be a 1-d {} GPU tensor, got {}", op, param,
                dtype_name(dtype), t.describe());
}

void same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* pa, const char* pb) {
  SPECULA_CHECK(a.dtype() == b.dtype(), "{}: {} {} and {} {} must have the same dtype", op, pa, a.describe(), pb,
                b.describe());
}

void same_shape(const Tensor& a, const Tensor& b, const char* op, const char* pa, const char* pb) {
  SPECULA_CHECK(a.shape() == b.shape(), "{}: {} {} and {} {} must have the same shape", op, pa, a.describe(), pb,
                b.describe());
}

}  // namespace cuda_check
}  // namespace specula
