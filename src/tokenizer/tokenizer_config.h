// What transformers reads from tokenizer_config.json (and chat_template.jinja) on top of
// tokenizer.json: the named special tokens, add_bos_token / add_eos_token, split_special_tokens
// and the chat template.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/added_vocabulary.h"

namespace specula {

struct TokenizerConfig {
  std::optional<AddedToken> bos_token;
  std::optional<AddedToken> eos_token;
  // Every named special token (bos, eos, unk, sep, pad, cls, mask, additional/extra special
  // tokens), which transformers registers as special added tokens. Ids are not known here.
  std::vector<AddedToken> special_tokens;
  // "added_tokens_decoder" entries (with their ids); transformers adds those that tokenizer.json lacks.
  std::vector<AddedToken> added_tokens;
  std::optional<bool> add_bos_token;  // unset when the key is absent
  std::optional<bool> add_eos_token;
  bool split_special_tokens = false;
  std::string chat_template;
  std::string tokenizer_class;
};

// Reads `dir`/tokenizer_config.json if present (an absent file gives the defaults) and
// `dir`/chat_template.jinja, which takes precedence over the config's chat_template as in
// transformers. A corrupt file is a specula::Error naming it.
TokenizerConfig load_tokenizer_config(const std::filesystem::path& dir);

}  // namespace specula
