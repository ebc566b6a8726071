// `specula bench serve`: vLLM's `vllm bench serve`, a client benchmark against a running
// OpenAI-compatible server (specula's or any other). It builds --num-prompts requests
// (bench_serve_dataset), sends them as streams at --request-rate with Poisson / gamma arrivals
// (--burstiness) under --max-concurrency, one thread per request in flight (bench_serve_request),
// and prints vLLM's "Serving Benchmark Result" block (bench_serve_report), with the speculative
// decoding acceptance of the run from /metrics deltas when the server speculates
// (bench_serve_spec). --save-result writes the figures and per-request arrays as JSON.
#include "cli/bench_serve.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/bench_serve_dataset.h"
#include "cli/bench_serve_report.h"
#include "cli/bench_serve_request.h"
#include "cli/bench_serve_spec.h"
#include "cli/http_client.h"
#include "core/error.h"

namespace specula::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ServeBenchArgs {
  std::string backend = "openai";
  std::string base_url;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint;
  std::string model;
  std::string api_key;
  DatasetArgs dataset;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int max_concurrency = 0;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  std::vector<std::string> goodput;
  bool disable_tqdm = false;
  bool save_result = false;
  std::string result_dir;
  std::string result_filename;
  double temperature = 0.0;
  double top_p = -1;
  int top_k = -1;
  double timeout_s = 3600;
};

constexpr const char* kFooter =
    "Random prompts: token ids cannot be sent over HTTP, so --dataset-name random builds text of random\n"
    "common words. When the server answers /tokenize (specula and vLLM do), each word's token count is\n"
    "asked once and words are drawn until the prompt holds --random-input-len tokens; the prompt's exact\n"
    "count (special tokens included) is then asked again and reported as its input length. Without\n"
    "/tokenize one word stands for one token. Random and text requests set ignore_eos, so that each\n"
    "output has its max_tokens (--random-output-len) tokens.\n"
    "Speculative decoding: vllm:spec_decode_* counters of GET /metrics are read before and after the\n"
    "run; the acceptance reported is their difference (exact when nothing else runs on the server).";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double parse_rate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "infinity") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  SPECULA_CHECK(!s.empty() && end == s.c_str() + s.size() && v > 0, "--request-rate {}: expected a positive number or inf", s);
  return v;
}

// Seconds from the start at which each request arrives: the first at 0, then gaps drawn from a
// gamma distribution of shape B and mean 1/R (B = 1: a Poisson process), as vLLM's get_request.
std::vector<double> arrival_times(int n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(n), 0.0);
  if (!std::isfinite(rate)) return t;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

// The model to ask for: --model, else the first id of GET /v1/models. Also the reachability check.
std::string resolve_model(HttpClient& client, const std::string& model) {
  HttpResult r = client.get("/v1/models");
  SPECULA_CHECK(r.error.empty(), "cannot reach the server at {}: {}", client.target().url("/v1/models"), r.error);
  if (!model.empty()) return model;
  SPECULA_CHECK(r.status == 200, "GET {} answered {}; pass --model", client.target().url("/v1/models"), r.describe());
  try {
    return json::parse(r.body).at("data").at(0).at("id").get<std::string>();
  } catch (const json::exception&) {
    throw Error(fmt::format("GET {}: no model id in the answer; pass --model", client.target().url("/v1/models")));
  }
}

SpecCounters scrape(HttpClient& client) {
  HttpResult r = client.get("/metrics");
  if (!r.ok()) return {};
  return parse_spec_counters(r.body);
}

class Progress {
 public:
  Progress(int total, bool enabled) : total_(total), enabled_(enabled), start_(Clock::now()) { draw(0); }
  void draw(int done) {
    if (!enabled_) return;
    const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    const int width = 30;
    const int filled = total_ > 0 ? done * width / total_ : width;
    std::fprintf(stderr, "\r%3d%%|%s%s| %d/%d [%.1fs, %.2f it/s]", total_ > 0 ? done * 100 / total_ : 100,
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), ' ').c_str(), done, total_, secs,
                 secs > 0 ? done / secs : 0.0);
    if (done == total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  int total_;
  bool enabled_;
  Clock::time_point start_;
};

std::string default_result_name(const ServeBenchArgs& a, const std::string& model, double rate) {
  std::string base = model.substr(model.find_last_of('/') == std::string::npos ? 0 : model.find_last_of('/') + 1);
  std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  const std::string rate_s = std::isfinite(rate) ? fmt::format("{}", rate) : "inf";
  const std::string conc = a.max_concurrency > 0 ? fmt::format("-concurrency{}", a.max_concurrency) : "";
  return fmt::format("{}-{}qps{}-{}-{}.json", a.backend, rate_s, conc, base, stamp);
}

