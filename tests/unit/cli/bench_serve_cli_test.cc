// `specula bench serve` end to end on the CPU: the built binary (SPECULA_BINARY, set by ctest)
// serves the embedded specula-tiny on a free local port, and the same binary benchmarks it over
// HTTP. The saved JSON must account for every request and token that was asked for, its figures
// must agree with its own per-request arrays, --max-concurrency must hold, the speculative
// acceptance must be the server's /metrics counters' difference over the run, and failures (no
// server, a refused request) must be reported as such.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_paths.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* binary() {
  const char* bin = std::getenv("SPECULA_BINARY");
  return bin && fs::exists(bin) ? bin : nullptr;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A port nothing listens on right now (bound to 0, then released).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

fs::path temp_path(const std::string& tag) {
  return fs::temp_directory_path() / ("specula_bench_serve_" + tag + "_" + std::to_string(getpid()));
}

// `specula serve` on the embedded model, on the CPU, on a free port; stopped with SIGTERM.
class Server {
 public:
  explicit Server(const std::vector<std::string>& extra) : port_(free_port()), log_(temp_path("server_log")) {
    const fs::path model = testing::models_dir() / "specula-tiny";
    std::vector<std::string> args = {binary(), "serve", model.string(), "--device", "cpu", "--host", "127.0.0.1",
                                     "--port", std::to_string(port_), "--max-model-len", "256", "--max-num-seqs", "16",
                                     "--served-model-name", "tiny", "--seed", "0", "--disable-uvicorn-access-log"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test binary that crashed
      FILE* f = std::freopen(log_.c_str(), "w", stdout);
      (void)f;
      dup2(fileno(stdout), 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(1);
    for (int i = 0; i < 300 && !ready_; ++i) {  // 30 s at most
      if (auto r = c.Get("/health"); r && r->status == 200) ready_ = true;
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
    }
  }
  ~Server() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    fs::remove(log_);
  }
  bool ready() const { return ready_; }
  int port() const { return port_; }
  std::string log() const { return read_file(log_); }
  std::string metrics() const {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Get("/metrics");
    return r && r->status == 200 ? r->body : std::string();
  }

 private:
  int port_;
  fs::path log_;
  pid_t pid_ = -1;
  bool ready_ = false;
};

struct BenchRun {
  int rc = -1;
  std::string out, err;
  json result;  // the --result-filename JSON (null when not written)
};

// `specula bench serve ARGS --result-filename FILE`, stdout and stderr apart.
BenchRun bench_serve(const std::string& args, bool save = true) {
  const fs::path out = temp_path("out"), err = temp_path("err"), res = temp_path("result.json");
  fs::remove(res);
  const std::string cmd = quote(binary()) + " bench serve " + args +
                          (save ? " --save-result --result-filename " + quote(res.string()) : "") + " > " +
                          quote(out.string()) + " 2> " + quote(err.string());
  BenchRun r;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  if (fs::exists(res)) r.result = json::parse(read_file(res));
  fs::remove(out);
  fs::remove(err);
  fs::remove(res);
  return r;
}

double metric_sum(const std::string& text, const std::string& name) {
  double sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) == 0 || line.rfind(name + " ", 0) == 0) sum += std::stod(line.substr(line.rfind(' ')));
  }
  return sum;
}

// Figures every successful run must satisfy, against its own per-request arrays.
void expect_consistent(const json& j, int n, int output_len) {
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["completed"], n);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["num_prompts"], n);
  EXPECT_EQ(j["total_output_tokens"], n * output_len);
  ASSERT_EQ(j["output_lens"].size(), static_cast<size_t>(n));
  ASSERT_EQ(j["ttfts"].size(), static_cast<size_t>(n));
  const double duration = j["duration"];
  ASSERT_GT(duration, 0.0);
  long long input = 0;
  std::vector<double> ttft_ms, tpot_ms;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(j["output_lens"][i], output_len) << i;
    EXPECT_EQ(j["errors"][i], "") << i;
    input += j["input_lens"][i].get<long long>();
    const double ttft = j["ttfts"][i], e2e = j["e2els"][i];
    EXPECT_GT(ttft, 0.0);
    EXPECT_GT(e2e, ttft);
    EXPECT_LE(j["start_times"][i].get<double>() + e2e, duration + 1e-3) << i;
    // The chunks' gaps fit between the first token and the end, one gap fewer than text chunks.
    double itl_sum = 0;
    for (double g : j["itls"][i]) itl_sum += g;
    EXPECT_LE(itl_sum, e2e - ttft + 1e-9);
    EXPECT_LE(j["itls"][i].size(), static_cast<size_t>(output_len - 1));
    EXPECT_FALSE(j["generated_texts"][i].get<std::string>().empty());
    ttft_ms.push_back(ttft * 1000);
    tpot_ms.push_back((e2e - ttft) / (output_len - 1) * 1000);
  }
  EXPECT_EQ(j["total_input_tokens"], input);
  EXPECT_NEAR(j["request_throughput"].get<double>(), n / duration, 1e-6 * n / duration);
  EXPECT_NEAR(j["output_throughput"].get<double>(), n * output_len / duration, 1e-6 * n * output_len / duration);
  EXPECT_NEAR(j["total_token_throughput"].get<double>(), (input + n * output_len) / duration, 1e-3);
  double mean_ttft = 0, mean_tpot = 0;
  for (int i = 0; i < n; ++i) mean_ttft += ttft_ms[i] / n, mean_tpot += tpot_ms[i] / n;
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), mean_ttft, 1e-6);
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), mean_tpot, 1e-6);
  std::sort(ttft_ms.begin(), ttft_ms.end());
  const std::string hi = j.contains("p99_ttft_ms") ? "p99" : "p90";  // the highest percentile asked
  ASSERT_TRUE(j.contains(hi + "_ttft_ms") && j.contains(hi + "_tpot_ms") && j.contains(hi + "_itl_ms"));
  EXPECT_GE(j["median_ttft_ms"].get<double>(), ttft_ms.front());
  EXPECT_LE(j["median_ttft_ms"].get<double>(), j[hi + "_ttft_ms"].get<double>());
  EXPECT_LE(j[hi + "_ttft_ms"].get<double>(), ttft_ms.back() + 1e-9);
  EXPECT_LE(j["median_tpot_ms"].get<double>(), j[hi + "_tpot_ms"].get<double>());
  EXPECT_LE(j["median_itl_ms"].get<double>(), j[hi + "_itl_ms"].get<double>());
  EXPECT_GT(j["mean_itl_ms"].get<double>(), 0.0);
}

class BenchServeCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (binary()) server_ = new Server({});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (!binary()) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
    ASSERT_TRUE(server_->ready()) << server_->log();
  }
  static std::string target() { return "--port " + std::to_string(server_->port()); }
  static Server* server_;
};
Server* BenchServeCli::server_ = nullptr;

TEST_F(BenchServeCli, CompletionsAllAtOnceAccountForEveryToken) {
  const BenchRun r = bench_serve(target() + " --num-prompts 12 --random-input-len 24 --random-output-len 8 --seed 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(r.result.is_object()) << r.out << r.err;
  expect_consistent(r.result, 12, 8);
  const json& j = r.result;
  EXPECT_EQ(j["backend"], "openai");
  EXPECT_EQ(j["endpoint"], "/v1/completions");
  EXPECT_EQ(j["model_id"], "tiny");  // the first id of GET /v1/models
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["spec_decoding"].is_null());
  // Prompts are sized through the server's /tokenize: each is 24 tokens as the server counts them.
  for (const auto& len : j["input_lens"]) EXPECT_EQ(len, 24);
  // vLLM's block on stdout, the progress bar on stderr.
  EXPECT_NE(r.out.find("============ Serving Benchmark Result ============"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Successful requests:                     12"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Total generated tokens:                  96"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("P99 TTFT (ms):"), std::string::npos);
  EXPECT_NE(r.out.find("Mean TPOT (ms):"), std::string::npos);
  EXPECT_NE(r.out.find("Median ITL (ms):"), std::string::npos);
  EXPECT_EQ(r.out.find("Speculative Decoding"), std::string::npos);
  EXPECT_NE(r.err.find("12/12"), std::string::npos) << r.err;
}

TEST_F(BenchServeCli, ChatAtAFiniteRateHoldsTheConcurrencyLimit) {
  const BenchRun r = bench_serve(target() +
                            " --backend openai-chat --num-prompts 12 --random-input-len 16 --random-output-len 6 "
                            "--request-rate 40 --burstiness 0.5 --max-concurrency 3 --disable-tqdm "
                            "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90 "
                            "--goodput ttft:60000 e2el:60000");
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(r.result.is_object()) << r.out << r.err;
  expect_consistent(r.result, 12, 6);
  const json& j = r.result;
  EXPECT_EQ(j["endpoint"], "/v1/chat/completions");
  EXPECT_EQ(j["max_concurrency"], 3);
  EXPECT_EQ(j["request_rate"], 40.0);
  EXPECT_TRUE(j.contains("p90_e2el_ms"));
  EXPECT_FALSE(j.contains("p99_ttft_ms"));
  // Every request meets SLOs of a minute: goodput is the request throughput.
  EXPECT_NEAR(j["request_goodput"].get<double>(), j["request_throughput"].get<double>(), 1e-9);
  // No instant has more than 3 requests in flight; arrivals are spread over time.
  const auto& starts = j["start_times"];
  const auto& e2els = j["e2els"];
  double last_start = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    const double t = starts[i];
    last_start = std::max(last_start, t);
    int in_flight = 0;
    for (size_t k = 0; k < starts.size(); ++k) {
      const double s = starts[k], e = s + e2els[k].get<double>();
      in_flight += s <= t && t < e;
    }
    EXPECT_LE(in_flight, 3) << "at request " << i;
  }
  EXPECT_GT(last_start, 0.0);
  EXPECT_NE(r.out.find("Maximum request concurrency:             3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Request goodput (req/s):"), std::string::npos);
  EXPECT_NE(r.out.find("P90 E2EL (ms):"), std::string::npos);
  EXPECT_TRUE(r.err.find("12/12") == std::string::npos) << "--disable-tqdm";
}

