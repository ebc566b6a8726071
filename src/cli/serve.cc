// `specula serve [MODEL]`: loads the engine and serves the OpenAI API, with vLLM's flag names so
// that a vLLM command line works unchanged. SIGINT/SIGTERM shut down cleanly: stop accepting,
// abort what is in flight, join the engine, exit 0.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/logging.h"
#include "app/create_engine.h"
#include "app/model_path.h"
#include "cli/vllm_flags.h"
#include "engine/llm_engine.h"
#include "server/openai_server.h"
#include "server/tool_parser.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace specula::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultModelName = "specula-tiny";

// The embedded default model: beside the executable (an installed tree), above it (a build folder
// inside the source tree), then the source tree this binary was built from.
fs::path default_model_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    for (int up = 0; up < 3; ++up, dir = dir.parent_path()) {
      fs::path candidate = dir / "models" / kDefaultModelName;
      if (fs::exists(candidate / "config.json")) return candidate;
    }
  }
#ifdef SPECULA_DEFAULT_MODEL_DIR
  return SPECULA_DEFAULT_MODEL_DIR;
#else
  return fs::path("models") / kDefaultModelName;
#endif
}

// vLLM's --max-model-len accepts 4096, 4k (x1000), 4K (x1024), 1m, 1M.
int parse_max_model_len(const std::string& text) {
  if (text.empty()) return 0;
  int64_t mult = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'k': mult = 1000; digits.pop_back(); break;
    case 'K': mult = 1024; digits.pop_back(); break;
    case 'm': mult = 1000000; digits.pop_back(); break;
    case 'M': mult = 1024 * 1024; digits.pop_back(); break;
    default: break;
  }
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SPECULA_CHECK(used == digits.size() && v >= 0 && v * mult <= (1LL << 31) - 1,
                "--max-model-len {}: expected a token count such as 4096, 4k or 4K", text);
  return static_cast<int>(v * mult);
}

// A file path or the template text itself, as vLLM's --chat-template.
std::string read_chat_template_arg(const std::string& arg) {
  std::error_code ec;
  if (fs::is_regular_file(arg, ec)) {
    std::ifstream in(arg, std::ios::binary);
    SPECULA_CHECK(in.good(), "--chat-template {}: cannot read the file", arg);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  return arg;
}

// Many streams need many sockets: lift the soft descriptor limit to the hard one, as vLLM does.
void raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  rlim_t want = lim.rlim_max == RLIM_INFINITY ? 65535 : std::min<rlim_t>(lim.rlim_max, 65535);
  if (lim.rlim_cur < want) {
    lim.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) LOG_WARN("Could not raise the open file limit to {}", want);
  }
}

struct ServeArgs {
  std::string model;
  std::string model_flag;
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string max_model_len;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 0;
  std::string served_model_name;
  std::string api_key;
  std::string reasoning_parser;
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  std::string load_format = "auto";
  uint64_t seed = 0;
  std::string device = "auto";
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;
  bool enable_prefix_caching = true;
  std::string speculative_config;
  std::string tokenizer;
  int block_size = 16;
  std::string chat_template;
  int max_logprobs = 20;
  bool enable_prompt_tokens_details = false;
  bool disable_access_log = false;
  int num_gpu_blocks_override = 0;
  std::string generation_config = "auto";
  int shared_expert_fusion = -1;
  double shutdown_timeout = 5;  // seconds
  VllmFlags vllm;
};

// SIGINT/SIGTERM arrive on whatever thread the kernel picks (OpenBLAS starts its threads before
// main, so blocking the signals in main alone cannot steer them): the handler only writes the
// signal number to a pipe, and one thread reads the pipe and does the work.
int g_signal_pipe[2] = {-1, -1};
constexpr unsigned char kWakeUp = 0xFF;  // not a signal: main telling the signal thread to end

extern "C" void on_shutdown_signal(int sig) {
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t ignored = write(g_signal_pipe[1], &b, 1);  // async-signal-safe
  (void)ignored;
}

