#include "cli/bench_serve_request.h"

#include <chrono>

#include <nlohmann/json.hpp>

namespace specula::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The generated text a chunk carries (completions' text; chat's content and reasoning_content).
std::string chunk_text(const json& choice, bool chat) {
  std::string out;
  auto add = [&](const json& obj, const char* key) {
    auto it = obj.find(key);
    if (it != obj.end() && it->is_string()) out += it->get<std::string>();
  };
  if (!chat) {
    add(choice, "text");
  } else if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
    add(*d, "reasoning_content");
    add(*d, "reasoning");
    add(*d, "content");
  }
  return out;
}

}  // namespace

std::string request_body(const RequestSettings& s, const BenchRequest& req) {
  const bool chat = s.backend == "openai-chat";
  json body = {{"model", s.model}, {"temperature", s.temperature}, {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", req.prompt}}});
    body["max_completion_tokens"] = req.output_len;
  } else {
    body["prompt"] = req.prompt;
    body["max_tokens"] = req.output_len;
  }
  if (req.ignore_eos) body["ignore_eos"] = true;
  if (s.top_p >= 0) body["top_p"] = s.top_p;
  if (s.top_k >= 0) body["top_k"] = s.top_k;
  return body.dump();
}

RequestOutcome send_request(HttpClient& client, const RequestSettings& s, const BenchRequest& req) {
  const bool chat = s.backend == "openai-chat";
  RequestOutcome out;
  out.prompt_len = req.prompt_len;
  const std::string body = request_body(s, req);
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  bool first = false, done = false;
  int text_chunks = 0;
  int usage_tokens = -1;
  SseParser parser([&](std::string_view data) {
    if (!out.error.empty() || done) return;
    if (data == "[DONE]") {
      done = true;
      return;
    }
    const Clock::time_point now = Clock::now();
    json ev = json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (ev.is_discarded() || !ev.is_object()) {
      out.error = "not JSON in the stream: " + std::string(data.substr(0, 200));
      return;
    }
    if (auto e = ev.find("error"); e != ev.end()) {
      out.error = "error in the stream: " + e->dump();
      return;
    }
    if (auto u = ev.find("usage"); u != ev.end() && u->is_object()) {
      if (auto c = u->find("completion_tokens"); c != u->end() && c->is_number_integer()) usage_tokens = c->get<int>();
    }
    auto choices = ev.find("choices");
    if (choices == ev.end() || !choices->is_array() || choices->empty()) return;
    const std::string text = chunk_text((*choices)[0], chat);
    if (text.empty()) return;
    if (!first) {
      first = true;
      out.ttft = seconds(now - start);
    } else {
      out.itl.push_back(seconds(now - last));
    }
    last = now;
    ++text_chunks;
    out.generated_text += text;
  });
  HttpResult r = client.post_stream(s.endpoint, body, [&](std::string_view bytes) {
    parser.feed(bytes);
    return out.error.empty();
  });
  out.latency = seconds(Clock::now() - start);
  if (!out.error.empty()) return out;
  if (!r.ok()) {
    out.error = r.describe();
    return out;
  }
  if (!first) {
    out.error = "the stream carried no generated text (no TTFT)";
    return out;
  }
  if (!done) {
    out.error = "the stream ended without data: [DONE]";
    return out;
  }
  out.output_tokens = usage_tokens >= 0 ? usage_tokens : text_chunks;
  out.success = true;
  return out;
}

}  // namespace specula::cli
