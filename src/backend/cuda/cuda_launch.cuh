// Launching a kernel so that it starts while the previous kernel on the stream is still draining
// (Hopper's programmatic dependent launch). Why: a batch-1 decode step is ~230 kernels of a few
// to ~80 microseconds; between two of them the GPU idles through the first kernel's last wave
// and the second's launch and first memory round trip, about as long as a small kernel itself.
// With this launch the next kernel's blocks become resident as SMs free up and do the work that
// depends on no earlier kernel (issuing their weight loads) before they wait.
//
// The contract, for every kernel started with launch_overlapped:
//  - it calls wait_for_previous_kernels() in every thread before it reads anything an earlier
//    kernel wrote or writes anything an earlier kernel reads (weights and other load-time
//    constants may be read before), and before any early return that skips the wait in only some
//    blocks' threads when the kernel writes global memory after it;
//  - it may call allow_next_kernel_start() at any point: the next overlapped kernel waits for this
//    one's completion in its own wait_for_previous_kernels(), so the hint only moves its start.
// One more class of data may be read before the wait: a forward's attention metadata and the
// cache rows of its earlier steps, which every forward writes before its first launch that is not
// overlapped (the embedding's gather, a graph's start), so that no overlapped kernel of the
// forward starts before they are complete (the decode attention kernel relies on it:
// PagedAttentionParams::metadata_before_wait).
// Kernels launched normally may call both: without the launch attribute they return at once.
// In a CUDA graph the launches become programmatic edges. SPECULA_PDL=0 launches every kernel
// normally (for comparing the two); devices before sm_90 always do.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace specula::cuda {

bool overlapped_launch_enabled();

__device__ __forceinline__ void wait_for_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A launch's grid, block, dynamic shared memory and thread-block cluster (1 x 1 x 1: none).
struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  dim3 cluster = dim3(1, 1, 1);
};

template <class... Params, class... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), const LaunchShape& shape, cudaStream_t stream,
                              Args&&... args) {
  cudaLaunchAttribute attributes[2]{};
  cudaLaunchConfig_t config{};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shape.shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  if (overlapped_launch_enabled()) {
    cudaLaunchAttribute& a = attributes[config.numAttrs++];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
  if (shape.cluster.x * shape.cluster.y * shape.cluster.z > 1) {
    cudaLaunchAttribute& a = attributes[config.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = shape.cluster.x;
    a.val.clusterDim.y = shape.cluster.y;
    a.val.clusterDim.z = shape.cluster.z;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace specula::cuda
