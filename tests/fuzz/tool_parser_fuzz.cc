// libFuzzer target: model output text through every --tool-call-parser, whole and streamed.
//
// The first byte picks where the stream is cut (pieces of 1 + byte % 7 bytes); the rest is the
// text the model wrote. Each parser parses it whole (parse_all) and as a stream (feed per piece,
// then finish). When the output was well formed, the stream must add up to the whole text's
// result, content and calls alike (what tool_parser.h promises, and what clients rebuilding the
// calls from deltas rely on). Crashes, sanitizer reports, hangs and exceptions are bugs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "server/tool_parser.h"

namespace {

namespace server = specula::server;

struct Streamed {
  std::string content;
  std::vector<server::ToolCall> calls;
  bool consistent = true;  // each call's first piece names it, indices come in order

  void add(const server::ToolParseDelta& d) {
    content += d.content;
    for (const server::ToolCallDelta& c : d.calls) {
      if (c.index == static_cast<int>(calls.size()) && c.name) {
        calls.push_back({*c.name, ""});
      } else if (c.index != static_cast<int>(calls.size()) - 1 || c.name) {
        consistent = false;
        return;
      }
      calls.back().arguments += c.arguments;
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 7;
  const std::string text = specula::fuzz::as_string(data + 1, size - 1);
  for (const std::string& name : server::ToolParser::names()) {
    const server::ParsedToolOutput whole = server::ToolParser::create(name)->parse_all(text);
    auto parser = server::ToolParser::create(name);
    Streamed streamed;
    for (size_t at = 0; at < text.size(); at += piece) streamed.add(parser->feed(std::string_view(text).substr(at, piece)));
    streamed.add(parser->finish());
    if (!streamed.consistent) std::abort();  // a delta without its call's name, or out of order
    if (parser->malformed()) continue;       // a stream cannot take back what it sent
    bool same = streamed.content == whole.content && streamed.calls.size() == whole.calls.size();
    for (size_t i = 0; same && i < whole.calls.size(); ++i) {
      same = streamed.calls[i].name == whole.calls[i].name && streamed.calls[i].arguments == whole.calls[i].arguments;
    }
    if (!same) std::abort();
  }
  return 0;
}
