// --api-key checks: `Authorization: Bearer <key>`, the scheme in any case (RFC 7235), the key
// compared in constant time so that the time of a refusal says nothing about how much of a
// guess was right.
#pragma once

#include <string>
#include <string_view>

namespace specula::server {

// True when `authorization` (the header's value) is "Bearer <key>" for exactly this key.
bool bearer_token_matches(std::string_view authorization, std::string_view key);

// Compares every byte of `expected` whatever `given` holds; only the length can differ in time.
bool constant_time_equals(std::string_view given, std::string_view expected);

}  // namespace specula::server
