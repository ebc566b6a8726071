// Python str semantics over UTF-8 std::string: templates index, slice, strip and split strings
// by code point and with Python's notion of whitespace, so byte-wise std::string operations would
// render non-ASCII content differently from transformers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specula::jinja::pystr {

std::u32string decode(std::string_view utf8);
std::string encode(std::u32string_view cps);
void append_utf8(std::string& out, char32_t cp);
size_t length(std::string_view utf8);  // in code points, as len() counts

bool is_space(char32_t cp);  // str.isspace() for one code point

enum class Side { Both, Left, Right };
// str.strip/lstrip/rstrip; `chars` is the set of code points to remove (nullopt: whitespace).
std::string strip(std::string_view s, const std::optional<std::string>& chars, Side side);
// str.split / str.rsplit; sep nullopt splits on whitespace runs. maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old_sub, std::string_view new_sub,
                    int64_t count);
// str.count / str.find / str.rfind in code point positions (-1 when absent).
int64_t count(std::string_view s, std::string_view sub);
int64_t find(std::string_view s, std::string_view sub, bool from_right);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // first code point title-cased, the rest lower
std::string title(std::string_view s);       // str.title()
std::string swapcase(std::string_view s);

// str.isdigit / isalpha / isalnum / isspace / islower / isupper over the whole string.
bool is_digit(std::string_view s);
bool is_alpha(std::string_view s);
bool is_alnum(std::string_view s);
bool is_all_space(std::string_view s);
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);

// repr() of a str: Python's choice of quotes and escapes.
std::string repr(std::string_view s);

}  // namespace specula::jinja::pystr
