#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

#include "server/text_util.h"

namespace specula::server {
namespace {

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), so that quantiles compare one to one.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                         0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

void header(std::string* out, const std::string& name, const char* type, const char* help) {
  fmt::format_to(std::back_inserter(*out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void sample(std::string* out, const std::string& name, const std::string& labels, double v) {
  fmt::format_to(std::back_inserter(*out), "{}{{{}}} {}\n", name, labels, py_float(v));
}

}  // namespace

std::vector<double> buckets_1_2_5(int max) {
  std::vector<double> out;
  for (double scale = 1;; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale > max) return out;
      out.push_back(m * scale);
    }
  }
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // first bound >= v
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::render(std::string* out, const std::string& name, const std::string& labels) const {
  std::vector<int64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) counts[i] = static_cast<int64_t>(buckets_[i].load(std::memory_order_relaxed));
  // _count comes from the buckets just read, so that a scrape racing an observation stays consistent.
  render_counts(out, name, labels, bounds_, counts, sum_.load());
}

void Histogram::render_counts(std::string* out, const std::string& name, const std::string& labels,
                              std::span<const double> bounds, std::span<const int64_t> counts, double sum) {
  int64_t cumulative = 0;
  for (size_t i = 0; i <= bounds.size(); ++i) {
    cumulative += i < counts.size() ? counts[i] : 0;
    std::string le = i < bounds.size() ? py_float(bounds[i]) : "+Inf";
    fmt::format_to(std::back_inserter(*out), "{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le,
                   py_float(static_cast<double>(cumulative)));
  }
  fmt::format_to(std::back_inserter(*out), "{}_count{{{}}} {}\n", name, labels, py_float(static_cast<double>(cumulative)));
  fmt::format_to(std::back_inserter(*out), "{}_sum{{{}}} {}\n", name, labels, py_float(sum));
}

ServerMetrics::ServerMetrics(int max_model_len)
    : ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kE2eBuckets),
      prompt_tokens_(buckets_1_2_5(std::max(max_model_len, 1))),
      generation_tokens_(buckets_1_2_5(std::max(max_model_len, 1))),
      queue_(kE2eBuckets),
      prefill_(kE2eBuckets),
      decode_(kE2eBuckets),
      inference_(kE2eBuckets) {}

void ServerMetrics::observe_request_phases(const RequestTimes& t) {
  if (t.scheduled > 0.0) queue_.observe(std::max(0.0, t.scheduled - t.arrival));
  if (t.first_token > 0.0 && t.scheduled > 0.0) {
    prefill_.observe(std::max(0.0, t.first_token - t.scheduled));
    decode_.observe(std::max(0.0, t.last_token - t.first_token));
    inference_.observe(std::max(0.0, t.last_token - t.scheduled));
  }
}

void ServerMetrics::count_finished(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: finished_[0].fetch_add(1); break;
    case FinishReason::kLength: finished_[1].fetch_add(1); break;
    case FinishReason::kAbort: finished_[2].fetch_add(1); break;
    case FinishReason::kNone: break;
  }
}

std::string ServerMetrics::render(const EngineMetrics& m, const std::string& model_name) const {
  std::string out;
  out.reserve(16384);
  // Label values escape backslash, quote and newline (exposition format).
  std::string escaped;
  for (char c : model_name) {
    if (c == '\\' || c == '"') escaped += '\\';
    if (c == '\n') { escaped += "\\n"; continue; }
    escaped += c;
  }
  const std::string labels = fmt::format("engine=\"0\",model_name=\"{}\"", escaped);

  auto gauge = [&](const char* name, const char* help, double v) {
    header(&out, name, "gauge", help);
    sample(&out, name, labels, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    header(&out, name, "counter", help);
    sample(&out, name, labels, v);
  };
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    header(&out, name, "histogram", help);
    h.render(&out, name, labels);
  };

  // vLLM's info gauge: the cache's configuration as labels, value 1 (Python spellings).
  header(&out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  sample(&out, "vllm:cache_config_info",
         fmt::format("block_size=\"{}\",cache_dtype=\"{}\",enable_prefix_caching=\"{}\",engine=\"0\","
                     "gpu_memory_utilization=\"{}\",num_gpu_blocks=\"{}\"",
                     m.block_size, m.cache_dtype, m.enable_prefix_caching ? "True" : "False",
                     py_float(m.gpu_memory_utilization), m.num_gpu_blocks),
         1.0);
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.", m.num_requests_running);
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", m.num_requests_waiting);
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m.kv_cache_usage);
  counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", m.num_preemptions);
  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", m.prompt_tokens_total);
  counter("vllm:generation_tokens_total", "Number of generation tokens processed.", m.generation_tokens_total);
  counter("vllm:prefix_cache_queries_total",
          "Prefix cache queries, in terms of number of queried tokens.", m.prefix_cache_queries);
  counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", m.prefix_cache_hits);

  header(&out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  static const char* kReasons[] = {"stop", "length", "abort"};
  for (size_t i = 0; i < finished_.size(); ++i) {
    sample(&out, "vllm:request_success_total", labels + fmt::format(",finished_reason=\"{}\"", kReasons[i]),
           static_cast<double>(finished_[i].load()));
  }

  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", itl_);
  histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_);
  histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_tokens_);
  histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", generation_tokens_);
  histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", queue_);
  histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", prefill_);
  histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", decode_);
  histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
            inference_);
  header(&out, "vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.");
  Histogram::render_counts(&out, "vllm:iteration_tokens_total", labels, kIterationTokenBuckets,
                           m.iteration_tokens_buckets, static_cast<double>(m.iteration_tokens_sum));

  counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", m.spec_num_drafts);
  counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", m.spec_num_draft_tokens);
  counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", m.spec_num_accepted_tokens);
  header(&out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Accepted tokens per draft position.");
  for (size_t pos = 0; pos < m.spec_accepted_per_pos.size(); ++pos) {
    sample(&out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", labels + fmt::format(",position=\"{}\"", pos),
           static_cast<double>(m.spec_accepted_per_pos[pos]));
  }
  return out;
}

}  // namespace specula::server
