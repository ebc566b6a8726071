// tokenizer.json "normalizer": Unicode normalization forms (via utf8proc) and Sequence of them.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace specula {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string_view text) const = 0;
};

// Builds the normalizer a tokenizer.json "normalizer" value describes; nullptr for null (and for
// an empty Sequence). An unsupported type is a specula::Error naming `file`.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& file);

}  // namespace specula