int run_bench_serve(ServeBenchArgs& a) {
  if (a.backend == "vllm") a.backend = "openai";
  if (a.endpoint.empty()) a.endpoint = a.backend == "openai-chat" ? "/v1/chat/completions" : "/v1/completions";
  if (a.api_key.empty()) {
    if (const char* k = std::getenv("OPENAI_API_KEY")) a.api_key = k;
  }
  const double rate = parse_rate(a.request_rate);
  SPECULA_CHECK(a.burstiness > 0, "--burstiness {}: must be positive", a.burstiness);
  ReportSettings report;
  report.percentile_metrics = split(a.percentile_metrics, ',');
  for (const std::string& m : report.percentile_metrics) {
    SPECULA_CHECK(m == "ttft" || m == "tpot" || m == "itl" || m == "e2el",
                  "--percentile-metrics {}: expected a comma-separated subset of ttft,tpot,itl,e2el", a.percentile_metrics);
  }
  report.percentiles.clear();
  for (const std::string& p : split(a.metric_percentiles, ',')) {
    char* end = nullptr;
    const double v = std::strtod(p.c_str(), &end);
    SPECULA_CHECK(end == p.c_str() + p.size() && v > 0 && v < 100,
                  "--metric-percentiles {}: expected numbers between 0 and 100, comma-separated", a.metric_percentiles);
    report.percentiles.push_back(v);
  }
  std::vector<std::string> goodput_items;
  for (const std::string& g : a.goodput) for (const std::string& item : split(g, ' ')) goodput_items.push_back(item);
  report.goodput_slo_ms = parse_goodput(goodput_items);
  report.max_concurrency = a.max_concurrency;
  report.request_rate = rate;

  HttpTarget target = HttpTarget::parse(a.base_url, a.host, a.port);
  target.api_key = a.api_key;
  HttpClient control(target, 60.0);
  const std::string model = resolve_model(control, a.model);
  RemoteTokenizer tokenizer(control, model);
  std::vector<BenchRequest> requests = build_dataset(a.dataset, tokenizer);
  const int n = static_cast<int>(requests.size());

  RequestSettings settings;
  settings.backend = a.backend;
  settings.endpoint = a.endpoint;
  settings.model = model;
  settings.temperature = a.temperature;
  settings.top_p = a.top_p;
  settings.top_k = a.top_k;

  std::fprintf(stderr, "bench serve: %s%s, model %s, %d prompts (%s), request rate %s, burstiness %.2f%s\n",
               target.url("").c_str(), a.endpoint.c_str(), model.c_str(), n, a.dataset.name.c_str(),
               a.request_rate.c_str(), a.burstiness,
               a.max_concurrency > 0 ? fmt::format(", max concurrency {}", a.max_concurrency).c_str() : "");
  if (!tokenizer.available()) {
    std::fprintf(stderr, "bench serve: POST /tokenize failed (%s): input lengths are word counts\n",
                 tokenizer.probe_error().c_str());
  }

  const std::vector<double> arrivals = arrival_times(n, rate, a.burstiness, a.dataset.seed);
  const SpecCounters before = scrape(control);
  std::vector<RequestOutcome> outcomes(static_cast<size_t>(n));
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, done = 0;
  Progress progress(n, !a.disable_tqdm);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(arrivals[static_cast<size_t>(i)])));
    {
      std::unique_lock<std::mutex> lock(mu);
      if (a.max_concurrency > 0) cv.wait(lock, [&] { return in_flight < a.max_concurrency; });
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      RequestOutcome o;
      const double start = std::chrono::duration<double>(Clock::now() - t0).count();
      try {
        HttpClient client(target, a.timeout_s);
        o = send_request(client, settings, requests[static_cast<size_t>(i)]);
      } catch (const std::exception& e) {
        o.error = e.what();
        o.prompt_len = requests[static_cast<size_t>(i)].prompt_len;
      }
      o.start = start;
      std::lock_guard<std::mutex> lock(mu);
      outcomes[static_cast<size_t>(i)] = std::move(o);
      --in_flight;
      progress.draw(++done);
      cv.notify_all();
    });
  }
  for (std::thread& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - t0).count();
  const SpecCounters after = scrape(control);

  json result = compute_report(outcomes, duration, report, spec_delta(before, after));
  const int failed = result["failed"].get<int>();
  if (failed > 0) {
    for (const RequestOutcome& o : outcomes) {
      if (o.success) continue;
      std::fprintf(stderr, "bench serve: %d of %d requests failed; the first error: %s\n", failed, n, o.error.c_str());
      break;
    }
  }
  print_report(result, report);

  if (a.save_result || !a.result_filename.empty()) {
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&now));
    json meta = {{"date", date},
                 {"backend", a.backend},
                 {"base_url", target.url("")},
                 {"endpoint", a.endpoint},
                 {"model_id", model},
                 {"dataset_name", a.dataset.name},
                 {"num_prompts", n},
                 {"request_rate", std::isfinite(rate) ? json(rate) : json("inf")},
                 {"burstiness", a.burstiness},
                 {"max_concurrency", a.max_concurrency > 0 ? json(a.max_concurrency) : json(nullptr)},
                 {"random_input_len", a.dataset.input_len},
                 {"random_output_len", a.dataset.output_len},
                 {"random_range_ratio", a.dataset.range_ratio},
                 {"seed", a.dataset.seed},
                 {"temperature", a.temperature}};
    meta.update(result);
    namespace fs = std::filesystem;
    fs::path file = a.result_filename.empty() ? fs::path(default_result_name(a, model, rate)) : fs::path(a.result_filename);
    if (!a.result_dir.empty()) {
      std::error_code ec;
      fs::create_directories(a.result_dir, ec);
      file = fs::path(a.result_dir) / file;
    }
    std::ofstream out(file);
    SPECULA_CHECK(out.good(), "--save-result: cannot write {}", file.string());
    out << meta.dump(2) << "\n";
    std::fprintf(stderr, "bench serve: results written to %s\n", file.string().c_str());
  }
  return result["completed"].get<int>() > 0 ? 0 : 1;
}

}  // namespace

