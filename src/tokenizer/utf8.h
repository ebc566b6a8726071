// UTF-8 helpers for the tokenizer: code point iteration, Rust-compatible lossy decoding (HF
// tokenizers decodes bytes with String::from_utf8_lossy, so invalid bytes must become U+FFFD in
// exactly the same places), and the Unicode predicates the pipeline needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specula::utf8 {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the complete, valid UTF-8 sequence starting at s[i], or 0 if the bytes there are not
// one (invalid, or cut off by the end of `s`).
size_t valid_sequence_length(std::string_view s, size_t i);

// Decodes the valid sequence at s[i] (see valid_sequence_length) and advances i past it.
// Precondition: s is valid UTF-8 from i on.
char32_t next_codepoint(std::string_view s, size_t& i);

void append_codepoint(std::string& out, char32_t cp);

// Decodes `bytes` like Rust's String::from_utf8_lossy: every maximal invalid subpart becomes one
// U+FFFD (the Unicode "substitution of maximal subparts" practice).
std::string decode_lossy(std::string_view bytes);

// Streaming form of decode_lossy: appends the decoding of the longest prefix of `bytes` whose
// decoding can no longer change, and returns its length. What is held back is at most 3 bytes:
// an incomplete but so-far valid sequence at the very end. decode_lossy(a + b) equals
// decode_lossy_prefix(a) + decode_lossy(rest of a + b), so pieces can be emitted as they arrive.
size_t decode_lossy_prefix(std::string_view bytes, std::string& out);

bool is_valid(std::string_view s);

// Unicode White_Space, the set Rust's char::is_whitespace and regex \s use (and Oniguruma's \s).
bool is_white_space(char32_t cp);
// Rust's char::is_numeric: general category Nd, Nl or No.
bool is_numeric(char32_t cp);
// Rust regex's Unicode \w: alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t cp);

}  // namespace specula::utf8
