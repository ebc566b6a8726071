// GPT-2's byte-level alphabet: each of the 256 byte values is shown as a printable Unicode
// character (printable Latin-1 bytes as themselves, the rest as U+0100.. in byte order), so that a
// BPE vocabulary of strings covers arbitrary bytes. "Ġ" (U+0120) is the space byte.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace specula::byte_level {

// Appends the byte-level characters (as UTF-8) of every byte of `bytes` to `out`.
void encode(std::string_view bytes, std::string& out);
std::string encode(std::string_view bytes);

// Undoes encode(): the raw bytes behind a byte-level token, or nullopt when `token` holds a
// character outside the alphabet (added tokens such as "<｜User｜>" are not byte-level).
std::optional<std::string> decode(std::string_view token);

}  // namespace specula::byte_level
