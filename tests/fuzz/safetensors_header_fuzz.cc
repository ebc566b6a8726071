// libFuzzer target: arbitrary bytes as a safetensors file, opened by SafetensorsFile::open (the
// production path: mmap, header length, JSON header, offsets, shapes, overlaps).
//
// The bytes go to an in-memory file (memfd) opened through /proc/self/fd, so the real open()
// runs unchanged and nothing touches the disk. specula::Error is the expected refusal. For a file
// that opens, every entry must lie inside the file: the bytes of each tensor are read (ASan
// reports a read past the mapping).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "model/safetensors.h"

namespace {

int memory_file() {
  static const int fd = [] {
    int fd = ::memfd_create("safetensors_fuzz", MFD_CLOEXEC);
    if (fd < 0) std::abort();
    return fd;
  }();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memory_file();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  std::shared_ptr<specula::SafetensorsFile> file;
  try {
    file = specula::SafetensorsFile::open(path);
  } catch (const specula::Error&) {
    return 0;
  }
  unsigned sum = 0;
  for (const auto& e : file->entries()) {
    if (e.end > file->file_size() || e.begin > e.end) std::abort();
    if (file->find(e.name) == nullptr) std::abort();
    const uint8_t* p = file->data(e);
    for (size_t i = 0; i < e.nbytes(); ++i) sum += p[i];
    if (e.dtype && static_cast<int64_t>(e.nbytes()) != e.numel() * static_cast<int64_t>(specula::safetensors_dtype_size(e.dtype_name)))
      std::abort();
  }
  for (const auto& [k, v] : file->metadata()) sum += static_cast<unsigned>(k.size() + v.size());
  volatile unsigned sink = sum;
  (void)sink;
  return 0;
}
