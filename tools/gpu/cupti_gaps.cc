// A CUPTI injection library (CUDA_INJECTION64_PATH=libcupti_gaps.so) that records every kernel,
// copy and memset of the process and, at exit, reports the GPU's idle time over its steady
// steps (from one kernel named like CUPTI_GAPS_MARKER, default the fused draft chain, to the
// next; periods over three times the median left out): the gaps between busy intervals by size,
// and the kernels around the largest share of the idle time; without such a kernel, each kernel
// name's total over the run. What Nsight Systems' timeline would show, where it is not
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
        spans->push_back({k->start, k->end, name.substr(0, 110)});
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

// Idle time and the kernels around it over the records [from, to) (sorted by start).
struct Idle {
  uint64_t busy = 0, span = 0;
  std::vector<uint64_t> gaps;
  std::map<std::string, std::pair<uint64_t, int>> around;  // "before -> after": idle ns, count
};

void add_idle(const std::vector<Span>& all, size_t from, size_t to, Idle& idle) {
  if (from >= to) return;
  uint64_t cur_s = all[from].start, cur_e = all[from].end;
  std::string before = all[from].name;
  for (size_t i = from + 1; i < to; ++i) {
    const Span& s = all[i];
    if (s.start > cur_e) {
      idle.busy += cur_e - cur_s;
      const uint64_t g = s.start - cur_e;
      idle.gaps.push_back(g);
      auto& a = idle.around[before + "  ->  " + s.name];
      a.first += g;
      a.second += 1;
      cur_s = s.start, cur_e = s.end;
    } else {
      cur_e = std::max(cur_e, s.end);
    }
    if (s.end >= cur_e) before = s.name;
  }
  idle.busy += cur_e - cur_s;
  idle.span += all[to - 1].start - all[from].start;
}

void print_idle(FILE* out, const Idle& idle, const char* what) {
  std::fprintf(out, "%s: %.2f ms, GPU busy %.1f%%, idle %.2f ms\n", what, idle.span / 1e6,
               100.0 * idle.busy / std::max<uint64_t>(idle.span, 1), (idle.span - std::min(idle.span, idle.busy)) / 1e6);
  const double edges[] = {0, 2e3, 5e3, 10e3, 20e3, 50e3, 100e3, 1e18};
  for (int b = 0; b + 1 < 8; ++b) {
    uint64_t n = 0, sum = 0;
    for (uint64_t g : idle.gaps)
      if (g >= edges[b] && g < edges[b + 1]) ++n, sum += g;
    std::fprintf(out, "  gaps %4.0f-%-4.0f us: %7lu, %.2f ms\n", edges[b] / 1e3, edges[b + 1] < 1e17 ? edges[b + 1] / 1e3 : 1e9,
                 static_cast<unsigned long>(n), sum / 1e6);
  }
  std::vector<std::pair<std::string, std::pair<uint64_t, int>>> top(idle.around.begin(), idle.around.end());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  for (size_t i = 0; i < top.size() && i < 12; ++i)
    std::fprintf(out, "  %8.2f ms %6d x (%5.1f us)  %s\n", top[i].second.first / 1e6, top[i].second.second,
                 top[i].second.first / 1e3 / top[i].second.second, top[i].first.c_str());
}

void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mutex);
  FILE* out = stderr;
  if (const char* path = std::getenv("CUPTI_GAPS_OUT")) out = std::fopen(path, "w");
  if (!out || spans->empty()) return;
  std::vector<Span>& all = *spans;
  std::sort(all.begin(), all.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  // Steps: from one record whose name holds CUPTI_GAPS_MARKER to the next; steps longer than
  // three times the median (a request's end, a prefill, startup) are left out.
  const char* marker = std::getenv("CUPTI_GAPS_MARKER");
  const std::string mark = marker ? marker : "decoder_chain";
  std::vector<size_t> at;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].name.find(mark) != std::string::npos) at.push_back(i);
  std::fprintf(out, "%zu records, %zu with '%s'\n", all.size(), at.size(), mark.c_str());
  if (at.size() < 3) {  // no steps to cut: each kernel name's total over the whole run
    std::map<std::string, std::pair<uint64_t, int>> by_name;
    for (const Span& s : all) {
      auto& b = by_name[s.name];
      b.first += s.end - s.start;
      b.second += 1;
    }
    std::vector<std::pair<std::string, std::pair<uint64_t, int>>> top(by_name.begin(), by_name.end());
    std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    for (size_t i = 0; i < top.size() && i < 40; ++i)
      std::fprintf(out, "  %9.1f us %7d x (%6.2f us)  %s\n", top[i].second.first / 1e3, top[i].second.second,
                   top[i].second.first / 1e3 / top[i].second.second, top[i].first.c_str());
    if (out != stderr) std::fclose(out);
    return;
  }
  std::vector<uint64_t> periods;
  for (size_t j = 0; j + 1 < at.size(); ++j) periods.push_back(all[at[j + 1]].start - all[at[j]].start);
  std::vector<uint64_t> sorted = periods;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const uint64_t median = sorted[sorted.size() / 2];
  Idle steady;
  int steps = 0;
  for (size_t j = 0; j + 1 < at.size(); ++j) {
    if (periods[j] > 3 * median) continue;
    add_idle(all, at[j], at[j + 1] + 1, steady);
    ++steps;
  }
  std::fprintf(out, "steps between markers: %d of %zu, median period %.1f us, mean %.1f us\n", steps, periods.size(),
               median / 1e3, steady.span / 1e3 / std::max(steps, 1));
  print_idle(out, steady, "steady steps");
  // Where the busy time goes: each kernel name's time a step (copies by kind), largest first.
  std::map<std::string, std::pair<uint64_t, int>> by_name;
  for (size_t j = 0; j + 1 < at.size(); ++j) {
    if (periods[j] > 3 * median) continue;
    for (size_t i = at[j]; i < at[j + 1]; ++i) {
      auto& b = by_name[all[i].name];
      b.first += all[i].end - all[i].start;
      b.second += 1;
    }
  }
  std::vector<std::pair<std::string, std::pair<uint64_t, int>>> top(by_name.begin(), by_name.end());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  uint64_t total = 0;
  int count = 0;
  for (const auto& t : top) total += t.second.first, count += t.second.second;
  std::fprintf(out, "kernels and copies a step: %.1f us in %.1f records\n", total / 1e3 / std::max(steps, 1),
               static_cast<double>(count) / std::max(steps, 1));
  for (size_t i = 0; i < top.size() && i < 25; ++i)
    std::fprintf(out, "  %7.1f us %5.1f x  %s\n", top[i].second.first / 1e3 / std::max(steps, 1),
                 static_cast<double>(top[i].second.second) / std::max(steps, 1), top[i].first.c_str());
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
