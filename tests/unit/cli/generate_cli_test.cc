// `specula generate` end to end: the built binary (SPECULA_BINARY, set by ctest) on the embedded
// specula-tiny must print transformers' greedy continuation of a reference prompt.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

TEST(GenerateCli, PrintsTheGreedyContinuation) {
  const char* bin = std::getenv("SPECULA_BINARY");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  const fs::path model = testing::models_dir() / "specula-tiny";
  const fs::path ref_file = testing::fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors";
  ASSERT_TRUE(fs::exists(model / "config.json") && fs::exists(ref_file)) << "committed specula-tiny or its reference missing";

  std::ifstream in(ref_file, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  const std::string prompt = h["__metadata__"]["prompt_0_text"];
  const auto& g = h["greedy_0"];
  std::vector<int32_t> greedy((g["data_offsets"][1].get<uint64_t>() - g["data_offsets"][0].get<uint64_t>()) / 4);
  in.seekg(static_cast<std::streamoff>(8 + header_len + g["data_offsets"][0].get<uint64_t>()));
  in.read(reinterpret_cast<char*>(greedy.data()), static_cast<std::streamsize>(greedy.size() * 4));
  auto tok = Tokenizer::from_dir(model);

  const std::string cmd = shell_quote(bin) + " generate " + shell_quote(model.string()) + " --prompt " +
                          shell_quote(prompt) + " --max-tokens " + std::to_string(greedy.size()) +
                          " --temperature 0 --ignore-eos --device cpu --max-model-len 256 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << cmd;
  EXPECT_EQ(out, tok->decode(greedy) + "\n");
}

}  // namespace
}  // namespace specula
