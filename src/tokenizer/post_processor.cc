#include "tokenizer/post_processor.h"

#include "core/error.h"

namespace specula {
namespace {

std::vector<int32_t> template_special_ids(const nlohmann::json& spec, const std::string& name,
                                          const std::string& file) {
  const auto& map = spec.contains("special_tokens") ? spec["special_tokens"] : nlohmann::json::object();
  SPECULA_CHECK(map.is_object() && map.contains(name) && map[name].contains("ids") && map[name]["ids"].is_array(),
                "{}: post_processor TemplateProcessing: special token {:?} has no \"ids\" in special_tokens", file,
                name);
  std::vector<int32_t> ids;
  for (const auto& id : map[name]["ids"]) ids.push_back(id.get<int32_t>());
  return ids;
}

SpecialTokenWrap template_processing(const nlohmann::json& spec, const std::string& file) {
  SPECULA_CHECK(spec.contains("single") && spec["single"].is_array(),
                "{}: post_processor TemplateProcessing: missing \"single\" array", file);
  SpecialTokenWrap wrap;
  bool seen_sequence = false;
  for (const auto& piece : spec["single"]) {
    if (piece.contains("Sequence")) {
      SPECULA_CHECK(!seen_sequence && piece["Sequence"].value("id", std::string("A")) == "A",
                    "{}: post_processor TemplateProcessing: \"single\" must hold sequence A exactly once", file);
      seen_sequence = true;
    } else if (piece.contains("SpecialToken")) {
      const auto ids = template_special_ids(spec, piece["SpecialToken"].at("id").get<std::string>(), file);
      auto& dst = seen_sequence ? wrap.suffix : wrap.prefix;
      dst.insert(dst.end(), ids.begin(), ids.end());
    } else {
      throw Error(fmt::format("{}: post_processor TemplateProcessing: unknown piece {}", file, piece.dump()));
    }
  }
  SPECULA_CHECK(seen_sequence, "{}: post_processor TemplateProcessing: \"single\" lacks sequence A", file);
  return wrap;
}

}  // namespace

SpecialTokenWrap make_post_processor(const nlohmann::json& spec, const std::string& file) {
  if (spec.is_null()) return {};
  SPECULA_CHECK(spec.is_object() && spec.contains("type") && spec["type"].is_string(),
                "{}: post_processor: expected an object with a \"type\"", file);
  const std::string type = spec["type"].get<std::string>();
  if (type == "ByteLevel") return {};  // it only trims offsets
  if (type == "TemplateProcessing") return template_processing(spec, file);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    SPECULA_CHECK(spec.contains("cls") && spec.contains("sep"), "{}: post_processor {}: missing cls/sep", file, type);
    return {{spec["cls"].at(1).get<int32_t>()}, {spec["sep"].at(1).get<int32_t>()}};
  }
  if (type == "Sequence") {
    SPECULA_CHECK(spec.contains("processors") && spec["processors"].is_array(),
                  "{}: post_processor Sequence: missing \"processors\" array", file);
    SpecialTokenWrap wrap;  // each processor wraps what the previous ones produced
    for (const auto& item : spec["processors"]) {
      SpecialTokenWrap inner = make_post_processor(item, file);
      inner.prefix.insert(inner.prefix.end(), wrap.prefix.begin(), wrap.prefix.end());
      wrap.suffix.insert(wrap.suffix.end(), inner.suffix.begin(), inner.suffix.end());
      wrap.prefix = std::move(inner.prefix);
    }
    return wrap;
  }
  throw Error(fmt::format(
      "{}: unsupported post_processor type '{}' (supported: ByteLevel, TemplateProcessing, BertProcessing, "
      "RobertaProcessing, Sequence)",
      file, type));
}

DecoderKind make_decoder(const nlohmann::json& spec, const std::string& file) {
  if (spec.is_null()) return DecoderKind::kNone;
  SPECULA_CHECK(spec.is_object() && spec.contains("type") && spec["type"].is_string(),
                "{}: decoder: expected an object with a \"type\"", file);
  const std::string type = spec["type"].get<std::string>();
  if (type == "ByteLevel") return DecoderKind::kByteLevel;
  if (type == "Sequence") {
    // Only the trivial sequence [ByteLevel] (some converters wrap the decoder that way).
    SPECULA_CHECK(spec.contains("decoders") && spec["decoders"].is_array() && spec["decoders"].size() == 1 &&
                      make_decoder(spec["decoders"][0], file) == DecoderKind::kByteLevel,
                  "{}: decoder Sequence: only a Sequence holding one ByteLevel decoder is supported, got {}", file,
                  spec.dump());
    return DecoderKind::kByteLevel;
  }
  throw Error(fmt::format("{}: unsupported decoder type '{}' (supported: ByteLevel, Sequence of ByteLevel)", file,
                          type));
}

}  // namespace specula
