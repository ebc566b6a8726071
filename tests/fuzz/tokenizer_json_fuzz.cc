// libFuzzer target: arbitrary text as tokenizer.json, loaded by Tokenizer::from_json (the loading
// code Tokenizer::from_dir runs), then a few strings encoded and decoded with what loaded.
//
// specula::Error is the expected refusal of a corrupt or unsupported file. A tokenizer that loads
// must then encode and decode without crashing; ids it returns must be inside its vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<specula::Tokenizer> tok;
  try {
    tok = specula::Tokenizer::from_json(specula::fuzz::as_string(data, size));
  } catch (const specula::Error&) {
    return 0;
  }
  static const char* const kTexts[] = {"Hello, world! 123", "  def fib(n):\n\treturn n\r\n", "héllo 世界 🙂",
                                       "\xff\xfe broken \xc3", "<|im_start|>user<s></s>"};
  for (const char* text : kTexts) {
    for (bool special : {true, false}) {
      std::vector<int32_t> ids = tok->encode(text, special);
      for (int32_t id : ids) {
        if (id < 0 || id >= tok->vocab_size()) std::abort();
        (void)tok->id_to_token(id);
        (void)tok->token_bytes(id);
      }
      (void)tok->decode(ids, true);
      (void)tok->decode(ids, false);
      specula::IncrementalDetokenizer detok(*tok, special);
      for (int32_t id : ids) (void)detok.add(id);
      (void)detok.flush();
    }
  }
  (void)tok->decode({-1, 0, 1, 2, 1 << 30}, false);
  (void)tok->token_to_id("hello");
  return 0;
}
