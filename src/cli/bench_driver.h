// Drives an LLMEngine the way `specula serve` does (add_request, streams), for the benchmarks:
// submits a batch of token-id prompts at once and timestamps each request's first token and its
// end, as a client of the engine sees them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/llm_engine.h"
#include "tokenizer/tokenizer.h"

namespace specula::cli {

struct RequestTiming {
  double ttft = 0;   // seconds from submission to the first output token
  double e2e = 0;    // seconds from submission to the final output
  int output_tokens = 0;
  int prompt_tokens = 0;
  // (e2e - ttft) / (output_tokens - 1), vLLM's TPOT; 0 for a single-token output.
  double tpot() const { return output_tokens > 1 ? (e2e - ttft) / (output_tokens - 1) : 0.0; }
};

struct BatchTiming {
  double seconds = 0;  // submission of the first request to the end of the last
  std::vector<RequestTiming> requests;
};

// `count` random prompts of input_len ids in [0, min(vocab, 10000)) (vLLM's dummy prompts),
// reproducible from seed.
std::vector<std::vector<int32_t>> random_prompts(int count, int input_len, int64_t vocab, uint64_t seed);

// `count` prompts of input_len ids cut from a text file (vLLM's --dataset, here plain text): the
// file is tokenized once and each prompt is a window starting at a seeded random token offset,
// so speculative decoding is measured on real text rather than random ids. Throws
// specula::Error when the file cannot be read or holds fewer than input_len tokens.
std::vector<std::vector<int32_t>> text_prompts(const Tokenizer& tokenizer, const std::string& path, int count,
                                               int input_len, uint64_t seed);

// Submits every prompt at once with `params` and waits for all of them. Throws specula::Error when
// a request fails.
BatchTiming run_batch(LLMEngine& engine, const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                      const std::string& id_prefix);

// np.percentile's default (linear interpolation between closest ranks); q in [0, 100].
double percentile(std::vector<double> values, double q);

}  // namespace specula::cli
