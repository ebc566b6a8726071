// The regexes of tokenizer.json pre-tokenizers, run with PCRE2 (UTF + UCP, JIT-compiled). HF
// tokenizers runs them with Oniguruma; the two agree on the syntax these patterns use (\p{..},
// classes, lookahead, (?i:...)) except for \s, whose Oniguruma meaning (Unicode White_Space) is
// spelled out explicitly before compiling, because PCRE2's \s misses U+0085.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace specula {

class Regex {
 public:
  // `where` names the file and component for the error raised by an invalid pattern.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every match in `text` (valid UTF-8) as a byte range [first, second), scanning left
  // to right as Oniguruma's find_iter does: non-overlapping, and an empty match right where the
  // previous match ended is skipped.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
};

// The pattern rewritten for PCRE2 (exposed for tests): \s and \S become explicit White_Space
// classes; everything else is kept as written.
std::string translate_pattern_for_pcre2(std::string_view pattern);

}  // namespace specula
