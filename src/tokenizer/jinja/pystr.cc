#include "tokenizer/jinja/pystr.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>

namespace specula::jinja::pystr {

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    size_t n;
    if (c < 0x80) {
      cp = c, n = 1;
    } else if ((c >> 5) == 0x6) {
      cp = c & 0x1f, n = 2;
    } else if ((c >> 4) == 0xe) {
      cp = c & 0x0f, n = 3;
    } else if ((c >> 3) == 0x1e) {
      cp = c & 0x07, n = 4;
    } else {  // invalid lead byte: keep it as U+FFFD rather than failing a render
      out.push_back(0xfffd);
      ++i;
      continue;
    }
    if (i + n > s.size()) {
      out.push_back(0xfffd);
      break;
    }
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string encode(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_utf8(out, cp);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

bool is_space(char32_t cp) {
  // Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f)) return true;
  if (cp < 0x80) return false;
  switch (cp) {
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, Side side) {
  std::u32string cps = decode(s);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strippable = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : is_space(c);
  };
  size_t begin = 0, end = cps.size();
  if (side != Side::Right)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (side != Side::Left)
    while (end > begin && strippable(cps[end - 1])) --end;
  return encode(std::u32string_view(cps).substr(begin, end - begin));
}

namespace {

std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::u32string cps = decode(s);
  std::vector<std::u32string> parts;
  if (!from_right) {
    size_t i = 0, n = cps.size();
    while (true) {
      while (i < n && is_space(cps[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(cps.substr(i));  // the remainder keeps its trailing whitespace
        break;
      }
      size_t j = i;
      while (j < n && !is_space(cps[j])) ++j;
      parts.push_back(cps.substr(i, j - i));
      i = j;
    }
  } else {
    size_t i = cps.size();
    while (true) {
      while (i > 0 && is_space(cps[i - 1])) --i;
      if (i == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(cps.substr(0, i));  // the remainder keeps its leading whitespace
        break;
      }
      size_t j = i;
      while (j > 0 && !is_space(cps[j - 1])) --j;
      parts.push_back(cps.substr(j, i - j));
      i = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  std::vector<std::string> out;
  for (auto& p : parts) out.push_back(encode(p));
  return out;
}

}  // namespace

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right) {
  if (!sep) return split_whitespace(s, maxsplit, from_right);
  if (sep->empty()) throw std::invalid_argument("empty separator");
  std::vector<std::string> out;
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
  }
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::u32string cps = decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0, n = cps.size();
  while (i < n) {
    char32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
               c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    size_t eol = i;
    ++i;
    if (c == '\r' && i < n && cps[i] == '\n') ++i;
    out.push_back(encode(std::u32string_view(cps).substr(start, (keepends ? i : eol) - start)));
    start = i;
  }
  if (start < n) out.push_back(encode(std::u32string_view(cps).substr(start)));
  return out;
}

std::string replace(std::string_view s, std::string_view old_sub, std::string_view new_sub,
                    int64_t count) {
  std::string out;
  if (old_sub.empty()) {
    // Python inserts `new` before every code point and at the end.
    std::u32string cps = decode(s);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) out.append(new_sub), ++done;
      append_utf8(out, c);
    }
    if (count < 0 || done < count) out.append(new_sub);
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old_sub, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(new_sub);
    start = at + old_sub.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(length(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size()))
    ++n;
  return n;
}

int64_t find(std::string_view s, std::string_view sub, bool from_right) {
  size_t at = from_right ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return static_cast<int64_t>(length(s.substr(0, at)));
}

namespace {

template <typename F>
std::string map_cps(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode(s)) append_utf8(out, static_cast<char32_t>(f(c)));
  return out;
}

bool is_cased(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

template <typename Pred>
bool all_nonempty(std::string_view s, Pred pred) {
  std::u32string cps = decode(s);
  if (cps.empty()) return false;
  return std::all_of(cps.begin(), cps.end(), pred);
}

utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

}  // namespace

std::string upper(std::string_view s) {
  return map_cps(s, [](char32_t c) { return utf8proc_toupper(static_cast<utf8proc_int32_t>(c)); });
}
std::string lower(std::string_view s) {
  return map_cps(s, [](char32_t c) { return utf8proc_tolower(static_cast<utf8proc_int32_t>(c)); });
}
std::string swapcase(std::string_view s) {
  return map_cps(s, [](char32_t c) {
    auto cp = static_cast<utf8proc_int32_t>(c);
    if (utf8proc_isupper(cp)) return utf8proc_tolower(cp);
    if (utf8proc_islower(cp)) return utf8proc_toupper(cp);
    return cp;
  });
}

std::string capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (char32_t c : decode(s)) {
    auto cp = static_cast<utf8proc_int32_t>(c);
    append_utf8(out, static_cast<char32_t>(first ? utf8proc_totitle(cp) : utf8proc_tolower(cp)));
    first = false;
  }
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : decode(s)) {
    auto cp = static_cast<utf8proc_int32_t>(c);
    append_utf8(
        out, static_cast<char32_t>(previous_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp)));
    previous_cased = is_cased(c);
  }
  return out;
}

bool is_digit(std::string_view s) {
  return all_nonempty(s, [](char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; });
}
bool is_alpha(std::string_view s) {
  return all_nonempty(s, [](char32_t c) {
    auto cat = category(c);
    return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
  });
}
bool is_alnum(std::string_view s) {
  return all_nonempty(s, [](char32_t c) {
    auto cat = category(c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
  });
}
bool is_all_space(std::string_view s) { return all_nonempty(s, is_space); }

bool is_lower(std::string_view s) {
  bool any_cased = false;
  for (char32_t c : decode(s)) {
    auto cp = static_cast<utf8proc_int32_t>(c);
    if (utf8proc_isupper(cp) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    if (utf8proc_islower(cp)) any_cased = true;
  }
  return any_cased;
}
bool is_upper(std::string_view s) {
  bool any_cased = false;
  for (char32_t c : decode(s)) {
    auto cp = static_cast<utf8proc_int32_t>(c);
    if (utf8proc_islower(cp) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    if (utf8proc_isupper(cp)) any_cased = true;
  }
  return any_cased;
}

std::string repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      // Python escapes what str.isprintable() rejects: Other and Separator categories but ' '.
      auto cat = category(c);
      bool printable = !(cat == UTF8PROC_CATEGORY_CN || cat >= UTF8PROC_CATEGORY_ZS);
      if (printable) {
        append_utf8(out, c);
      } else if (c < 0x100) {
        out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
      } else if (c < 0x10000) {
        out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
      } else {
        out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
      }
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace specula::jinja::pystr
