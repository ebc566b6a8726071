// `specula bench latency|throughput MODEL ...`: vLLM's benchmark_latency / benchmark_throughput,
// run through the same LLMEngine as `specula serve` (queue, scheduler, streams, detokenisation
// when there is a tokenizer), on random token-id prompts or windows of a text file (--dataset).
// Flags carry vLLM's names. With --speculative-config both report the acceptance of the
// measured requests (rate, mean acceptance length, per position, mean adaptive depth).
//
//   latency:    --batch-size B requests of --input-len I tokens, --output-len O tokens each
//               (ignore_eos), --num-iters-warmup W then --num-iters N batches: TTFT and TPOT
//               (per request, (e2e - TTFT) / (O - 1)) median and p90, batch latency, tokens/s.
//   throughput: --num-prompts N such requests submitted at once: requests/s, output tokens/s.
// Both print a short table and, with --output-json FILE, write the figures as JSON.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/bench_driver.h"
#include "cli/bench_serve.h"
#include "cli/commands.h"
#include "cli/vllm_flags.h"
#include "core/error.h"
#include "core/logging.h"
#include "app/create_engine.h"
#include "engine/llm_engine.h"
#include "server/structured_output_fields.h"

namespace specula::cli {
namespace {

namespace fs = std::filesystem;

struct BenchArgs {
  EngineConfig engine;
  VllmFlags vllm;
  int input_len = 32;
  int output_len = 128;
  int batch_size = 8;
  int num_iters = 30;
  int num_iters_warmup = 10;
  int num_prompts = 1000;
  std::string output_json;
  std::string dataset;
  float temperature = 1.0f;
  bool skip_tokenizer_init = false;
  int num_gpu_blocks_override = 0;
  // vLLM's structured_outputs request field as JSON ({"json": SCHEMA}, {"regex": ...}, ...):
  // every request carries the constraint (structured-output overhead).
  std::string structured_outputs;
};

void add_engine_flags(CLI::App* cmd, BenchArgs& a) {
  cmd->add_option("model", a.engine.model, "model folder (config.json; weights unless --load-format dummy)")
      ->required();
  cmd->add_option("--input-len", a.input_len, "prompt tokens per request")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", a.output_len, "output tokens per request")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--output-json", a.output_json, "write the results as JSON to this file");
  cmd->add_option("--dataset", a.dataset, "plain-text file: prompts are windows of its tokens (default: random ids)");
  cmd->add_option("--temperature", a.temperature, "sampling temperature of the requests (0: greedy)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", a.engine.device, "auto | cuda | cpu")->capture_default_str()
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  cmd->add_option("--load-format", a.engine.load_format, "auto | safetensors | dummy")->capture_default_str()
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  cmd->add_option("--tokenizer", a.engine.tokenizer, "tokenizer folder (default: the model's, else none)");
  cmd->add_flag("--skip-tokenizer-init", a.skip_tokenizer_init, "run without a tokenizer (outputs are ids only)");
  cmd->add_option("--seed", a.engine.seed, "seed of the prompts and the dummy weights")->capture_default_str();
  cmd->add_option("--max-model-len", a.engine.max_model_len, "context length (default: the model's)");
  cmd->add_option("--max-num-seqs", a.engine.max_num_seqs, "sequences per step")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", a.engine.max_num_batched_tokens, "tokens per step");
  cmd->add_option("--gpu-memory-utilization", a.engine.gpu_memory_utilization, "fraction of GPU memory to use")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--enforce-eager", a.engine.enforce_eager, "no CUDA graphs");
  cmd->add_option("--block-size", a.engine.block_size, "KV cache block size")->capture_default_str();
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", a.engine.enable_prefix_caching,
                "prefix caching (on by default)");
  cmd->add_option("--num-gpu-blocks-override", a.num_gpu_blocks_override, "use this many KV cache blocks");
  cmd->add_option("--speculative-config", a.engine.speculative_config, "speculative decoding as JSON");
  cmd->add_option("--structured-outputs", a.structured_outputs,
                  "constrain every request: vLLM's structured_outputs field as JSON, e.g. '{\"json\": {...}}'");
  cmd->add_option("--shared-expert-fusion", a.engine.shared_expert_fusion, kSharedExpertFusionHelp)
      ->capture_default_str()->check(CLI::Range(-1, 64));
  add_vllm_flags(cmd, a.vllm);
}

