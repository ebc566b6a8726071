#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "tokenizer/jinja/pystr.h"

namespace specula::jinja {
namespace {

bool ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Python's str.isspace() over a whole (non-empty) string.
bool all_whitespace(std::string_view s) {
  if (s.empty()) return false;
  for (char32_t c : pystr::decode(s))
    if (!pystr::is_space(c)) return false;
  return true;
}

class Lexer {
 public:
  explicit Lexer(const std::string& raw) : src_(normalize(raw)) {
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') newlines_.push_back(i);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t at = find_tag_start(pos_);
      if (at == std::string::npos) {
        emit_data(src_.substr(pos_), pos_);
        break;
      }
      std::string text = src_.substr(pos_, at - pos_);
      char kind = src_[at + 1];
      char sign =
          at + 2 < src_.size() && (src_[at + 2] == '-' || src_[at + 2] == '+') ? src_[at + 2] : 0;
      size_t raw_body = kind == '%' ? match_raw_begin(at) : std::string::npos;
      apply_whitespace_control(text, sign, kind == '{');
      emit_data(text, pos_);
      size_t after = at + 2 + (sign ? 1 : 0);
      if (raw_body != std::string::npos) {
        line_starting_ = src_[raw_body - 1] == '\n';
        lex_raw(raw_body, at);
      } else if (kind == '#') {
        lex_comment(after, at);
      } else {
        push(kind == '%' ? TokenType::BlockBegin : TokenType::VarBegin, "", at);
        pos_ = after;
        lex_tag(kind == '%');
      }
    }
    push(TokenType::Eof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  static std::string normalize(const std::string& raw) {
    std::string s;
    s.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        s.push_back('\n');
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        s.push_back(raw[i]);
      }
    }
    if (!s.empty() && s.back() == '\n') s.pop_back();  // keep_trailing_newline=False
    return s;
  }

