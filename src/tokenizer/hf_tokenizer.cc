// The Tokenizer implementation: HF tokenizers' pipeline (added tokens -> normalizer ->
// pre-tokenizer -> BPE -> post-processor) plus what transformers layers on top from
// tokenizer_config.json (named special tokens, add_bos_token / add_eos_token).
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"
#include "tokenizer/utf8.h"

namespace specula {
namespace {

nlohmann::json parse_json(const std::string& text, const std::string& file) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: invalid JSON: {}", file, e.what()));
  }
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  SPECULA_CHECK(in.good(), "{}: cannot open (missing or unreadable)", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const nlohmann::json& member_or_null(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json null_json;
  return obj.contains(key) ? obj[key] : null_json;
}

class HfTokenizer final : public Tokenizer {
 public:
  // `text` is tokenizer.json's content; `file` names it in error messages.
  HfTokenizer(const std::string& text, const std::string& file, const TokenizerConfig& config) {
    const nlohmann::json doc = parse_json(text, file);
    SPECULA_CHECK(doc.is_object(), "{}: expected a JSON object", file);
    try {
      load(doc, file, config);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: {}", file, e.what()));
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::string sanitized;
    if (!utf8::is_valid(text)) {  // text from outside may be broken; HF only ever sees valid str
      sanitized = utf8::decode_lossy(text);
      text = sanitized;
    }
    std::vector<TextSegment> segments;
    added_.extract_and_normalize(text, normalizer_.get(), segments);
    std::vector<int32_t> ids;
    if (add_special_tokens) ids = wrap_.prefix;
    std::vector<std::string> pieces;
    for (auto& seg : segments) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      pieces.clear();
      pieces.push_back(std::move(seg.text));
      if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
      for (const auto& p : pieces) model_->tokenize(p, ids);
    }
    if (add_special_tokens) ids.insert(ids.end(), wrap_.suffix.begin(), wrap_.suffix.end());
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (skip_special_tokens && is_special(id)) continue;
      if (id >= 0 && id < static_cast<int32_t>(pieces_.size())) bytes.append(pieces_[id]);
    }
    return utf8::decode_lossy(bytes);
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }

  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (auto id = added_.token_to_id(token)) return id;
    return model_->token_to_id(token);
  }

