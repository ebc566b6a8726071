// The counter-based uniform draw every random choice of specula is made from: a pure function of
// (seed, position, stream), so that a request's tokens depend on nothing but its own settings and
// positions. Header-only and __host__ __device__ under nvcc: the host's samplers and the CUDA
// kernels that draw on the device (a fused draft chain) compute the same bits.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECULA_HOST_DEVICE __host__ __device__
#else
#define SPECULA_HOST_DEVICE
#endif

namespace specula {

SPECULA_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits. `stream` separates independent draws at one position
// (0: sampling; the rejection sampler and the drafts use others: sampling/rejection_math.h).
SPECULA_HOST_DEVICE inline double uniform_draw(uint64_t seed, int64_t position, uint32_t stream = 0) {
  const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(position) * 0x2545f4914f6cdd1dull +
                                                  (static_cast<uint64_t>(stream) << 48)));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace specula
