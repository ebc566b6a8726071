// The requests of `specula bench serve`, built on the client side of a running server:
//   random: prompts of about --random-input-len tokens made of random words. Token ids cannot be
//           sent as text, so when the server answers /tokenize each word's token count is asked
//           once and words are drawn until the prompt holds the drawn length (the prompt's own
//           count, special tokens included, is then taken from /tokenize); without /tokenize one
//           word stands for one token. --random-output-len tokens are asked (ignore_eos), lengths
//           drawn uniformly in [len * (1 - r), len * (1 + r)] (--random-range-ratio r).
//   jsonl:  (vLLM's "custom") one JSON object a line with "prompt" and optional "output_len"
//           (default --custom-output-len); lines are reused from the top when there are fewer
//           than --num-prompts.
//   text:   windows of a plain-text file at seeded random offsets, random's lengths (with
//           /tokenize and /detokenize the windows are cut on token boundaries; otherwise on words).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/http_client.h"

namespace specula::cli {

struct BenchRequest {
  std::string prompt;
  int prompt_len = 0;  // tokens (the server's count when it answers /tokenize, else an estimate)
  int output_len = 0;  // max_tokens
  bool ignore_eos = false;
};

struct DatasetArgs {
  std::string name = "random";  // random | jsonl | custom | text
  std::string path;
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0.0;
  int custom_output_len = 256;
  bool ignore_eos = false;  // forced on for random and text
  uint64_t seed = 0;
};

// Token counts through the server's /tokenize (nullopt when the server does not answer it).
class RemoteTokenizer {
 public:
  RemoteTokenizer(HttpClient& client, std::string model);
  bool available() const { return available_; }
  const std::string& probe_error() const { return probe_error_; }  // why not available
  std::optional<std::vector<int32_t>> encode(const std::string& text, bool add_special_tokens);
  std::optional<std::string> decode(const std::vector<int32_t>& ids);

 private:
  HttpClient& client_;
  std::string model_;
  bool available_ = false;
  std::string probe_error_;
};

// Throws specula::Error on a missing or malformed dataset file.
std::vector<BenchRequest> build_dataset(const DatasetArgs& args, RemoteTokenizer& tokenizer);

}  // namespace specula::cli
