#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specula {

// Byte-level decoding is a concatenation of per-token bytes followed by one lossy UTF-8 decode,
// so streaming it only needs to hold back an incomplete trailing character. It never inserts
// spaces between tokens, so spaces_between_special_tokens changes nothing here (as with vLLM's
// fast-tokenizer detokenizer); it is kept for parity with the request parameters.
IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens,
                                               bool spaces_between_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens), spaces_between_special_(spaces_between_special_tokens) {}

std::string IncrementalDetokenizer::add(int32_t token_id) {
  if (skip_special_ && tok_.is_special(token_id)) return {};
  pending_.append(tok_.token_bytes(token_id));
  std::string out;
  const size_t done = utf8::decode_lossy_prefix(pending_, out);
  pending_.erase(0, done);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = utf8::decode_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace specula
