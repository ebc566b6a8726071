// raise_kernel_attribute: a per-GPU record of the attributes set; see cuda_kernel_attributes.h.
#include "backend/cuda/cuda_kernel_attributes.h"

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace specula::cuda {
namespace {

using Key = std::tuple<const void*, int, int>;  // kernel, device, attribute

struct Setting {
  Key key;
  int value;
};

}  // namespace

cudaError_t raise_kernel_attribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const Key key{kernel, device, static_cast<int>(attribute)};
  // Each launching thread keeps what it has seen set, so the steady state takes no lock.
  thread_local std::vector<Setting> seen;
  for (const Setting& s : seen)
    if (s.key == key && s.value >= value) return cudaSuccess;
  static std::mutex mu;
  static std::map<Key, int> set;
  std::lock_guard<std::mutex> lock(mu);
  int& current = set[key];
  if (current < value) {
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, attribute, value); e != cudaSuccess) return e;
    current = value;
  }
  for (Setting& s : seen)
    if (s.key == key) {
      s.value = current;
      return cudaSuccess;
    }
  seen.push_back(Setting{key, current});
  return cudaSuccess;
}

}  // namespace specula::cuda