TEST_F(BenchServeCli, JsonlPromptsUseTheirOutputLengths) {
  const fs::path data = temp_path("data.jsonl");
  {
    std::ofstream f(data);
    f << "{\"prompt\": \"def fib(n):\", \"output_len\": 3}\n\n{\"prompt\": \"import os\\nimport sys\"}\n";
  }
  const BenchRun r = bench_serve(target() + " --dataset-name custom --dataset-path " + quote(data.string()) +
                            " --num-prompts 5 --custom-output-len 7 --ignore-eos --disable-tqdm");
  fs::remove(data);
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(r.result.is_object()) << r.out << r.err;
  const json& j = r.result;
  EXPECT_EQ(j["completed"], 5);
  // Lines are reused in order: 3, 7, 3, 7, 3 tokens.
  EXPECT_EQ(j["output_lens"], json({3, 7, 3, 7, 3}));
  EXPECT_EQ(j["total_output_tokens"], 23);
}

TEST_F(BenchServeCli, RefusedRequestsAreCountedAsFailedWithTheFirstError) {
  const BenchRun r = bench_serve(target() + " --model no-such-model --num-prompts 3 --random-input-len 8 "
                                       "--random-output-len 4 --disable-tqdm");
  EXPECT_EQ(r.rc, 1) << "no request succeeded";
  ASSERT_TRUE(r.result.is_object()) << r.out << r.err;
  EXPECT_EQ(r.result["completed"], 0);
  EXPECT_EQ(r.result["failed"], 3);
  EXPECT_NE(r.err.find("3 of 3 requests failed; the first error: HTTP 404: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no-such-model"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("Failed requests:                         3"), std::string::npos) << r.out;
}

TEST(BenchServeCliNoServer, AnUnreachableServerIsOneClearLine) {
  if (!binary()) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  const int port = free_port();
  const BenchRun r = bench_serve("--port " + std::to_string(port) + " --num-prompts 2", /*save=*/false);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "error: cannot reach the server at http://127.0.0.1:" + std::to_string(port) +
                       "/v1/models: connection refused or host unreachable\n");
  const BenchRun bad = bench_serve("--base-url ftp://x --num-prompts 2", false);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("--base-url ftp://x: the scheme must be http or https"), std::string::npos) << bad.err;
}

TEST(BenchServeCliSpeculative, AcceptanceIsTheMetricsDifferenceOverTheRun) {
  if (!binary()) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  const fs::path draft = testing::models_dir() / "specula-tiny-draft";
  Server server({"--speculative-config", "{\"method\":\"draft_model\",\"model\":\"" + draft.string() +
                                             "\",\"num_speculative_tokens\":3}"});
  ASSERT_TRUE(server.ready()) << server.log();
  const std::string before = server.metrics();
  const BenchRun r = bench_serve("--base-url http://127.0.0.1:" + std::to_string(server.port()) +
                            " --dataset-name text --dataset-path " +
                            quote((testing::source_dir() / "tools" / "train" / "main.py").string()) +
                            " --num-prompts 6 --random-input-len 32 --random-output-len 16 --max-concurrency 4 "
                            "--disable-tqdm");
  const std::string after = server.metrics();
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(r.result.is_object()) << r.out << r.err;
  expect_consistent(r.result, 6, 16);
  const json& s = r.result["spec_decoding"];
  ASSERT_TRUE(s.is_object()) << r.result.dump();
  auto delta = [&](const std::string& name) { return metric_sum(after, name) - metric_sum(before, name); };
  const double drafts = delta("vllm:spec_decode_num_drafts_total");
  const double drafted = delta("vllm:spec_decode_num_draft_tokens_total");
  const double accepted = delta("vllm:spec_decode_num_accepted_tokens_total");
  ASSERT_GT(drafts, 0);
  EXPECT_EQ(s["num_drafts"].get<double>(), drafts);
  EXPECT_EQ(s["draft_tokens"].get<double>(), drafted);
  EXPECT_EQ(s["accepted_tokens"].get<double>(), accepted);
  EXPECT_LE(drafted, 3 * drafts);
  EXPECT_LE(accepted, drafted);
  EXPECT_NEAR(s["acceptance_rate"].get<double>(), accepted / drafted, 1e-12);
  EXPECT_NEAR(s["acceptance_length"].get<double>(), 1 + accepted / drafts, 1e-12);
  ASSERT_EQ(s["per_position_acceptance"].size(), 3u);
  double sum = 0;
  for (const auto& p : s["per_position_acceptance"]) sum += p.get<double>();
  EXPECT_NEAR(sum, accepted / drafts, 1e-12);  // each accepted token is at one position
  EXPECT_NEAR(r.result["spec_decode_acceptance_rate"].get<double>(), 100 * accepted / drafted, 1e-9);
  EXPECT_NE(r.out.find("---------------Speculative Decoding---------------"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Acceptance length:"), std::string::npos);
  EXPECT_NE(r.out.find("  Position 2:"), std::string::npos);
}

}  // namespace
}  // namespace specula
