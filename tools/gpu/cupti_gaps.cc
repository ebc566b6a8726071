// A CUPTI injection library (CUDA_INJECTION64_PATH=libcupti_gaps.so) that records every kernel,
// copy and memset of the process and, at exit, reports the GPU's idle time over the middle 60%
// of the run (steady state): the gaps between busy intervals by size, and the kernels around the
// largest share of the idle time. What Nsight Systems' timeline would show, where it is not
// installed. Output: stderr, or the file CUPTI_GAPS_OUT names.
#include <cupti.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Span {
  uint64_t start, end;
  std::string name;
};
std::mutex mutex;
std::vector<Span>* spans = new std::vector<Span>;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
        std::string name = k->name ? k->name : "kernel";
        spans->push_back({k->start, k->end, name.substr(0, 60)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(record);
        spans->push_back({m->start, m->end, "memcpy kind " + std::to_string(m->copyKind)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(record);
        spans->push_back({m->start, m->end, "memset"});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mutex);
  FILE* out = stderr;
  if (const char* path = std::getenv("CUPTI_GAPS_OUT")) out = std::fopen(path, "w");
  if (!out || spans->empty()) return;
  std::sort(spans->begin(), spans->end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  uint64_t first = spans->front().start, last = 0;
  for (const Span& s : *spans) last = std::max(last, s.end);
  const uint64_t lo = first + (last - first) / 5, hi = last - (last - first) / 5;
  uint64_t busy = 0, cur_s = 0, cur_e = 0;
  bool open = false;
  std::string before;
  std::vector<uint64_t> gaps;
  std::map<std::string, std::pair<uint64_t, int>> around;  // "before -> after": idle ns, count
  for (const Span& s : *spans) {
    if (s.end < lo || s.start > hi) continue;
    if (!open) {
      cur_s = s.start, cur_e = s.end, open = true;
    } else if (s.start > cur_e) {
      busy += cur_e - cur_s;
      const uint64_t g = s.start - cur_e;
      gaps.push_back(g);
      auto& a = around[before + "  ->  " + s.name];
      a.first += g;
      a.second += 1;
      cur_s = s.start, cur_e = s.end;
    } else {
      cur_e = std::max(cur_e, s.end);
    }
    if (s.end >= cur_e) before = s.name;
  }
  if (open) busy += cur_e - cur_s;
  const double window = static_cast<double>(hi - lo);
  std::fprintf(out, "window %.1f ms: GPU busy %.1f%%, idle %.2f ms, %zu records\n", window / 1e6, 100.0 * busy / window,
               (window - busy) / 1e6, spans->size());
  const double edges[] = {0, 2e3, 5e3, 10e3, 20e3, 50e3, 100e3, 1e18};
  for (int b = 0; b + 1 < 8; ++b) {
    uint64_t n = 0, sum = 0;
    for (uint64_t g : gaps)
      if (g >= edges[b] && g < edges[b + 1]) ++n, sum += g;
    std::fprintf(out, "gaps %6.0f-%-6.0f us: %7lu, %.2f ms\n", edges[b] / 1e3, edges[b + 1] < 1e17 ? edges[b + 1] / 1e3 : 1e9,
                 static_cast<unsigned long>(n), sum / 1e6);
  }
  std::vector<std::pair<std::string, std::pair<uint64_t, int>>> top(around.begin(), around.end());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  for (size_t i = 0; i < top.size() && i < 15; ++i)
    std::fprintf(out, "%8.2f ms %6d x (%5.1f us)  %s\n", top[i].second.first / 1e6, top[i].second.second,
                 top[i].second.first / 1e3 / top[i].second.second, top[i].first.c_str());
  if (out != stderr) std::fclose(out);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  std::atexit(report);
  return 1;
}