void install_signal_handlers() {
  SPECULA_CHECK(pipe2(g_signal_pipe, O_CLOEXEC) == 0, "cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_shutdown_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int run_serve(const ServeArgs& a, CLI::App* cmd) {
  install_signal_handlers();

  std::atomic<server::OpenAIServer*> live_server{nullptr};
  std::atomic<bool> finished{false};
  std::thread shutdown_thread;
  std::thread signal_thread([&] {
    int seen = 0;
    for (;;) {
      unsigned char byte = 0;
      ssize_t n = read(g_signal_pipe[0], &byte, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1 || byte == kWakeUp || finished.load()) return;
      int sig = byte;
      if (++seen > 1) {
        LOG_WARN("Second signal: exiting without waiting");
        std::_Exit(1);
      }
      server::OpenAIServer* srv = live_server.load();
      if (!srv) {
        LOG_INFO("Interrupted (signal {}) before the server started; exiting", sig);
        std::_Exit(0);
      }
      LOG_INFO("Shutting down (signal {}): no new requests; those in flight may finish within {} s "
               "(--shutdown-timeout), then end with 503", sig, a.shutdown_timeout);
      shutdown_thread = std::thread([srv] { srv->shutdown(); });
    }
  });
  auto stop_signal_thread = [&] {
    finished = true;
    unsigned char b = kWakeUp;
    ssize_t ignored = write(g_signal_pipe[1], &b, 1);
    (void)ignored;
    signal_thread.join();
    if (shutdown_thread.joinable()) shutdown_thread.join();
  };

  try {
    // The served name is the model argument as given (vLLM), the embedded default's name when
    // none is; Hub ids resolve from the local cache (app/model_path.h).
    std::string model = !a.model_flag.empty() ? a.model_flag : a.model;
    const std::string model_name = model.empty() ? kDefaultModelName : model;
    model = model.empty() ? default_model_dir().string() : resolve_model_path(model);

    LOG_INFO("specula API server version 0.1.0 (vLLM-compatible)");
    std::string non_default;
    for (const CLI::Option* opt : cmd->get_options()) {
      if (opt->count() == 0 || opt->get_name() == "--help") continue;
      std::string name = opt->get_name(false, true);
      while (!name.empty() && name.front() == '-') name.erase(0, 1);
      std::replace(name.begin(), name.end(), '-', '_');
      std::string value = name == "api_key" ? "'***'" : fmt::format("'{}'", fmt::join(opt->results(), ","));
      non_default += fmt::format("{}'{}': {}", non_default.empty() ? "" : ", ", name, value);
    }
    LOG_INFO("non-default args: {{'model': '{}'{}{}}}", model, non_default.empty() ? "" : ", ", non_default);

    raise_open_file_limit();

    EngineConfig cfg;
    cfg.model = model;
    cfg.tokenizer = a.tokenizer;
    cfg.load_format = a.load_format;
    cfg.device = a.device;
    cfg.seed = a.seed;
    cfg.max_model_len = parse_max_model_len(a.max_model_len);
    cfg.max_num_seqs = a.max_num_seqs;
    cfg.max_num_batched_tokens = a.max_num_batched_tokens;
    cfg.block_size = a.block_size;
    cfg.enable_prefix_caching = a.enable_prefix_caching;
    cfg.gpu_memory_utilization = a.gpu_memory_utilization;
    cfg.enforce_eager = a.enforce_eager;
    cfg.speculative_config = a.speculative_config;
    apply_vllm_flags(a.vllm, cfg);
    cfg.shared_expert_fusion = a.shared_expert_fusion;
    if (a.num_gpu_blocks_override > 0) cfg.num_gpu_blocks_override = a.num_gpu_blocks_override;
    // vLLM's CPU backend sizes its KV cache from this variable (GiB).
    if (const char* env = std::getenv("VLLM_CPU_KVCACHE_SPACE")) {
      double gib = std::atof(env);
      if (gib > 0) cfg.cpu_kv_cache_bytes = static_cast<size_t>(gib * (1ULL << 30));
    }

    std::unique_ptr<LLMEngine> engine = create_engine(cfg);
    engine->start();

    std::unique_ptr<ChatTemplate> chat_template;
    std::string template_source =
        a.chat_template.empty() ? engine->tokenizer().chat_template() : read_chat_template_arg(a.chat_template);
    if (template_source.empty()) {
      LOG_WARN("The tokenizer has no chat template: /v1/chat/completions will answer 400 (see --chat-template)");
    } else {
      try {
        chat_template = ChatTemplate::compile(template_source);
      } catch (const Error& e) {
        LOG_WARN("The chat template cannot be used ({}): /v1/chat/completions will answer 400", e.what());
      }
    }

    server::ServerOptions opts;
    opts.host = a.host;
    opts.port = a.port;
    opts.served_model_name = a.served_model_name.empty() ? model_name : a.served_model_name;
    opts.model_root = model;
    opts.api_key = a.api_key;
    if (opts.api_key.empty()) {
      if (const char* env = std::getenv("VLLM_API_KEY")) opts.api_key = env;
    }
    opts.reasoning_parser = a.reasoning_parser;
    opts.enable_auto_tool_choice = a.enable_auto_tool_choice;
    opts.tool_call_parser = a.tool_call_parser;
    opts.enable_prompt_tokens_details = a.enable_prompt_tokens_details;
    opts.access_log = !a.disable_access_log;
    opts.defaults.max_logprobs = a.max_logprobs;
    opts.shutdown_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.shutdown_timeout * 1000));
    if (a.generation_config == "auto") {
      opts.defaults.generation = engine->generation_config();
      const GenerationConfig& g = opts.defaults.generation;
      std::vector<std::string> overrides;
      if (g.temperature) overrides.push_back(fmt::format("'temperature': {}", *g.temperature));
      if (g.top_p) overrides.push_back(fmt::format("'top_p': {}", *g.top_p));
      if (g.top_k) overrides.push_back(fmt::format("'top_k': {}", *g.top_k));
      if (g.min_p) overrides.push_back(fmt::format("'min_p': {}", *g.min_p));
      if (g.repetition_penalty) overrides.push_back(fmt::format("'repetition_penalty': {}", *g.repetition_penalty));
      if (g.max_new_tokens) overrides.push_back(fmt::format("'max_tokens': {}", *g.max_new_tokens));
      if (!overrides.empty()) {
        LOG_INFO("Default sampling parameters have been overridden by the model's Hugging Face generation config "
                 "recommended from the model creator. If this is not intended, please relaunch vLLM instance with "
                 "`--generation-config vllm`. {{{}}}", fmt::join(overrides, ", "));
      }
    }

    server::OpenAIServer srv(*engine, chat_template.get(), opts);
    int port = srv.bind();
    LOG_INFO("Starting vLLM-compatible API server on http://{}:{}", a.host, port);
    LOG_INFO("Available routes are:");
    for (const auto& [path, method] : server::OpenAIServer::routes()) {
      LOG_INFO("Route: {}, Methods: {}", path, method);
    }
    LOG_INFO("Serving model '{}' (max_model_len {})", opts.served_model_name, engine->max_model_len());
    LOG_INFO("Application startup complete.");
    live_server = &srv;
    srv.serve();
    live_server = nullptr;
    stop_signal_thread();
    LOG_INFO("HTTP server stopped; shutting down the engine");
    engine->shutdown();
    LOG_INFO("Shutdown complete.");
    if (srv.abandoned_connections() > 0) {
      // Their threads still run inside the server (a client trickling its headers): destroying it
      // under them could crash the exit, and waiting for them is what a slow client wants.
      spdlog::default_logger()->flush();
      std::fflush(nullptr);
      std::_Exit(0);
    }
    return 0;
  } catch (...) {
    stop_signal_thread();
    throw;
  }
}

}  // namespace