  std::string id_to_token(int32_t id) const override {
    if (const AddedToken* t = added_.by_id(id)) return t->content;
    const std::string* s = model_->id_to_token(id);
    return s ? *s : std::string();
  }

  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= static_cast<int32_t>(pieces_.size())) return {};
    return pieces_[id];
  }

  bool is_special(int32_t id) const override { return added_.is_special(id); }
  std::optional<int32_t> bos_token_id() const override { return bos_id_; }
  std::optional<int32_t> eos_token_id() const override { return eos_id_; }
  std::string bos_token() const override { return bos_; }
  std::string eos_token() const override { return eos_; }
  bool add_bos_token() const override { return bos_id_ && !wrap_.prefix.empty() && wrap_.prefix.front() == *bos_id_; }
  const std::string& chat_template() const override { return chat_template_; }

 private:
  void load(const nlohmann::json& doc, const std::string& file, const TokenizerConfig& config) {
    SPECULA_CHECK(doc.contains("model") && doc["model"].is_object(), "{}: missing \"model\" object", file);
    const auto& model = doc["model"];
    // Files written by old tokenizers versions have no model type; they are BPE when they carry merges.
    const std::string type = model.contains("type") ? model["type"].get<std::string>()
                                                    : (model.contains("merges") ? "BPE" : "(none)");
    SPECULA_CHECK(type == "BPE", "{}: unsupported model type '{}' (only byte-level BPE is supported)", file, type);
    model_ = std::make_unique<BpeModel>(model, file);
    normalizer_ = make_normalizer(member_or_null(doc, "normalizer"), file);
    pre_tokenizer_ = make_pre_tokenizer(member_or_null(doc, "pre_tokenizer"), file);
    SPECULA_CHECK(make_decoder(member_or_null(doc, "decoder"), file) == DecoderKind::kByteLevel,
                  "{}: decoder: null is not supported (a byte-level BPE needs the ByteLevel decoder)", file);
    const auto& post = member_or_null(doc, "post_processor");
    wrap_ = make_post_processor(post, file);

    load_added_tokens(member_or_null(doc, "added_tokens"), file);
    // transformers adds the config's added_tokens_decoder entries that tokenizer.json lacks, then
    // registers every special token the config names as a special added token.
    for (const AddedToken& t : config.added_tokens) {
      if (!added_.token_to_id(t.content)) add_new_token(t);
    }
    for (const AddedToken& t : config.special_tokens) {
      if (auto id = added_.token_to_id(t.content)) {
        added_.mark_special(*id);
      } else {
        add_new_token(t);
      }
    }
    added_.set_split_special_tokens(config.split_special_tokens);
    added_.build(normalizer_.get());

    if (config.bos_token) {
      bos_ = config.bos_token->content;
      bos_id_ = token_to_id(bos_);
    }
    if (config.eos_token) {
      eos_ = config.eos_token->content;
      eos_id_ = token_to_id(eos_);
    }
    // transformers rebuilds the post-processor from add_bos_token / add_eos_token when the config
    // sets either of them (or when tokenizer.json has none): [bos] $A [eos].
    if (config.add_bos_token || config.add_eos_token || post.is_null()) {
      wrap_ = {};
      if (config.add_bos_token.value_or(false) && bos_id_) wrap_.prefix.push_back(*bos_id_);
      if (config.add_eos_token.value_or(false) && eos_id_) wrap_.suffix.push_back(*eos_id_);
    }
    chat_template_ = config.chat_template;
    build_pieces();
  }

  // Adds a token the added vocabulary lacks, with the id HF tokenizers' add_tokens gives it: its
  // vocab id if the model has it, else the next id after the model vocab and the added tokens.
  void add_new_token(AddedToken t) {
    if (auto id = model_->token_to_id(t.content)) {
      t.id = *id;
    } else {
      const int64_t model_size = model_->vocab_size();
      const auto max_added = added_.max_id();
      t.id = static_cast<int32_t>(!max_added ? model_size
                                             : (*max_added >= model_size || model_size == 0) ? *max_added + 1
                                                                                           : model_size);
    }
    added_.add(t);
  }

  void load_added_tokens(const nlohmann::json& list, const std::string& file) {
    if (list.is_null()) return;
    SPECULA_CHECK(list.is_array(), "{}: added_tokens: expected an array", file);
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& a = list[i];
      SPECULA_CHECK(a.is_object() && a.contains("id") && a.contains("content") && a["content"].is_string(),
                    "{}: added_tokens[{}]: expected an object with \"id\" and \"content\"", file, i);
      SPECULA_CHECK(a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 && a["id"].get<int64_t>() <= kMaxTokenId,
                    "{}: added_tokens[{}]: id {} is not a token id from 0 to {}", file, i, a["id"].dump(), kMaxTokenId);
      AddedToken t;
      t.id = a["id"].get<int32_t>();
      t.content = a["content"].get<std::string>();
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.normalized = a.value("normalized", true);
      t.special = a.value("special", false);
      added_.add(t);
    }
  }

  // The bytes each id decodes to: its byte-level characters undone, or, for a token holding
  // characters outside the byte-level alphabet (most added tokens), its UTF-8 text as is; this is
  // HF's ByteLevel decoder applied token by token.
  void build_pieces() {
    const int32_t max_id = std::max(model_->max_id(), added_.max_id().value_or(-1));
    pieces_.assign(static_cast<size_t>(max_id + 1), std::string());
    for (int32_t id = 0; id <= max_id; ++id) {
      const AddedToken* added = added_.by_id(id);
      const std::string* token = added ? &added->content : model_->id_to_token(id);
      if (!token) continue;
      auto bytes = byte_level::decode(*token);
      pieces_[id] = bytes ? std::move(*bytes) : *token;
    }
  }

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  AddedVocabulary added_;
  SpecialTokenWrap wrap_;
  std::vector<std::string> pieces_;
  std::string bos_, eos_;
  std::optional<int32_t> bos_id_, eos_id_;
  std::string chat_template_;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::filesystem::path& dir) {
  const auto json_path = dir / "tokenizer.json";
  const std::string text = read_text(json_path);
  return std::make_unique<HfTokenizer>(text, json_path.string(), load_tokenizer_config(dir));
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json, const std::string& name) {
  return std::make_unique<HfTokenizer>(tokenizer_json, name, TokenizerConfig{});
}

}  // namespace specula