  int line_at(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) -
                                newlines_.begin());
  }

  [[noreturn]] void fail(const std::string& what, size_t pos) const {
    throw Error(fmt::format("chat template syntax error at line {}: {}", line_at(pos), what));
  }

  void push(TokenType type, std::string value, size_t pos) {
    tokens_.push_back(Token{type, std::move(value), line_at(pos)});
  }

  void emit_data(const std::string& text, size_t pos) {
    if (!text.empty()) push(TokenType::Data, text, pos);
  }

  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '%' || src_[i + 1] == '{' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  // `{%-`: strip all whitespace before the tag. Otherwise, lstrip_blocks: a block or comment tag
  // preceded on its line by blanks only drops those blanks (not for `{{`, not with `{%+`).
  void apply_whitespace_control(std::string& text, char sign, bool variable) const {
    if (sign == '-') {
      text = pystr::strip(text, std::nullopt, pystr::Side::Right);
    } else if (sign != '+' && !variable) {
      size_t line_start = text.rfind('\n');
      line_start = line_start == std::string::npos ? 0 : line_start + 1;
      if ((line_start > 0 || line_starting_) &&
          all_whitespace(std::string_view(text).substr(line_start)))
        text.resize(line_start);
    }
  }

  size_t skip_spaces(size_t p) const {
    while (p < src_.size() && ascii_space(src_[p])) ++p;
    return p;
  }
  bool at_str(size_t p, const char* s) const { return src_.compare(p, std::strlen(s), s) == 0; }

  // Matches `{%[-+]? raw [-]?%}` at `at`; returns where the raw body starts, or npos.
  size_t match_raw_begin(size_t at) const {
    size_t p = at + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_spaces(p);
    if (!at_str(p, "raw")) return std::string::npos;
    p = skip_spaces(p + 3);
    if (at_str(p, "-%}")) return skip_spaces(p + 3);
    if (at_str(p, "%}")) return p + 2;  // jinja2 applies no trim_blocks after `{% raw %}`
    return std::string::npos;
  }

  // Block end as jinja2 matches it: `+%}` keeps what follows, `-%}` eats all whitespace after,
  // `%}` eats one newline (trim_blocks). Returns the end of the match, or npos.
  size_t match_block_end(size_t p, const char* close) const {
    if (src_[p] == '+' && at_str(p + 1, close)) return p + 3;
    if (src_[p] == '-' && at_str(p + 1, close)) return skip_spaces(p + 3);
    if (at_str(p, close)) return p + 2 < src_.size() && src_[p + 2] == '\n' ? p + 3 : p + 2;
    return std::string::npos;
  }

  void lex_raw(size_t body, size_t tag_pos) {
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      q = skip_spaces(q);
      if (!at_str(q, "endraw")) continue;
      q = skip_spaces(q + 6);
      size_t end = q < src_.size() ? match_block_end(q, "%}") : std::string::npos;
      if (end == std::string::npos) continue;
      std::string text = src_.substr(body, p - body);
      apply_whitespace_control(text, sign, false);
      emit_data(text, body);
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    fail("missing end of raw directive", tag_pos);
  }

  void lex_comment(size_t from, size_t tag_pos) {
    for (size_t p = from; p < src_.size(); ++p) {
      size_t end = std::string::npos;
      if ((src_[p] == '+' || src_[p] == '-') && at_str(p + 1, "#}")) {
        end = src_[p] == '-' ? skip_spaces(p + 3) : p + 3;
      } else if (at_str(p, "#}")) {
        end = p + 2 < src_.size() && src_[p + 2] == '\n' ? p + 3 : p + 2;
      }
      if (end != std::string::npos) {
        line_starting_ = src_[end - 1] == '\n';
        pos_ = end;
        return;
      }
    }
    fail("missing end of comment tag", tag_pos);
  }

  void lex_tag(bool block) {
    std::vector<char> brackets;  // an end delimiter only counts outside (), [] and {}
    while (true) {
      if (pos_ >= src_.size())
        fail(block ? "unexpected end of template inside a {% %} tag"
                   : "unexpected end of template inside a {{ }} tag",
             pos_);
      if (brackets.empty()) {
        size_t end = block ? match_block_end(pos_, "%}") : std::string::npos;
        if (!block) {
          if (src_[pos_] == '-' && at_str(pos_ + 1, "}}"))
            end = skip_spaces(pos_ + 3);
          else if (at_str(pos_, "}}"))
            end = pos_ + 2;
        }
        if (end != std::string::npos) {
          push(block ? TokenType::BlockEnd : TokenType::VarEnd, "", pos_);
          line_starting_ = src_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      char c = src_[pos_];
      if (ascii_space(c)) {
        ++pos_;
      } else if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t start = pos_;
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        push(TokenType::Name, src_.substr(start, pos_ - start), start);
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        lex_operator(brackets);
      }
    }
  }

  // Digits with single underscores between them: (\d+_)*\d+
  size_t scan_digits(size_t p) const {
    if (p >= src_.size() || !is_digit(src_[p])) return std::string::npos;
    while (true) {
      while (p < src_.size() && is_digit(src_[p])) ++p;
      if (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1])) {
        ++p;
        continue;
      }
      return p;
    }
  }

  void lex_number() {
    size_t start = pos_;
    // Floats first, as jinja2 tries them first: digits then a fraction and/or an exponent.
    bool after_dot = start > 0 && src_[start - 1] == '.';
    size_t p = scan_digits(start);
    size_t float_end = std::string::npos;
    if (!after_dot) {
      size_t q = p;
      bool frac = false;
      if (q < src_.size() && src_[q] == '.') {
        size_t f = scan_digits(q + 1);
        if (f != std::string::npos) q = f, frac = true;
      }
      size_t e = std::string::npos;
      if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
        size_t s = q + 1;
        if (s < src_.size() && (src_[s] == '+' || src_[s] == '-')) ++s;
        e = scan_digits(s);
      }
      if (e != std::string::npos)
        float_end = e;
      else if (frac)
        float_end = q;
    }
    auto clean = [&](size_t end) {
      std::string s = src_.substr(start, end - start);
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    if (float_end != std::string::npos) {
      std::string text = clean(float_end);
      Token t{TokenType::Float, text, line_at(start)};
      t.float_value = std::strtod(text.c_str(), nullptr);
      tokens_.push_back(std::move(t));
      pos_ = float_end;
      return;
    }
    int base = 10;
    size_t digits_start = start;
    if (src_[start] == '0' && start + 1 < src_.size()) {
      char x = static_cast<char>(src_[start + 1] | 0x20);
      if (x == 'x')
        base = 16;
      else if (x == 'o')
        base = 8;
      else if (x == 'b')
        base = 2;
      if (base != 10) digits_start = start + 2;
    }
    size_t end;
    if (base == 10) {
      end = src_[start] == '0' ? start + 1 : p;
      if (src_[start] == '0')  // 0(_?0)*
        while (end < src_.size() &&
               (src_[end] == '0' ||
                (src_[end] == '_' && end + 1 < src_.size() && src_[end + 1] == '0')))
          ++end;
    } else {
      end = digits_start;
      auto valid = [&](char ch) {
        ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        return base == 16 ? std::isxdigit(static_cast<unsigned char>(ch)) != 0
                          : (ch >= '0' && ch < static_cast<char>('0' + base));
      };
      while (end < src_.size() && (valid(src_[end]) || (src_[end] == '_' && end + 1 < src_.size() &&
                                                        valid(src_[end + 1]))))
        ++end;
      if (end == digits_start) fail("invalid integer literal", start);
    }
    std::string text = clean(end);
    Token t{TokenType::Integer, text, line_at(start)};
    errno = 0;
    t.int_value = std::strtoll(text.c_str() + (digits_start - start), nullptr, base);
    if (errno == ERANGE) fail("integer literal out of range: " + text, start);
    tokens_.push_back(std::move(t));
    pos_ = end;
  }

  void lex_string() {
    size_t start = pos_;
    char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) fail("unterminated string literal", start);
      char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) fail("unterminated string literal", start);
      char e = src_[pos_ + 1];
      pos_ += 2;
      auto hex = [&](int n) -> char32_t {
        if (pos_ + n > src_.size())
          fail("truncated \\x, \\u or \\U escape in string literal", start);
        char32_t v = 0;
        for (int i = 0; i < n; ++i) {
          char h = src_[pos_ + i];
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail("truncated \\x, \\u or \\U escape in string literal", start);
          v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                 ? h - '0'
                                                 : (h | 0x20) - 'a' + 10);
        }
        pos_ += n;
        return v;
      };
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          pystr::append_utf8(out, hex(2));
          break;
        case 'u':
          pystr::append_utf8(out, hex(4));
          break;
        case 'U':
          pystr::append_utf8(out, hex(8));
          break;
        case 'N':
          fail("\\N{...} escapes are not supported in string literals", start);
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
                 ++i)
              v = v * 8 + static_cast<char32_t>(src_[pos_++] - '0');
            pystr::append_utf8(out, v);
          } else {  // Python keeps unknown escapes as written
            out.push_back('\\');
            --pos_;
          }
      }
    }
    push(TokenType::String, std::move(out), start);
  }

  void lex_operator(std::vector<char>& brackets) {
    static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (at_str(pos_, op)) {
        push(TokenType::Operator, op, pos_);
        pos_ += 2;
        return;
      }
    }
    char c = src_[pos_];
    if (!std::strchr("+-/*%~[](){}><=.:|,;", c) || c == 0)
      fail(fmt::format("unexpected char '{}'", c), pos_);
    if (c == '(') brackets.push_back(')');
    if (c == '[') brackets.push_back(']');
    if (c == '{') brackets.push_back('}');
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail(fmt::format("unexpected '{}'", c), pos_);
      if (brackets.back() != c)
        fail(fmt::format("unexpected '{}', expected '{}'", c, brackets.back()), pos_);
      brackets.pop_back();
    }
    push(TokenType::Operator, std::string(1, c), pos_);
    ++pos_;
  }

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace specula::jinja