std::unique_ptr<LLMEngine> make_engine(BenchArgs& a) {
  EngineConfig& cfg = a.engine;
  apply_vllm_flags(a.vllm, cfg);
  if (a.num_gpu_blocks_override > 0) cfg.num_gpu_blocks_override = a.num_gpu_blocks_override;
  const fs::path tok_dir = cfg.tokenizer.empty() ? fs::path(cfg.model) : fs::path(cfg.tokenizer);
  cfg.skip_tokenizer_init = a.skip_tokenizer_init || !fs::exists(tok_dir / "tokenizer.json");
  if (cfg.skip_tokenizer_init && !a.skip_tokenizer_init)
    LOG_INFO("No tokenizer.json in {}: benchmarking without a tokenizer (no detokenisation)", tok_dir.string());
  return create_engine(cfg);
}

// vLLM's benchmark requests: temperature 1 (--temperature), top_p 1, ignore_eos, exactly
// output_len tokens.
// With --structured-outputs the grammar may end before output_len: then only eos is allowed and,
// eos ignored, the request goes on sampling it, masks and all.
SamplingParams bench_params(const BenchArgs& a) {
  SamplingParams p;
  p.temperature = a.temperature;
  p.top_p = 1.0f;
  p.ignore_eos = true;
  p.max_tokens = a.output_len;
  if (!a.structured_outputs.empty()) {
    nlohmann::ordered_json body;
    try {
      body["structured_outputs"] = nlohmann::ordered_json::parse(a.structured_outputs);
      p.structured_outputs = server::parse_structured_output_fields(body).constraint;
    } catch (const std::exception& e) {
      throw Error(fmt::format("--structured-outputs: {}", e.what()));
    }
    SPECULA_CHECK(p.structured_outputs.has_value(), "--structured-outputs: no constraint in {}", a.structured_outputs);
  }
  return p;
}

void check_fits(const LLMEngine& engine, const BenchArgs& a) {
  SPECULA_CHECK(a.input_len + a.output_len <= engine.max_model_len(),
                "--input-len {} + --output-len {} exceed max_model_len {}", a.input_len, a.output_len,
                engine.max_model_len());
}

std::vector<std::vector<int32_t>> make_prompts(LLMEngine& engine, const BenchArgs& a, int count, uint64_t seed) {
  if (a.dataset.empty()) return random_prompts(count, a.input_len, engine.model_config().vocab_size, seed);
  SPECULA_CHECK(!a.engine.skip_tokenizer_init, "--dataset needs a tokenizer (the model's tokenizer.json or --tokenizer)");
  return text_prompts(engine.tokenizer(), a.dataset, count, a.input_len, seed);
}

// Speculative decoding over the measured requests (counter differences), as vLLM's SpecDecoding
// line reports it; null when speculation is off.
nlohmann::json spec_summary(const EngineMetrics& before, const EngineMetrics& after) {
  if (after.spec_num_speculative_tokens <= 0) return nullptr;
  const double drafts = static_cast<double>(after.spec_num_drafts - before.spec_num_drafts);
  const double drafted = static_cast<double>(after.spec_num_draft_tokens - before.spec_num_draft_tokens);
  const double accepted = static_cast<double>(after.spec_num_accepted_tokens - before.spec_num_accepted_tokens);
  const double steps = static_cast<double>(after.spec_depth_steps - before.spec_depth_steps);
  nlohmann::json j;
  j["num_speculative_tokens"] = after.spec_num_speculative_tokens;
  j["adaptive"] = after.spec_adaptive;
  j["drafts"] = drafts;
  j["draft_tokens"] = drafted;
  j["accepted_tokens"] = accepted;
  j["acceptance_rate"] = drafted > 0 ? accepted / drafted : 0.0;
  j["mean_acceptance_length"] = drafts > 0 ? 1.0 + accepted / drafts : 0.0;
  j["mean_depth"] = steps > 0 ? static_cast<double>(after.spec_depth_sum - before.spec_depth_sum) / steps : 0.0;
  j["steps_launched_ahead"] = after.spec_steps_launched_ahead - before.spec_steps_launched_ahead;
  std::vector<double> per_pos;
  for (size_t i = 0; i < after.spec_accepted_per_pos.size(); ++i) {
    const int64_t b = i < before.spec_accepted_per_pos.size() ? before.spec_accepted_per_pos[i] : 0;
    per_pos.push_back(drafts > 0 ? static_cast<double>(after.spec_accepted_per_pos[i] - b) / drafts : 0.0);
  }
  j["per_position_acceptance"] = per_pos;
  return j;
}

void print_spec_summary(const nlohmann::json& s) {
  if (s.is_null()) return;
  std::string per_pos;
  for (const auto& v : s["per_position_acceptance"]) per_pos += fmt::format("{}{:.3f}", per_pos.empty() ? "" : ", ", v.get<double>());
  std::printf("Speculative decoding: acceptance rate %.1f%%, mean acceptance length %.2f, drafted %.0f, accepted %.0f, "
              "mean depth %.2f (%s, k=%d), per-position acceptance: %s\n",
              100.0 * s["acceptance_rate"].get<double>(), s["mean_acceptance_length"].get<double>(),
              s["draft_tokens"].get<double>(), s["accepted_tokens"].get<double>(), s["mean_depth"].get<double>(),
              s["adaptive"].get<bool>() ? "adaptive" : "pinned", s["num_speculative_tokens"].get<int>(), per_pos.c_str());
}