Runner add_bench_serve_command(CLI::App& bench) {
  auto a = std::make_shared<ServeBenchArgs>();
  auto* cmd = bench.add_subcommand("serve", "benchmark a running OpenAI-compatible server (vLLM's `vllm bench serve`)");
  cmd->footer(kFooter);
  cmd->add_option("--backend", a->backend, "openai (/v1/completions) or openai-chat (/v1/chat/completions)")
      ->capture_default_str()->check(CLI::IsMember({"openai", "openai-chat", "vllm"}));
  cmd->add_option("--base-url", a->base_url, "server URL, http://HOST:PORT[/PREFIX] (instead of --host/--port)");
  cmd->add_option("--host", a->host, "server host")->capture_default_str();
  cmd->add_option("--port", a->port, "server port")->capture_default_str()->check(CLI::Range(1, 65535));
  cmd->add_option("--endpoint", a->endpoint, "route (default: /v1/completions, or /v1/chat/completions for openai-chat)");
  cmd->add_option("--model", a->model, "model name in the requests (default: the first id of GET /v1/models)");
  cmd->add_option("--api-key", a->api_key, "sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)");
  cmd->add_option("--dataset-name", a->dataset.name, "random, jsonl (vLLM's custom; also accepted) or text")
      ->capture_default_str()->check(CLI::IsMember({"random", "jsonl", "custom", "text"}));
  cmd->add_option("--dataset-path", a->dataset.path,
                  "jsonl: one {\"prompt\": ..., \"output_len\": N (optional)} a line; text: a plain-text file");
  cmd->add_option("--num-prompts", a->dataset.num_prompts, "requests")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--random-input-len", a->dataset.input_len, "prompt tokens (random and text)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--random-output-len", a->dataset.output_len, "max_tokens (random and text, with ignore_eos)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--random-range-ratio", a->dataset.range_ratio,
                  "lengths uniform in [len * (1 - r), len * (1 + r)]")->capture_default_str()->check(CLI::Range(0.0, 0.999));
  cmd->add_option("--custom-output-len", a->dataset.custom_output_len, "jsonl: max_tokens of lines without output_len")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--ignore-eos", a->dataset.ignore_eos, "jsonl: send ignore_eos (random and text always do)");
  cmd->add_option("--request-rate", a->request_rate, "requests per second (inf: all at once)")->capture_default_str();
  cmd->add_option("--burstiness", a->burstiness,
                  "shape of the gamma-distributed inter-arrival times (1: Poisson; lower: burstier)")->capture_default_str();
  cmd->add_option("--max-concurrency", a->max_concurrency, "most requests in flight at once (default: no limit)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", a->dataset.seed, "seed of the prompts, lengths and arrivals")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "sampling temperature (default 0: greedy)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", a->top_p, "top_p of the requests (default: not sent)");
  cmd->add_option("--top-k", a->top_k, "top_k of the requests (default: not sent)");
  cmd->add_option("--percentile-metrics", a->percentile_metrics, "comma-separated subset of ttft,tpot,itl,e2el")
      ->capture_default_str();
  cmd->add_option("--metric-percentiles", a->metric_percentiles, "comma-separated percentiles, e.g. 25,50,99")
      ->capture_default_str();
  cmd->add_option("--goodput", a->goodput, "SLOs as KEY:MS (ttft, tpot, e2el): requests meeting all of them per second");
  cmd->add_flag("--disable-tqdm", a->disable_tqdm, "no progress bar on stderr");
  cmd->add_flag("--save-result", a->save_result, "write the results as JSON");
  cmd->add_option("--result-dir", a->result_dir, "folder of the JSON (default: the current one)");
  cmd->add_option("--result-filename", a->result_filename,
                  "JSON file name (default: BACKEND-RATEqps[-concurrencyC]-MODEL-DATE.json); implies --save-result");
  cmd->add_option("--timeout", a->timeout_s, "seconds a request may wait for its answer")->capture_default_str()
      ->check(CLI::PositiveNumber);
  return [a]() { return run_bench_serve(*a); };
}

}  // namespace specula::cli
