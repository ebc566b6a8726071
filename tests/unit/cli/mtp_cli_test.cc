// The specula binary with MTP and --shared-expert-fusion: `specula generate` prints transformers'
// greedy continuation of specula-tiny-moe with deepseek_mtp drafts and the shared expert fused
// (the log names the fusion), rejects a replica count below -1, and both serve and generate list
// the flag. Runs where ctest sets SPECULA_BINARY.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "unit/app/mtp_test_util.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct CommandResult {
  int status = -1;
  std::string out;  // stdout and, where asked, stderr
};

CommandResult run(const std::string& cmd) {
  CommandResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, n);
  r.status = pclose(pipe);
  return r;
}

const char* binary() {
  const char* bin = std::getenv("SPECULA_BINARY");
  return bin && fs::exists(bin) ? bin : nullptr;
}

TEST(MtpCli, GenerateWithMtpAndSharedExpertFusion) {
  if (!binary()) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  ASSERT_TRUE(testing::have_moe()) << "committed specula-tiny-moe or its reference missing";
  const testing::GreedyReference ref = testing::read_greedy_reference(testing::moe_reference_file());
  const std::string prompt = ref.metadata["prompt_0_text"];
  auto tok = Tokenizer::from_dir(testing::moe_dir());
  const fs::path log = fs::temp_directory_path() / ("mtp_cli_" + std::to_string(::getpid()) + ".log");
  const std::string base = shell_quote(binary()) + " generate " + shell_quote(testing::moe_dir().string()) +
                           " --prompt " + shell_quote(prompt) + " --max-tokens " + std::to_string(ref.greedy[0].size()) +
                           " --temperature 0 --ignore-eos --device cpu --max-model-len 256";
  const CommandResult ok = run(base + R"( --speculative-config '{"method": "deepseek_mtp", "num_speculative_tokens": 2}')" +
                     " --shared-expert-fusion 1 2>" + shell_quote(log.string()));
  ASSERT_EQ(ok.status, 0);
  EXPECT_EQ(ok.out, tok->decode(ref.greedy[0]) + "\n");
  std::string err;
  {
    FILE* f = std::fopen(log.c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) err.append(buf, n);
    std::fclose(f);
    fs::remove(log);
  }
  EXPECT_NE(err.find("fused x1"), std::string::npos) << err;  // the target's MoE layers
  EXPECT_NE(err.find("Loaded 1 MTP layer"), std::string::npos) << err;
  EXPECT_NE(err.find("method mtp"), std::string::npos) << err;

  // The default (-1, auto) is off on the CPU: no fused layers.
  const CommandResult plain = run(base + " 2>&1");
  ASSERT_EQ(plain.status, 0);
  EXPECT_EQ(plain.out.find("fused x"), std::string::npos);

  const CommandResult bad = run(base + " --shared-expert-fusion -2 2>&1");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--shared-expert-fusion"), std::string::npos) << bad.out;
}

TEST(MtpCli, ServeAndGenerateListTheFlag) {
  if (!binary()) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  for (const char* cmd : {"serve", "generate"}) {
    const CommandResult help = run(shell_quote(binary()) + " " + cmd + " --help 2>&1");
    EXPECT_EQ(help.status, 0) << cmd;
    EXPECT_NE(help.out.find("--shared-expert-fusion"), std::string::npos) << cmd << ":\n" << help.out;
    EXPECT_NE(help.out.find("-1 = auto"), std::string::npos) << cmd;
  }
}

}  // namespace
}  // namespace specula
