#include "cli/bench_serve_spec.h"

#include <cstdlib>
#include <sstream>

namespace specula::cli {
namespace {

// "name{labels} value" -> name, labels, value; false on comments and lines it cannot read.
bool split_sample(const std::string& line, std::string* name, std::string* labels, double* value) {
  if (line.empty() || line[0] == '#') return false;
  const size_t brace = line.find('{');
  const size_t space = line.rfind(' ');
  if (space == std::string::npos) return false;
  if (brace != std::string::npos && brace < space) {
    const size_t close = line.find('}', brace);
    if (close == std::string::npos || close > space) return false;
    *name = line.substr(0, brace);
    *labels = line.substr(brace + 1, close - brace - 1);
  } else {
    *name = line.substr(0, line.find(' '));
    labels->clear();
  }
  char* end = nullptr;
  const std::string v = line.substr(space + 1);
  *value = std::strtod(v.c_str(), &end);
  return end != v.c_str();
}

std::optional<int> position_label(const std::string& labels) {
  const size_t at = labels.find("position=\"");
  if (at == std::string::npos) return std::nullopt;
  return std::atoi(labels.c_str() + at + 10);
}

}  // namespace

SpecCounters parse_spec_counters(const std::string& text) {
  SpecCounters c;
  std::istringstream in(text);
  std::string line, name, labels;
  double v = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!split_sample(line, &name, &labels, &v)) continue;
    if (name == "vllm:spec_decode_num_drafts_total" || name == "vllm:spec_decode_num_drafts") {
      c.present = true;
      c.drafts += v;
    } else if (name == "vllm:spec_decode_num_draft_tokens_total" || name == "vllm:spec_decode_num_draft_tokens") {
      c.draft_tokens += v;
    } else if (name == "vllm:spec_decode_num_accepted_tokens_total" ||
               name == "vllm:spec_decode_num_accepted_tokens") {
      c.accepted_tokens += v;
    } else if (name == "vllm:spec_decode_num_accepted_tokens_per_pos_total" ||
               name == "vllm:spec_decode_num_accepted_tokens_per_pos") {
      const auto pos = position_label(labels);
      if (!pos || *pos < 0 || *pos > 1024) continue;
      if (c.accepted_per_pos.size() <= static_cast<size_t>(*pos)) c.accepted_per_pos.resize(*pos + 1, 0.0);
      c.accepted_per_pos[*pos] += v;
    }
  }
  return c;
}

nlohmann::json spec_delta(const SpecCounters& before, const SpecCounters& after) {
  if (!after.present) return nullptr;
  const double drafts = after.drafts - before.drafts;
  if (drafts <= 0) return nullptr;
  const double drafted = after.draft_tokens - before.draft_tokens;
  const double accepted = after.accepted_tokens - before.accepted_tokens;
  nlohmann::json j;
  j["num_drafts"] = drafts;
  j["draft_tokens"] = drafted;
  j["accepted_tokens"] = accepted;
  j["acceptance_rate"] = drafted > 0 ? accepted / drafted : 0.0;
  j["acceptance_length"] = 1.0 + accepted / drafts;
  std::vector<double> per_pos;
  for (size_t i = 0; i < after.accepted_per_pos.size(); ++i) {
    const double b = i < before.accepted_per_pos.size() ? before.accepted_per_pos[i] : 0.0;
    per_pos.push_back((after.accepted_per_pos[i] - b) / drafts);
  }
  j["per_position_acceptance"] = per_pos;
  return j;
}

}  // namespace specula::cli
