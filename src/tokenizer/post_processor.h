// tokenizer.json "post_processor" and "decoder", reduced to what encoding/decoding ids needs: the
// special ids a single sequence is wrapped in, and whether tokens are byte-level when decoded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula {

// The ids added around one sequence when add_special_tokens is true.
struct SpecialTokenWrap {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// Supported: null, ByteLevel (adds nothing), TemplateProcessing (its "single" template),
// BertProcessing / RobertaProcessing (cls ... sep) and Sequence. Errors name `file`.
SpecialTokenWrap make_post_processor(const nlohmann::json& spec, const std::string& file);

enum class DecoderKind {
  kNone,       // no decoder: HF joins the token strings with spaces
  kByteLevel,  // tokens are byte-level strings (possibly inside a Sequence)
};
DecoderKind make_decoder(const nlohmann::json& spec, const std::string& file);

}  // namespace specula
