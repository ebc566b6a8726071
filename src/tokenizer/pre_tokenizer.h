// tokenizer.json "pre_tokenizer": splits normalized text into the pieces BPE encodes one by one.
// Supported: Split (regex or literal pattern, every HF split behaviour, invert), ByteLevel
// (add_prefix_space, use_regex with GPT-2's regex), Digits (individual_digits) and Sequence.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece further, in order, as HF's PreTokenizedString::split does (empty pieces
  // are dropped).
  virtual void pre_tokenize(std::vector<std::string>& pieces) const = 0;
};

// nullptr for null. An unknown type or behaviour is a specula::Error naming `file`.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec, const std::string& file);

}  // namespace specula
