#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <functional>
#include <optional>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace specula {
namespace {

// GPT-2's pre-tokenization regex, which ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const nlohmann::json& spec, const std::string& file) {
  const std::string b = spec.value("behavior", std::string("Isolated"));
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  throw Error(fmt::format("{}: pre_tokenizer Split: unsupported behavior '{}'", file, b));
}

struct Segment {
  size_t begin, end;
  bool is_match;
};

// Turns matches into segments covering the whole piece (HF Pattern::find_matches).
std::vector<Segment> to_segments(size_t size, const std::vector<std::pair<size_t, size_t>>& matches) {
  std::vector<Segment> segs;
  if (size == 0) return {{0, 0, false}};
  size_t prev = 0;
  for (auto [s, e] : matches) {
    if (prev != s) segs.push_back({prev, s, false});
    segs.push_back({s, e, true});
    prev = e;
  }
  if (prev != size) segs.push_back({prev, size, false});
  return segs;
}

// Applies a split behaviour (HF NormalizedString::split) and appends the non-empty pieces.
void split_by(const std::string& piece, std::vector<Segment> segs, Behavior behavior, bool invert,
              std::vector<std::string>& out) {
  if (invert) {
    for (auto& s : segs) s.is_match = !s.is_match;
  }
  std::vector<std::pair<size_t, size_t>> parts;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& s : segs) parts.emplace_back(s.begin, s.end);
      break;
    case Behavior::kRemoved:
      for (const auto& s : segs) {
        if (!s.is_match) parts.emplace_back(s.begin, s.end);
      }
      break;
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& s : segs) {
        if (s.is_match && !previous_match && !parts.empty()) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;  // "previous" in right-to-left order
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !previous_match && !parts.empty()) {
          parts.back().first = it->begin;
        } else {
          parts.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const auto& s : segs) {
        if (s.is_match == previous_match && !parts.empty()) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  for (auto [b, e] : parts) {
    if (e > b) out.push_back(piece.substr(b, e - b));
  }
}

// Runs `split_one` over every piece and replaces the pieces with its output.
void for_each_piece(std::vector<std::string>& pieces,
                    const std::function<void(const std::string&, std::vector<std::string>&)>& split_one) {
  std::vector<std::string> out;
  out.reserve(pieces.size() * 2);
  for (const auto& p : pieces) {
    if (!p.empty()) split_one(p, out);
  }
  pieces = std::move(out);
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(const nlohmann::json& spec, const std::string& file)
      : behavior_(parse_behavior(spec, file)), invert_(spec.value("invert", false)) {
    const auto& pattern = spec.contains("pattern") ? spec["pattern"] : nlohmann::json();
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex_.emplace(pattern["Regex"].get<std::string>(), file + ": pre_tokenizer Split");
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      literal_ = pattern["String"].get<std::string>();
    } else {
      throw Error(fmt::format("{}: pre_tokenizer Split: \"pattern\" must be {{\"Regex\": ...}} or {{\"String\": ...}}", file));
    }
  }

  void pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for_each_piece(pieces, [&](const std::string& p, std::vector<std::string>& out) {
      matches.clear();
      if (regex_) {
        regex_->find_all(p, matches);
      } else if (!literal_.empty()) {
        for (size_t at = p.find(literal_); at != std::string::npos; at = p.find(literal_, at + literal_.size())) {
          matches.emplace_back(at, at + literal_.size());
        }
      }
      split_by(p, to_segments(p.size(), matches), behavior_, invert_, out);
    });
  }

 private:
  Behavior behavior_;
  bool invert_;
  std::optional<Regex> regex_;
  std::string literal_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(const nlohmann::json& spec, const std::string& file)
      : add_prefix_space_(spec.value("add_prefix_space", true)) {
    if (spec.value("use_regex", true)) regex_.emplace(kGpt2Pattern, file + ": pre_tokenizer ByteLevel");
  }

  void pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for_each_piece(pieces, [&](const std::string& piece, std::vector<std::string>& out) {
      std::string p = piece;
      if (add_prefix_space_ && p[0] != ' ') p.insert(p.begin(), ' ');
      const size_t first = out.size();
      if (regex_) {
        matches.clear();
        regex_->find_all(p, matches);
        split_by(p, to_segments(p.size(), matches), Behavior::kIsolated, false, out);
      } else {
        out.push_back(std::move(p));
      }
      for (size_t i = first; i < out.size(); ++i) out[i] = byte_level::encode(out[i]);
    });
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(const nlohmann::json& spec) : individual_(spec.value("individual_digits", false)) {}

  void pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for_each_piece(pieces, [&](const std::string& p, std::vector<std::string>& out) {
      matches.clear();
      for (size_t i = 0; i < p.size();) {  // every numeric character is its own match
        const size_t start = i;
        const char32_t cp = utf8::next_codepoint(p, i);
        if (utf8::is_numeric(cp)) matches.emplace_back(start, i);
      }
      split_by(p, to_segments(p.size(), matches), individual_ ? Behavior::kIsolated : Behavior::kContiguous,
               false, out);
    });
  }

 private:
  bool individual_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec, const std::string& file) {
  if (spec.is_null()) return nullptr;
  SPECULA_CHECK(spec.is_object() && spec.contains("type") && spec["type"].is_string(),
                "{}: pre_tokenizer: expected an object with a \"type\"", file);
  const std::string type = spec["type"].get<std::string>();
  if (type == "Split") return std::make_unique<SplitPreTokenizer>(spec, file);
  if (type == "ByteLevel") return std::make_unique<ByteLevelPreTokenizer>(spec, file);
  if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(spec);
  if (type == "Sequence") {
    SPECULA_CHECK(spec.contains("pretokenizers") && spec["pretokenizers"].is_array(),
                  "{}: pre_tokenizer Sequence: missing \"pretokenizers\" array", file);
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& item : spec["pretokenizers"]) {
      if (auto p = make_pre_tokenizer(item, file)) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  throw Error(fmt::format(
      "{}: unsupported pre_tokenizer type '{}' (supported: Split, ByteLevel, Digits, Sequence)", file, type));
}

}  // namespace specula
