// A Hugging Face tokenizer from tokenizer.json + tokenizer_config.json: byte-level BPE with
// merges, added/special tokens, normalizers and pre-tokenizers, reproducing HF tokenizers' ids
// exactly. Immutable after loading, so one instance is shared by every thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specula {

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json and `dir`/tokenizer_config.json (the latter optional). Throws
  // specula::Error naming the file and key for a missing or corrupt file or an unsupported
  // component (e.g. a WordPiece model or an unknown pre-tokenizer type).
  static std::unique_ptr<Tokenizer> from_dir(const std::filesystem::path& dir);
  // The same loading from tokenizer.json's text alone, with tokenizer_config.json's defaults;
  // `name` stands for the file in error messages. For tests and the fuzz targets (tests/fuzz).
  static std::unique_ptr<Tokenizer> from_json(const std::string& tokenizer_json,
                                              const std::string& name = "tokenizer.json");
  virtual ~Tokenizer() = default;

  // add_special_tokens: prepend bos when tokenizer_config says add_bos_token (and whatever the
  // post-processor adds), as transformers' tokenizer(text) does.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const = 0;

  virtual int64_t vocab_size() const = 0;  // model vocab + added tokens (max id + 1)
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;  // the vocab string ("Ġhello")
  // The raw bytes a token decodes to on its own (ByteLevel undone); may be part of a UTF-8 char.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;

  virtual std::optional<int32_t> bos_token_id() const = 0;
  virtual std::optional<int32_t> eos_token_id() const = 0;
  virtual std::string bos_token() const = 0;  // "" when none
  virtual std::string eos_token() const = 0;
  // Whether encode(text, true) starts with bos (from add_bos_token or tokenizer.json's template).
  virtual bool add_bos_token() const = 0;
  // tokenizer_config.json's chat_template (or chat_template.jinja beside it); "" when none.
  virtual const std::string& chat_template() const = 0;
};

// Turns a growing list of token ids into text pieces without ever emitting a broken UTF-8
// sequence: bytes of an incomplete character are held back until the character completes.
class IncrementalDetokenizer {
 public:
  // Byte-level decoding never puts spaces between tokens, so spaces_between_special_tokens has no
  // effect (as in vLLM's detokenizer for fast tokenizers); it mirrors the sampling parameter.
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens, bool spaces_between_special_tokens = true);
  // Appends one token; returns the new text it completes (possibly empty).
  std::string add(int32_t token_id);
  // Text still held back at the end of generation (an incomplete character becomes U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  bool spaces_between_special_;
  std::string pending_;  // bytes not yet emitted
};

}  // namespace specula
