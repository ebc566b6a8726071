#include "server/api_key.h"

#include <cctype>

namespace specula::server {

bool constant_time_equals(std::string_view given, std::string_view expected) {
  // volatile: the compiler may not turn the loop into an early-exit memcmp.
  volatile unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

bool bearer_token_matches(std::string_view authorization, std::string_view key) {
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  std::string_view rest = authorization.substr(kScheme.size());
  if (rest.front() != ' ' && rest.front() != '\t') return false;
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t')) rest.remove_suffix(1);
  return constant_time_equals(rest, key);
}

}  // namespace specula::server