void write_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::ofstream out(path);
  SPECULA_CHECK(out.good(), "--output-json {}: cannot write the file", path);
  out << j.dump(2) << "\n";
}

std::vector<double> ms(const std::vector<double>& seconds) {
  std::vector<double> out;
  for (double s : seconds) out.push_back(s * 1000.0);
  return out;
}

int run_latency(BenchArgs& a) {
  auto engine = make_engine(a);
  check_fits(*engine, a);
  engine->start();
  const SamplingParams params = bench_params(a);
  std::vector<double> latencies, ttfts, tpots, e2es;
  EngineMetrics before;
  int64_t output_tokens = 0;
  for (int iter = 0; iter < a.num_iters_warmup + a.num_iters; ++iter) {
    const bool warmup = iter < a.num_iters_warmup;
    auto prompts = make_prompts(*engine, a, a.batch_size, a.engine.seed * 1000003 + iter);
    if (iter == a.num_iters_warmup) before = engine->metrics();
    BatchTiming b = run_batch(*engine, prompts, params, fmt::format("lat-{}-", iter));
    if (warmup) continue;
    latencies.push_back(b.seconds);
    for (const RequestTiming& r : b.requests) {
      ttfts.push_back(r.ttft);
      e2es.push_back(r.e2e);
      if (r.output_tokens > 1) tpots.push_back(r.tpot());
      output_tokens += r.output_tokens;
    }
  }
  const nlohmann::json spec = spec_summary(before, engine->metrics());
  const bool async = engine->async_scheduling();
  engine->shutdown();
  const double total = std::accumulate(latencies.begin(), latencies.end(), 0.0);
  const double avg = latencies.empty() ? 0.0 : total / static_cast<double>(latencies.size());
  const double tok_s = total > 0 ? static_cast<double>(output_tokens) / total : 0.0;
  const std::vector<double> ttft_ms = ms(ttfts), tpot_ms = ms(tpots);
  const std::string tp = a.engine.tensor_parallel_size > 1
                             ? fmt::format(", -tp {}{}", a.engine.tensor_parallel_size,
                                           a.engine.custom_all_reduce ? "" : ", NCCL all-reduce only")
                             : "";
  std::printf("\n== specula bench latency: %s, batch %d, input %d, output %d, %d iterations (%d warm-up)%s%s%s\n",
              a.engine.model.c_str(), a.batch_size, a.input_len, a.output_len, a.num_iters, a.num_iters_warmup,
              a.engine.enforce_eager ? ", eager" : "", async ? ", async scheduling" : "",
              tp.c_str());
  // The spread, not only the median: which prompts a run draws moves the median (PERFORMANCE.md).
  std::printf("%-28s %12s %12s %12s\n", "metric", "p10", "median", "p90");
  std::printf("%-28s %12.2f %12.2f %12.2f\n", "TTFT (ms)", percentile(ttft_ms, 10), percentile(ttft_ms, 50),
              percentile(ttft_ms, 90));
  std::printf("%-28s %12.3f %12.3f %12.3f\n", "TPOT (ms)", percentile(tpot_ms, 10), percentile(tpot_ms, 50),
              percentile(tpot_ms, 90));
  std::printf("%-28s %12.2f %12.2f %12.2f\n", "batch latency (ms)", percentile(ms(latencies), 10),
              percentile(ms(latencies), 50), percentile(ms(latencies), 90));
  std::printf("%-28s %12.1f\n", "output tokens/s", tok_s);
  std::printf("Avg latency: %.6f seconds\n", avg);
  print_spec_summary(spec);
  std::fflush(stdout);

  nlohmann::json j;
  j["model"] = a.engine.model;
  j["batch_size"] = a.batch_size;
  j["input_len"] = a.input_len;
  j["output_len"] = a.output_len;
  j["num_iters"] = a.num_iters;
  j["enforce_eager"] = a.engine.enforce_eager;
  j["tensor_parallel_size"] = a.engine.tensor_parallel_size;
  j["custom_all_reduce"] = a.engine.custom_all_reduce;
  j["async_scheduling"] = async;
  j["quantization"] = a.engine.quantization;
  j["kv_cache_dtype"] = a.engine.kv_cache_dtype;
  if (!a.structured_outputs.empty()) j["structured_outputs"] = nlohmann::json::parse(a.structured_outputs);
  j["speculative_config"] = a.engine.speculative_config;
  j["temperature"] = a.temperature;
  j["dataset"] = a.dataset;
  j["spec_decoding"] = spec;
  j["avg_latency"] = avg;
  j["latencies"] = latencies;
  nlohmann::json pct;
  for (int q : {10, 25, 50, 75, 90, 99}) pct[std::to_string(q)] = percentile(latencies, q);
  j["percentiles"] = pct;
  j["ttft_ms"] = {{"p10", percentile(ttft_ms, 10)}, {"median", percentile(ttft_ms, 50)}, {"p90", percentile(ttft_ms, 90)}};
  j["tpot_ms"] = {{"p10", percentile(tpot_ms, 10)}, {"median", percentile(tpot_ms, 50)}, {"p90", percentile(tpot_ms, 90)}};
  j["output_tokens_per_second"] = tok_s;
  j["requests"] = {{"ttft_ms", ttft_ms}, {"e2e_ms", ms(e2es)}};  // per request, batch after batch
  write_json(a.output_json, j);
  return 0;
}

