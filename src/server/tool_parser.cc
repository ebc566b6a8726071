#include "server/tool_parser.h"

#include <algorithm>

namespace specula::server {
namespace {

struct Entry {
  const char* name;
  std::unique_ptr<ToolParser> (*make)();
  bool keeps_special_tokens;
};

// hermes keeps special tokens as vLLM's does: some checkpoints mark <tool_call> special.
const Entry kParsers[] = {
    {"hermes", make_hermes_tool_parser, true},
    {"llama3_json", make_llama3_json_tool_parser, false},
    {"deepseek_v3", make_deepseek_v3_tool_parser, false},
};

const Entry* find(std::string_view name) {
  for (const Entry& e : kParsers)
    if (name == e.name) return &e;
  return nullptr;
}

}  // namespace

const std::vector<std::string>& ToolParser::names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Entry& e : kParsers) out.emplace_back(e.name);
    return out;
  }();
  return names;
}

bool ToolParser::is_known(std::string_view name) { return find(name) != nullptr; }

std::unique_ptr<ToolParser> ToolParser::create(std::string_view name) {
  const Entry* e = find(name);
  return e ? e->make() : nullptr;
}

bool ToolParser::keeps_special_tokens(std::string_view name) {
  const Entry* e = find(name);
  return e && e->keeps_special_tokens;
}

ToolParseDelta ToolParser::feed(std::string_view text) {
  ToolParseDelta out;
  if (!text.empty()) consume(text, &out);
  return out;
}

ToolParseDelta ToolParser::finish() {
  ToolParseDelta out;
  end(&out);
  return out;
}

ParsedToolOutput ToolParser::parse_all(std::string_view text) {
  ToolParseDelta a = feed(text);
  ToolParseDelta b = finish();
  ParsedToolOutput out;
  if (malformed_) {
    out.content = std::string(text);
    return out;
  }
  out.content = a.content + b.content;
  for (const auto* d : {&a, &b}) {
    for (const ToolCallDelta& c : d->calls) {
      if (c.index >= static_cast<int>(out.calls.size())) out.calls.resize(c.index + 1);
      if (c.name) out.calls[c.index].name = *c.name;
      out.calls[c.index].arguments += c.arguments;
    }
  }
  return out;
}

int ToolParser::start_call(const std::string& name, ToolParseDelta* out) {
  ToolCallDelta d;
  d.index = next_index_++;
  d.name = name;
  out->calls.push_back(std::move(d));
  return out->calls.back().index;
}

void ToolParser::append_arguments(std::string_view piece, ToolParseDelta* out) {
  if (piece.empty() || next_index_ == 0) return;
  int index = next_index_ - 1;
  if (out->calls.empty() || out->calls.back().index != index) {
    ToolCallDelta d;
    d.index = index;
    out->calls.push_back(std::move(d));
  }
  out->calls.back().arguments.append(piece);
}

}  // namespace specula::server
