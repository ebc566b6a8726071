// The text-level building blocks: Rust-compatible lossy UTF-8 decoding, GPT-2's byte-level
// alphabet, and the PCRE2 regexes standing in for Oniguruma.
#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"
#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace specula {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// Expected values follow Rust's String::from_utf8_lossy (one U+FFFD per maximal invalid subpart,
// per Unicode 15 §3.9 "U+FFFD Substitution of Maximal Subparts").
TEST(Utf8, LossyDecodingReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::decode_lossy("plain ascii"), "plain ascii");
  EXPECT_EQ(utf8::decode_lossy("caf\xC3\xA9"), "caf\xC3\xA9");
  // Rust's documented example: a 4-byte sequence missing its last byte is one U+FFFD.
  EXPECT_EQ(utf8::decode_lossy("Hello \xF0\x90\x80World"), "Hello " + kFffd + "World");
  EXPECT_EQ(utf8::decode_lossy("\xC0\x80"), kFffd + kFffd);              // C0 is never valid
  EXPECT_EQ(utf8::decode_lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate: 3 subparts
  EXPECT_EQ(utf8::decode_lossy("\xE0\x80\x80"), kFffd + kFffd + kFffd);  // overlong
  EXPECT_EQ(utf8::decode_lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(utf8::decode_lossy("\xE2\x82"), kFffd);  // truncated at the end: one subpart
  EXPECT_EQ(utf8::decode_lossy("\xE2\x82x"), kFffd + "x");
  EXPECT_EQ(utf8::decode_lossy("\x80\x80"), kFffd + kFffd);
  EXPECT_EQ(utf8::decode_lossy(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(Utf8, StreamingDecodeHoldsBackOnlyAnIncompleteTail) {
  const std::string emoji = "\xF0\x9F\x98\x80";  // 😀
  for (size_t cut = 1; cut < 4; ++cut) {
    std::string out;
    EXPECT_EQ(utf8::decode_lossy_prefix("ab" + emoji.substr(0, cut), out), 2u) << cut;
    EXPECT_EQ(out, "ab");
  }
  std::string out;
  EXPECT_EQ(utf8::decode_lossy_prefix("\xF0\x9F" "x", out), 3u);  // invalid, not incomplete
  EXPECT_EQ(out, kFffd + "x");
}

TEST(Utf8, StreamingEqualsWholeOnEverySplit) {
  const std::string bytes = "a\xF0\x9F\x98\x80\xE4\xBD\xA0\xC3\x28\xE2\x82\xF0\x90\x80z\xED\xA0\x80\xF0";
  const std::string whole = utf8::decode_lossy(bytes);
  for (size_t chunk = 1; chunk <= 4; ++chunk) {
    std::string pending, out;
    for (size_t i = 0; i < bytes.size(); i += chunk) {
      pending += bytes.substr(i, chunk);
      pending.erase(0, utf8::decode_lossy_prefix(pending, out));
    }
    out += utf8::decode_lossy(pending);
    EXPECT_EQ(out, whole) << "chunk " << chunk;
  }
}

TEST(Utf8, Predicates) {
  EXPECT_TRUE(utf8::is_white_space(U'\u0085'));
  EXPECT_TRUE(utf8::is_white_space(U'\u3000'));
  EXPECT_FALSE(utf8::is_white_space(U'\u200B'));  // zero-width space is not White_Space
  EXPECT_TRUE(utf8::is_numeric(U'7'));
  EXPECT_TRUE(utf8::is_numeric(U'\u00B2'));  // superscript two: No
  EXPECT_TRUE(utf8::is_numeric(U'\u2166'));  // roman numeral seven: Nl
  EXPECT_FALSE(utf8::is_numeric(U'x'));
  EXPECT_TRUE(utf8::is_word_char(U'\u0330'));  // combining mark
  EXPECT_TRUE(utf8::is_word_char(U'_'));
  EXPECT_FALSE(utf8::is_word_char(U'-'));
}

TEST(ByteLevel, AlphabetMatchesGpt2) {
  EXPECT_EQ(byte_level::encode(" "), "\xC4\xA0");   // Ġ
  EXPECT_EQ(byte_level::encode("\n"), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_level::encode("A~"), "A~");
  EXPECT_EQ(byte_level::encode("\xAD"), "\xC5\x83");  // soft hyphen byte -> U+0143, the last one
  EXPECT_EQ(byte_level::encode(std::string(1, '\0')), "\xC4\x80");  // U+0100
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    EXPECT_EQ(byte_level::decode(byte_level::encode(s)), s) << b;
  }
  EXPECT_EQ(byte_level::decode("<\xEF\xBD\x9C" "User>"), std::nullopt);  // ｜ is outside the alphabet
  EXPECT_EQ(byte_level::decode("\xC4\xA0hello"), " hello");
}

std::vector<std::pair<size_t, size_t>> find_all(const std::string& pattern, const std::string& text) {
  Regex re(pattern, "test");
  std::vector<std::pair<size_t, size_t>> out;
  re.find_all(text, out);
  return out;
}
using Ranges = std::vector<std::pair<size_t, size_t>>;

TEST(Regex, WhitespaceMeansUnicodeWhiteSpace) {
  EXPECT_EQ(find_all(R"(\s+)", "a\xC2\x85" "b"), (Ranges{{1, 3}}));  // U+0085 NEL
  EXPECT_EQ(find_all(R"(\s+)", "a\xE2\x80\x8B" "b"), Ranges{});      // U+200B is not whitespace
  EXPECT_EQ(find_all(R"([^\s\p{L}]+)", "ab, \xE3\x80\x80!"), (Ranges{{2, 3}, {7, 8}}));
  EXPECT_EQ(find_all(R"(\s+(?!\S))", "a   b"), (Ranges{{1, 3}}));
  EXPECT_EQ(translate_pattern_for_pcre2(R"([\]\s])"), R"([\])" + std::string(R"(\x{09}-\x{0D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}])"));
  EXPECT_EQ(translate_pattern_for_pcre2(R"(\\s)"), R"(\\s)");  // an escaped backslash, then 's'
}

TEST(Regex, EmptyMatchesFollowOnigurumaIteration) {
  // As the onig crate's find_iter: an empty match right after the previous match is skipped.
  EXPECT_EQ(find_all("a*", "baab"), (Ranges{{0, 0}, {1, 3}, {4, 4}}));
  EXPECT_EQ(find_all("x*", ""), (Ranges{{0, 0}}));
}

TEST(Regex, UnicodePropertiesAndCaseInsensitiveGroups) {
  EXPECT_EQ(find_all(R"(\p{N}{1,3})", "a12345"), (Ranges{{1, 4}, {4, 6}}));
  EXPECT_EQ(find_all(R"((?i:'s|'ll))", "IT'S he'LL"), (Ranges{{2, 4}, {7, 10}}));
  EXPECT_EQ(find_all("[\xE4\xB8\x80-\xE9\xBE\xA5]+", "ab\xE4\xBD\xA0\xE5\xA5\xBD!"), (Ranges{{2, 8}}));  // 你好
}

TEST(Regex, InvalidPatternNamesWhere) {
  try {
    Regex re("(unclosed", "tok/tokenizer.json: pre_tokenizer Split");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tok/tokenizer.json: pre_tokenizer Split"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specula
