// IncrementalDetokenizer: pieces never end inside a UTF-8 character, and their concatenation is
// decode() of all ids, for characters split over several byte tokens, invalid bytes, and special
// tokens (emitted as text unless skipped).
#include <gtest/gtest.h>

#include <random>

#include "test_paths.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_toy.h"

namespace specula {
namespace {

using testing::TempTokenizerDir;

// Ids of the single-byte tokens spelling `bytes` (every byte-level vocab has all 256).
std::vector<int32_t> byte_tokens(const Tokenizer& tok, const std::string& bytes) {
  std::vector<int32_t> ids;
  for (char c : bytes) ids.push_back(*tok.token_to_id(byte_level::encode(std::string(1, c))));
  return ids;
}

std::vector<std::string> pieces_of(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer d(tok, skip);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(d.add(id));
  pieces.push_back(d.flush());
  return pieces;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& p : v) s += p;
  return s;
}

class ToyDetokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = testing::toy_tokenizer({});
    t["added_tokens"] = {testing::added_token(256, "<|eot|>"), testing::added_token(257, "<｜User｜>", false)};
    dir_.write_json("tokenizer.json", t);
    tok_ = Tokenizer::from_dir(dir_.path());
  }
  TempTokenizerDir dir_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(ToyDetokenizer, HoldsBackSplitCharacters) {
  const std::string emoji = "\xF0\x9F\x91\x8D";  // 👍, four byte tokens
  const auto pieces = pieces_of(*tok_, byte_tokens(*tok_, "a" + emoji + "\xE4\xBD\xA0"), false);  // a 👍 你
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "", emoji, "", "", "\xE4\xBD\xA0", ""}));
}

TEST_F(ToyDetokenizer, InvalidBytesBecomeReplacementCharactersAsInDecode) {
  const std::vector<int32_t> ids = byte_tokens(*tok_, "x\xF0\x9F" "y\xE4\xBD");  // cut emoji mid-text, cut CJK at end
  const auto pieces = pieces_of(*tok_, ids, false);
  EXPECT_EQ(pieces, (std::vector<std::string>{"x", "", "", "\xEF\xBF\xBDy", "", "", "\xEF\xBF\xBD"}));
  EXPECT_EQ(join(pieces), tok_->decode(ids, false));
}

TEST_F(ToyDetokenizer, SpecialTokensAreTextUnlessSkipped) {
  const std::vector<int32_t> ids = {'h', 'i', 256, 257, '!'};
  EXPECT_EQ(join(pieces_of(*tok_, ids, false)), "hi<|eot|><｜User｜>!");
  EXPECT_EQ(join(pieces_of(*tok_, ids, true)), "hi<｜User｜>!");  // <｜User｜> is not special
  EXPECT_EQ(tok_->decode(ids, true), "hi<｜User｜>!");
  // A special token between the bytes of one character does not break it when skipped, as decode().
  std::vector<int32_t> split = byte_tokens(*tok_, "\xE4\xBD");
  split.push_back(256);
  split.push_back(byte_tokens(*tok_, "\xA0")[0]);
  EXPECT_EQ(join(pieces_of(*tok_, split, true)), "\xE4\xBD\xA0");
  EXPECT_EQ(join(pieces_of(*tok_, split, false)), tok_->decode(split, false));
}

TEST_F(ToyDetokenizer, RandomByteStreamsMatchDecode) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(rng() % 24);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % 258);
    for (bool skip : {false, true}) {
      const auto pieces = pieces_of(*tok_, ids, skip);
      for (const auto& p : pieces) EXPECT_TRUE(utf8::is_valid(p));
      EXPECT_EQ(join(pieces), tok_->decode(ids, skip));
    }
  }
}

TEST(RealDetokenizer, EmojiAndCjkByteTokens) {
  const auto dir = testing::tokenizer_cache_dir() / "qwen3";
  if (!std::filesystem::exists(dir / "tokenizer.json")) GTEST_SKIP() << "run scripts/fetch_tokenizers.sh";
  auto tok = Tokenizer::from_dir(dir);
  const std::string text = "\xF0\x9F\xA7\x91\xF0\x9F\x8F\xBF\xE2\x80\x8D\xF0\x9F\x92\xBB \xE9\xBE\x98 ok";  // 🧑🏿‍💻 龘 ok
  for (const auto& ids : {tok->encode(text, false), byte_tokens(*tok, text)}) {
    const auto pieces = pieces_of(*tok, ids, true);
    for (const auto& p : pieces) EXPECT_TRUE(utf8::is_valid(p)) << p;
    EXPECT_EQ(join(pieces), text);
  }
  const int32_t im_end = *tok->token_to_id("<|im_end|>");
  auto ids = tok->encode("done", false);
  ids.push_back(im_end);
  EXPECT_EQ(join(pieces_of(*tok, ids, false)), "done<|im_end|>");
  EXPECT_EQ(join(pieces_of(*tok, ids, true)), "done");
}

}  // namespace
}  // namespace specula
