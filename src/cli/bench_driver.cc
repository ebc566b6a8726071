#include "cli/bench_driver.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <memory>
#include <random>
#include <thread>

#include "core/error.h"

namespace specula::cli {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

std::vector<std::vector<int32_t>> random_prompts(int count, int input_len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(std::min<int64_t>(vocab, 10000) - 1));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(count));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(input_len));
    for (int32_t& t : p) t = id(rng);
  }
  return prompts;
}

std::vector<std::vector<int32_t>> text_prompts(const Tokenizer& tokenizer, const std::string& path, int count,
                                               int input_len, uint64_t seed) {
  std::ifstream in(path, std::ios::binary);
  SPECULA_CHECK(in.good(), "--dataset {}: cannot read the file", path);
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<int32_t> ids = tokenizer.encode(text.str(), /*add_special_tokens=*/false);
  SPECULA_CHECK(static_cast<int64_t>(ids.size()) >= input_len,
                "--dataset {}: {} tokens, fewer than --input-len {}", path, ids.size(), input_len);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> start(0, ids.size() - static_cast<size_t>(input_len));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(count));
  for (auto& p : prompts) {
    const size_t s = start(rng);
    p.assign(ids.begin() + static_cast<std::ptrdiff_t>(s), ids.begin() + static_cast<std::ptrdiff_t>(s + input_len));
  }
  return prompts;
}

BatchTiming run_batch(LLMEngine& engine, const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                      const std::string& id_prefix) {
  struct Pending {
    std::shared_ptr<RequestStream> stream;
    RequestTiming timing;
    bool done = false;
  };
  std::vector<Pending> pending(prompts.size());
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    pending[i].stream = engine.add_request(NewRequest{id_prefix + std::to_string(i), prompts[i], params});
    pending[i].timing.prompt_tokens = static_cast<int>(prompts[i].size());
  }
  // Poll every stream without blocking on any: a timestamp is late by at most one sweep plus the
  // short sleep, not by other requests' waits.
  size_t remaining = pending.size();
  RequestOutput out;
  while (remaining > 0) {
    bool progressed = false;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      while (!p.done && p.stream->pop(&out, std::chrono::milliseconds(0))) {
        progressed = true;
        const Clock::time_point now = Clock::now();
        SPECULA_CHECK(!out.error, "benchmark request {} failed: {}", out.request_id, out.error.value_or(""));
        for (const ChoiceDelta& d : out.choices) {
          if (p.timing.output_tokens == 0 && !d.token_ids.empty()) p.timing.ttft = seconds_between(start, now);
          p.timing.output_tokens += static_cast<int>(d.token_ids.size());
        }
        if (out.finished) {
          p.timing.e2e = seconds_between(start, now);
          p.done = true;
          --remaining;
        }
      }
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  BatchTiming batch;
  batch.seconds = seconds_between(start, Clock::now());
  for (Pending& p : pending) batch.requests.push_back(p.timing);
  return batch;
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = q / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(rank);
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

}  // namespace specula::cli