Runner add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand("serve", "Serve a model with the OpenAI-compatible API (vLLM's flags)");
  cmd->add_option("model", args->model, "Model folder (HF format); default: the embedded models/specula-tiny");
  cmd->add_option("--model", args->model_flag, "Same as the positional MODEL");
  cmd->add_option("--host", args->host, "Host name to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "Port to listen on")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--max-model-len", args->max_model_len,
                  "Model context length (prompt + output); e.g. 4096, 4k, 4K. Default: from config.json");
  cmd->add_option("--max-num-seqs", args->max_num_seqs, "Maximum number of sequences per iteration")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", args->max_num_batched_tokens,
                  "Maximum number of tokens per iteration (default: chosen from max-model-len)");
  cmd->add_option("--served-model-name", args->served_model_name,
                  "Model name used in the API (default: the model argument as given)");
  cmd->add_option("--api-key", args->api_key, "Require this key as 'Authorization: Bearer <key>' (or VLLM_API_KEY)");
  cmd->add_option("--reasoning-parser", args->reasoning_parser, "Split reasoning_content from content")
      ->check(CLI::IsMember({"deepseek_r1", "qwen3"}));
  // vLLM refuses the first without the second at startup; CLI11's needs() says so at parse time.
  auto* tool_parser = cmd->add_option("--tool-call-parser", args->tool_call_parser,
                                      fmt::format("The format the model writes tool calls in: {}",
                                                  fmt::join(server::ToolParser::names(), ", ")))
                          ->check(CLI::IsMember(server::ToolParser::names()));
  cmd->add_flag("--enable-auto-tool-choice", args->enable_auto_tool_choice,
                "Let the model call tools on its own (tool_choice \"auto\", the default with tools)")
      ->needs(tool_parser);
  cmd->add_option("--load-format", args->load_format, "Weights: auto (safetensors) or dummy (random)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  cmd->add_option("--seed", args->seed, "Random seed")->capture_default_str();
  cmd->add_option("--device", args->device, "Device")->capture_default_str()->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  cmd->add_option("--gpu-memory-utilization", args->gpu_memory_utilization,
                  "Fraction of GPU memory for the model and KV cache")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--enforce-eager", args->enforce_eager, "Never use CUDA graphs");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", args->enable_prefix_caching,
                "Prefix caching (on by default)");
  cmd->add_option("--speculative-config", args->speculative_config,
                  "Speculative decoding as JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'");
  cmd->add_option("--shared-expert-fusion", args->shared_expert_fusion, kSharedExpertFusionHelp)
      ->capture_default_str()->check(CLI::Range(-1, 64));
  cmd->add_option("--tokenizer", args->tokenizer, "Tokenizer folder (default: the model's)");
  cmd->add_option("--block-size", args->block_size, "KV cache block size in tokens")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--chat-template", args->chat_template, "Chat template file, or the template itself");
  cmd->add_option("--max-logprobs", args->max_logprobs, "Most logprobs a request may ask for")->capture_default_str();
  cmd->add_option("--shutdown-timeout", args->shutdown_timeout,
                  "Seconds that requests in flight may take to finish on SIGTERM/SIGINT before they end with 503")
      ->capture_default_str();
  cmd->add_flag("--enable-prompt-tokens-details", args->enable_prompt_tokens_details,
                "Report usage.prompt_tokens_details.cached_tokens");
  cmd->add_flag("--disable-uvicorn-access-log", args->disable_access_log, "No access log line per request");
  cmd->add_option("--num-gpu-blocks-override", args->num_gpu_blocks_override, "Use this many KV cache blocks");
  add_vllm_flags(cmd, args->vllm);
  cmd->add_option("--generation-config", args->generation_config,
                  "auto: sampling defaults from generation_config.json; vllm: OpenAI defaults")
      ->capture_default_str()->check(CLI::IsMember({"auto", "vllm"}));
  return [args, cmd]() -> int { return run_serve(*args, cmd); };
}

}  // namespace specula::cli
