// One streamed request of `specula bench serve` and what its client saw: vLLM's
// async_request_openai_completions / _chat_completions behaviour. The request asks for a stream
// with stream_options.include_usage; TTFT is the time to the first chunk that carries generated
// text (chat's leading role-only chunk does not count), ITL every gap between such chunks after
// it, E2EL the time to the end of the stream, and the output token count the final chunk's
// usage.completion_tokens (the number of text chunks when the server sends no usage).
#pragma once

#include <string>
#include <vector>

#include "cli/bench_serve_dataset.h"
#include "cli/http_client.h"

namespace specula::cli {

struct RequestSettings {
  std::string backend = "openai";  // openai (/v1/completions) | openai-chat (/v1/chat/completions)
  std::string endpoint;
  std::string model;
  double temperature = 0.0;
  double top_p = -1;  // < 0: not sent
  int top_k = -1;     // < 0: not sent
};

struct RequestOutcome {
  bool success = false;
  double start = 0;    // seconds from the benchmark's start to sending
  double ttft = 0;     // seconds
  double latency = 0;  // E2EL, seconds
  std::vector<double> itl;  // seconds
  int prompt_len = 0;
  int output_tokens = 0;
  std::string generated_text;
  std::string error;
};

// The JSON body of `req` for the settings' backend.
std::string request_body(const RequestSettings& s, const BenchRequest& req);

RequestOutcome send_request(HttpClient& client, const RequestSettings& s, const BenchRequest& req);

}  // namespace specula::cli
