#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace specula {
namespace {

class UnicodeForm final : public Normalizer {
 public:
  UnicodeForm(utf8proc_option_t options, std::string file) : options_(options), file_(std::move(file)) {}

  std::string normalize(std::string_view text) const override {
    bool ascii = true;
    for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return std::string(text);  // every normalization form leaves ASCII unchanged
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                            static_cast<utf8proc_ssize_t>(text.size()), &result, options_);
    SPECULA_CHECK(n >= 0, "{}: normalizer: {}", file_, utf8proc_errmsg(n));
    std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
    return out;
  }

 private:
  utf8proc_option_t options_;
  std::string file_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& p : parts_) s = p->normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& file) {
  if (spec.is_null()) return nullptr;
  SPECULA_CHECK(spec.is_object() && spec.contains("type") && spec["type"].is_string(),
                "{}: normalizer: expected an object with a \"type\"", file);
  const std::string type = spec["type"].get<std::string>();
  const auto stable = UTF8PROC_STABLE;
  if (type == "NFC") return std::make_unique<UnicodeForm>(utf8proc_option_t(stable | UTF8PROC_COMPOSE), file);
  if (type == "NFD") return std::make_unique<UnicodeForm>(utf8proc_option_t(stable | UTF8PROC_DECOMPOSE), file);
  if (type == "NFKC") {
    return std::make_unique<UnicodeForm>(utf8proc_option_t(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT), file);
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeForm>(utf8proc_option_t(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT), file);
  }
  if (type == "Sequence") {
    SPECULA_CHECK(spec.contains("normalizers") && spec["normalizers"].is_array(),
                  "{}: normalizer Sequence: missing \"normalizers\" array", file);
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& item : spec["normalizers"]) {
      if (auto n = make_normalizer(item, file)) parts.push_back(std::move(n));
    }
    if (parts.empty()) return nullptr;
    if (parts.size() == 1) return std::move(parts.front());
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  throw Error(fmt::format("{}: unsupported normalizer type '{}' (supported: NFC, NFD, NFKC, NFKD, Sequence)",
                          file, type));
}

}  // namespace specula
