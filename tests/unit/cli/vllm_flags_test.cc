// vLLM's everyday flags on the built binary (SPECULA_BINARY, set by ctest): each is accepted with
// its meaning or refused with one line saying why; an unknown flag names the nearest valid one; a
// Hub id resolves from the local Hugging Face cache and otherwise says where specula looked.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_paths.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int status = -1;
  std::string output;  // stdout and stderr
};

CliRun run_cli(const std::string& args, const std::string& env = "") {
  const char* bin = std::getenv("SPECULA_BINARY");
  CliRun r;
  const std::string cmd = env + " '" + std::string(bin) + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class VllmFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("SPECULA_BINARY");
    if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
    model_ = (testing::models_dir() / "specula-tiny").string();
    ASSERT_TRUE(fs::exists(fs::path(model_) / "config.json")) << "committed model missing: " << model_;
  }
  std::string generate(const std::string& flags) {
    return "generate '" + model_ + "' --prompt 'def f(x):' --max-tokens 4 --device cpu " + flags;
  }
  std::string model_;
};

// Absent, the flag leaves the choice to the engine, whose startup log names it and why (on the
// CPU: off by default); given either way, the log names the flag.
TEST_F(VllmFlags, AsyncSchedulingUnsetLeavesTheEnginesDefault) {
  CliRun unset = run_cli(generate(""));
  EXPECT_EQ(unset.status, 0) << unset.output;
  EXPECT_NE(unset.output.find("Async scheduling: off (default on the CPU"), std::string::npos) << unset.output;
  CliRun on = run_cli(generate("--async-scheduling"));
  EXPECT_EQ(on.status, 0) << on.output;
  EXPECT_NE(on.output.find("Async scheduling: on (--async-scheduling)"), std::string::npos) << on.output;
  CliRun off = run_cli(generate("--no-async-scheduling"));
  EXPECT_EQ(off.status, 0) << off.output;
  EXPECT_NE(off.output.find("Async scheduling: off (--no-async-scheduling)"), std::string::npos) << off.output;
}

TEST_F(VllmFlags, EverydayFlagsAreAcceptedWithTheirMeaning) {
  CliRun r = run_cli(generate("--dtype auto --dtype float32 --kv-cache-dtype auto -tp 1 --tensor-parallel-size 1 -pp 1 "
                       "--enable-chunked-prefill --no-enable-chunked-prefill --disable-log-stats "
                       "--disable-log-requests --trust-remote-code --disable-custom-all-reduce"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("4 generated tokens"), std::string::npos) << r.output;
}

// -tp 2 on the CPU: the model split over two ranks generates what the whole model does.
TEST_F(VllmFlags, TensorParallelSizeSplitsTheModel) {
  CliRun whole = run_cli(generate("--temperature 0 --disable-log-stats"));
  CliRun split = run_cli(generate("--temperature 0 --disable-log-stats -tp 2"));
  ASSERT_EQ(whole.status, 0) << whole.output;
  ASSERT_EQ(split.status, 0) << split.output;
  EXPECT_NE(split.output.find("split over 2 ranks"), std::string::npos) << split.output;
  // The continuation is the line before generate's closing "finish_reason=..." line.
  auto continuation = [](const std::string& out) {
    const size_t end = out.rfind("\nfinish_reason=");
    if (end == std::string::npos) return std::string("(no finish line)");
    const size_t begin = out.rfind('\n', end - 1);
    return out.substr(begin == std::string::npos ? 0 : begin + 1, end - (begin == std::string::npos ? 0 : begin + 1));
  };
  EXPECT_EQ(continuation(split.output), continuation(whole.output)) << split.output << "\n---\n" << whole.output;
}

TEST_F(VllmFlags, WhatCannotBeDoneIsRefusedInOneLine) {
  struct Case {
    const char* flags;
    const char* says;
  };
  for (const Case& c : {Case{"-tp 3", "num_attention_heads (8) is not divisible by 3"},
                        Case{"--pipeline-parallel-size 2", "pipeline parallelism is not supported"},
                        Case{"--dtype float16", "computes in F32"},
                        Case{"--kv-cache-dtype fp8_e5m2", "--kv-cache-dtype fp8_e5m2: not supported; the fp8 cache is e4m3"},
                        Case{"--no-enable-chunked-prefill --max-model-len 256 --max-num-batched-tokens 64 --max-num-seqs 8",
                             "is smaller than max_model_len"}}) {
    // serve: it has every engine flag, and fails before it would listen
    CliRun r = run_cli("serve '" + model_ + "' --device cpu --port 0 " + c.flags);
    EXPECT_EQ(r.status, 1) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.flags << "\n" << r.output;
  }
}

TEST_F(VllmFlags, AnUnknownFlagNamesTheNearestOne) {
  CliRun r = run_cli("serve --max-model-lenn 5");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unrecognized argument --max-model-lenn; did you mean --max-model-len?"), std::string::npos)
      << r.output;
  r = run_cli(generate("--dtyp bfloat16"));
  EXPECT_NE(r.output.find("did you mean --dtype?"), std::string::npos) << r.output;
}

// Both fail while parsing, before any weight loads, saying what is wrong.
TEST_F(VllmFlags, ToolCallFlagsAreCheckedAtStartup) {
  CliRun r = run_cli("serve '" + model_ + "' --device cpu --port 0 --tool-call-parser mistral");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("hermes"), std::string::npos) << r.output;  // the known ones are listed
  EXPECT_NE(r.output.find("deepseek_v3"), std::string::npos) << r.output;
  r = run_cli("serve '" + model_ + "' --device cpu --port 0 --enable-auto-tool-choice");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--enable-auto-tool-choice requires --tool-call-parser"), std::string::npos) << r.output;
}

TEST_F(VllmFlags, HubIdsResolveFromTheLocalCacheOnly) {
  const fs::path home = fs::temp_directory_path() / ("specula_hf_" + std::to_string(::getpid()));
  const fs::path repo = home / "hub" / "models--SomeOrg--Tiny";
  fs::create_directories(repo / "snapshots" / "rev1");
  fs::create_directories(repo / "refs");
  for (const auto& e : fs::directory_iterator(model_)) fs::copy(e.path(), repo / "snapshots" / "rev1" / e.path().filename());
  FILE* ref = std::fopen((repo / "refs" / "main").c_str(), "w");
  ASSERT_NE(ref, nullptr);
  std::fputs("rev1", ref);
  std::fclose(ref);
  const std::string env = "HF_HOME='" + home.string() + "' HF_HUB_CACHE=";
  CliRun ok = run_cli("generate SomeOrg/Tiny --prompt 'def f(x):' --max-tokens 4 --device cpu", env);
  EXPECT_EQ(ok.status, 0) << ok.output;
  CliRun missing = run_cli("generate SomeOrg/Missing --prompt x --max-tokens 1 --device cpu", env);
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.output.find("not in the local Hugging Face cache"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find((home / "hub" / "models--SomeOrg--Missing").string()), std::string::npos)
      << missing.output;
  EXPECT_NE(missing.output.find("does not download"), std::string::npos) << missing.output;
  fs::remove_all(home);
}

}  // namespace
}  // namespace specula
