#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace specula {
namespace {

// Unicode White_Space, as the body of a character class.
constexpr std::string_view kWhiteSpace =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: the compiled code is shared by all threads, but match data and the JIT
// stack are scratch space. The JIT stack may grow to 64 MiB so that long runs of whitespace
// (\s+(?!\S) backtracks over the whole run) cannot exhaust it.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchScratch() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

std::string translate_pattern_for_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      if (d == 's') {
        if (in_class) {
          out.append(kWhiteSpace);
        } else {
          out.append("[").append(kWhiteSpace).append("]");
        }
      } else if (d == 'S' && !in_class) {
        out.append("[^").append(kWhiteSpace).append("]");
      } else {
        out.push_back(c);
        out.push_back(d);
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);  // a leading ] is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern) {
  const std::string translated = translate_pattern_for_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  SPECULA_CHECK(code_ != nullptr, "{}: cannot compile regex {:?}: {} (at offset {})", where, pattern,
                pcre2_message(error), offset);
  // JIT is an optimisation only: without it (unsupported CPU) the interpreter gives the same matches.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchScratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (search_from <= text.size()) {
    const int rc = pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    SPECULA_CHECK(rc >= 0, "regex {:?}: match failed: {}", pattern_, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    const size_t start = ov[0], end = ov[1];
    if (start == end && have_last && last_match_end == end) {
      // An empty match where the last one ended: step over one character and search again.
      if (search_from >= text.size()) return;
      size_t step = 1;
      while (search_from + step < text.size() && (static_cast<uint8_t>(text[search_from + step]) & 0xC0) == 0x80) ++step;
      search_from += step;
      continue;
    }
    out.emplace_back(start, end);
    search_from = end;
    have_last = true;
    last_match_end = end;
  }
}

}  // namespace specula
