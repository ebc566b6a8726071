#include "cli/bench_serve_report.h"

#include <cmath>
#include <cstdio>
#include <numeric>

#include <fmt/format.h>

#include "cli/bench_driver.h"
#include "core/error.h"

namespace specula::cli {
namespace {

using json = nlohmann::json;

struct MetricName {
  const char* key;
  const char* header;
  const char* label;
};
constexpr MetricName kMetrics[] = {{"ttft", "Time to First Token", "TTFT"},
                                   {"tpot", "Time per Output Token (excl. 1st token)", "TPOT"},
                                   {"itl", "Inter-token Latency", "ITL"},
                                   {"e2el", "End-to-end Latency", "E2EL"}};

// "99" for 99.0, "99.9" for 99.9 (vLLM's key spelling).
std::string percentile_word(double p) {
  if (p == std::floor(p)) return fmt::format("{}", static_cast<long long>(p));
  return fmt::format("{}", p);
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double stdev(const std::vector<double>& v) {  // population, as np.std
  if (v.empty()) return 0.0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

std::string centered(const std::string& title, char fill) {
  const size_t width = 50;
  if (title.size() >= width) return title;
  const size_t left = (width - title.size()) / 2;
  return std::string(left, fill) + title + std::string(width - title.size() - left, fill);
}

void line(const std::string& label, const std::string& value) { std::printf("%-40s %-10s\n", label.c_str(), value.c_str()); }

}  // namespace

std::map<std::string, double> parse_goodput(const std::vector<std::string>& items) {
  std::map<std::string, double> out;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    SPECULA_CHECK(colon != std::string::npos, "--goodput {}: expected KEY:VALUE (ttft:MS, tpot:MS, e2el:MS)", item);
    const std::string key = item.substr(0, colon);
    SPECULA_CHECK(key == "ttft" || key == "tpot" || key == "e2el",
                  "--goodput {}: the metric must be ttft, tpot or e2el", item);
    char* end = nullptr;
    const std::string v = item.substr(colon + 1);
    const double ms = std::strtod(v.c_str(), &end);
    SPECULA_CHECK(!v.empty() && end == v.c_str() + v.size() && ms >= 0,
                  "--goodput {}: the SLO must be a non-negative number of milliseconds", item);
    out[key] = ms;
  }
  return out;
}

json compute_report(const std::vector<RequestOutcome>& outcomes, double duration_s, const ReportSettings& settings,
                    const json& spec) {
  int completed = 0, failed = 0, good = 0;
  long long input_tokens = 0, output_tokens = 0;
  std::map<std::string, std::vector<double>> values;  // seconds, per metric
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(), itls = json::array(),
       texts = json::array(), errors = json::array(), start_times = json::array(), e2els = json::array();
  for (const RequestOutcome& o : outcomes) {
    input_lens.push_back(o.prompt_len);
    output_lens.push_back(o.success ? o.output_tokens : 0);
    ttfts.push_back(o.success ? o.ttft : 0.0);
    e2els.push_back(o.success ? o.latency : 0.0);
    itls.push_back(o.itl);
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
    start_times.push_back(o.start);
    if (!o.success) {
      ++failed;
      continue;
    }
    ++completed;
    input_tokens += o.prompt_len;
    output_tokens += o.output_tokens;
    const double tpot = o.output_tokens > 1 ? (o.latency - o.ttft) / (o.output_tokens - 1) : 0.0;
    values["ttft"].push_back(o.ttft);
    if (o.output_tokens > 1) values["tpot"].push_back(tpot);
    values["itl"].insert(values["itl"].end(), o.itl.begin(), o.itl.end());
    values["e2el"].push_back(o.latency);
    if (!settings.goodput_slo_ms.empty()) {
      bool ok = true;
      for (const auto& [key, slo] : settings.goodput_slo_ms) {
        const double v = key == "ttft" ? o.ttft : key == "tpot" ? tpot : o.latency;
        ok = ok && v * 1000.0 <= slo;
      }
      good += ok;
    }
  }
  const double d = duration_s > 0 ? duration_s : 1e-9;
  json j;
  j["duration"] = duration_s;
  j["completed"] = completed;
  j["failed"] = failed;
  j["total_input_tokens"] = input_tokens;
  j["total_output_tokens"] = output_tokens;
  j["request_throughput"] = completed / d;
  j["request_goodput"] = settings.goodput_slo_ms.empty() ? json(nullptr) : json(good / d);
  j["output_throughput"] = static_cast<double>(output_tokens) / d;
  j["total_token_throughput"] = static_cast<double>(input_tokens + output_tokens) / d;
  for (const MetricName& m : kMetrics) {
    if (std::find(settings.percentile_metrics.begin(), settings.percentile_metrics.end(), m.key) ==
        settings.percentile_metrics.end())
      continue;
    std::vector<double> ms;
    for (double s : values[m.key]) ms.push_back(s * 1000.0);
    j[fmt::format("mean_{}_ms", m.key)] = mean(ms);
    j[fmt::format("median_{}_ms", m.key)] = percentile(ms, 50);
    j[fmt::format("std_{}_ms", m.key)] = stdev(ms);
    for (double p : settings.percentiles) {
      j[fmt::format("p{}_{}_ms", percentile_word(p), m.key)] = percentile(ms, p);
    }
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["e2els"] = std::move(e2els);
  j["start_times"] = std::move(start_times);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
  j["spec_decoding"] = spec;
  if (spec.is_object()) {  // flat keys too, for tools that read the top level only
    j["spec_decode_acceptance_rate"] = spec["acceptance_rate"].get<double>() * 100.0;
    j["spec_decode_acceptance_length"] = spec["acceptance_length"];
    j["spec_decode_num_drafts"] = spec["num_drafts"];
    j["spec_decode_draft_tokens"] = spec["draft_tokens"];
    j["spec_decode_accepted_tokens"] = spec["accepted_tokens"];
    j["spec_decode_per_position_acceptance_rates"] = spec["per_position_acceptance"];
  }
  return j;
}

void print_report(const json& r, const ReportSettings& s) {
  auto f2 = [](double v) { return fmt::format("{:.2f}", v); };
  std::printf("%s\n", centered(" Serving Benchmark Result ", '=').c_str());
  line("Successful requests:", fmt::format("{}", r["completed"].get<int>()));
  line("Failed requests:", fmt::format("{}", r["failed"].get<int>()));
  if (s.max_concurrency > 0) line("Maximum request concurrency:", fmt::format("{}", s.max_concurrency));
  line("Request rate configured (RPS):",
       s.request_rate > 0 && std::isfinite(s.request_rate) ? f2(s.request_rate) : std::string("inf"));
  line("Benchmark duration (s):", f2(r["duration"].get<double>()));
  line("Total input tokens:", fmt::format("{}", r["total_input_tokens"].get<long long>()));
  line("Total generated tokens:", fmt::format("{}", r["total_output_tokens"].get<long long>()));
  line("Request throughput (req/s):", f2(r["request_throughput"].get<double>()));
  if (!r["request_goodput"].is_null()) line("Request goodput (req/s):", f2(r["request_goodput"].get<double>()));
  line("Output token throughput (tok/s):", f2(r["output_throughput"].get<double>()));
  line("Total Token throughput (tok/s):", f2(r["total_token_throughput"].get<double>()));
  for (const MetricName& m : kMetrics) {
    if (!r.contains(fmt::format("mean_{}_ms", m.key))) continue;
    std::printf("%s\n", centered(m.header, '-').c_str());
    line(fmt::format("Mean {} (ms):", m.label), f2(r[fmt::format("mean_{}_ms", m.key)].get<double>()));
    line(fmt::format("Median {} (ms):", m.label), f2(r[fmt::format("median_{}_ms", m.key)].get<double>()));
    for (double p : s.percentiles) {
      const std::string w = percentile_word(p);
      line(fmt::format("P{} {} (ms):", w, m.label), f2(r[fmt::format("p{}_{}_ms", w, m.key)].get<double>()));
    }
  }
  const json& spec = r["spec_decoding"];
  if (spec.is_object()) {
    std::printf("%s\n", centered("Speculative Decoding", '-').c_str());
    line("Acceptance rate (%):", f2(spec["acceptance_rate"].get<double>() * 100.0));
    line("Acceptance length:", f2(spec["acceptance_length"].get<double>()));
    line("Drafts:", fmt::format("{:.0f}", spec["num_drafts"].get<double>()));
    line("Draft tokens:", fmt::format("{:.0f}", spec["draft_tokens"].get<double>()));
    line("Accepted tokens:", fmt::format("{:.0f}", spec["accepted_tokens"].get<double>()));
    std::printf("Per-position acceptance (%%):\n");
    const json& pp = spec["per_position_acceptance"];
    for (size_t i = 0; i < pp.size(); ++i) line(fmt::format("  Position {}:", i), f2(pp[i].get<double>() * 100.0));
  }
  std::printf("%s\n", std::string(50, '=').c_str());
  std::fflush(stdout);
}

}  // namespace specula::cli