int run_throughput(BenchArgs& a) {
  auto engine = make_engine(a);
  check_fits(*engine, a);
  engine->start();
  auto prompts = make_prompts(*engine, a, a.num_prompts, a.engine.seed * 1000003 + 7);
  const EngineMetrics before = engine->metrics();
  BatchTiming b = run_batch(*engine, prompts, bench_params(a), "thr-");
  const nlohmann::json spec = spec_summary(before, engine->metrics());
  engine->shutdown();
  int64_t out_tokens = 0, prompt_tokens = 0;
  for (const RequestTiming& r : b.requests) {
    out_tokens += r.output_tokens;
    prompt_tokens += r.prompt_tokens;
  }
  const double secs = b.seconds;
  const double req_s = secs > 0 ? a.num_prompts / secs : 0.0;
  const double out_s = secs > 0 ? static_cast<double>(out_tokens) / secs : 0.0;
  const double tot_s = secs > 0 ? static_cast<double>(out_tokens + prompt_tokens) / secs : 0.0;
  std::printf("\n== specula bench throughput: %s, %d prompts, input %d, output %d\n", a.engine.model.c_str(),
              a.num_prompts, a.input_len, a.output_len);
  std::printf("%-28s %12.3f\n", "elapsed (s)", secs);
  std::printf("%-28s %12.2f\n", "requests/s", req_s);
  std::printf("%-28s %12.1f\n", "output tokens/s", out_s);
  std::printf("%-28s %12.1f\n", "total tokens/s", tot_s);
  std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n", req_s, tot_s, out_s);
  print_spec_summary(spec);
  std::fflush(stdout);

  nlohmann::json j;
  j["model"] = a.engine.model;
  j["num_prompts"] = a.num_prompts;
  j["input_len"] = a.input_len;
  j["output_len"] = a.output_len;
  j["elapsed_time"] = secs;
  j["num_requests"] = a.num_prompts;
  j["total_num_tokens"] = out_tokens + prompt_tokens;
  j["total_output_tokens"] = out_tokens;
  j["requests_per_second"] = req_s;
  j["tokens_per_second"] = tot_s;
  j["output_tokens_per_second"] = out_s;
  j["temperature"] = a.temperature;
  j["dataset"] = a.dataset;
  j["spec_decoding"] = spec;
  write_json(a.output_json, j);
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand(
      "bench", "benchmark the engine (vLLM's benchmark_latency / benchmark_throughput) or a running server (serve)");
  bench->require_subcommand(1);
  auto lat = std::make_shared<BenchArgs>();
  auto* latency = bench->add_subcommand("latency", "TTFT and TPOT of a batch of requests, repeated");
  add_engine_flags(latency, *lat);
  latency->add_option("--batch-size", lat->batch_size, "requests per batch")->capture_default_str()
      ->check(CLI::PositiveNumber);
  latency->add_option("--num-iters", lat->num_iters, "measured batches")->capture_default_str()
      ->check(CLI::PositiveNumber);
  latency->add_option("--num-iters-warmup", lat->num_iters_warmup, "batches run first, not measured")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  auto thr = std::make_shared<BenchArgs>();
  auto* throughput = bench->add_subcommand("throughput", "requests/s and tokens/s of many requests at once");
  add_engine_flags(throughput, *thr);
  throughput->add_option("--num-prompts", thr->num_prompts, "requests")->capture_default_str()
      ->check(CLI::PositiveNumber);
  Runner serve = add_bench_serve_command(*bench);
  return [bench, latency, lat, thr, serve]() -> int {
    if (bench->got_subcommand("serve")) return serve();
    if (bench->got_subcommand(latency)) return run_latency(*lat);
    return run_throughput(*thr);
  };
}

}  // namespace specula::cli
