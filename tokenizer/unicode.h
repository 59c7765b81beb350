#pragma once
// The small slice of Unicode the tokenizers need: UTF-8 decoding that replaces invalid
// bytes the way the WHATWG decoder does (so ids match JS/Python tokenizers fed the same
// bytes), and the general categories the pre-tokenizer regexes test (\p{L}, \p{N}, \s).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spillway {

struct CodepointRange {
    uint32_t first;
    uint32_t last;  // inclusive
};

namespace unicode_tables {
extern const CodepointRange kLetters[];
extern const size_t kLetters_count;
extern const CodepointRange kNumbers[];
extern const size_t kNumbers_count;
extern const char kUnicodeVersion[];
}  // namespace unicode_tables

constexpr uint32_t kReplacementChar = 0xFFFD;

bool is_letter(uint32_t cp);      // \p{L}
bool is_number(uint32_t cp);      // \p{N}
bool is_whitespace(uint32_t cp);  // Unicode White_Space, what \s means in Rust/Oniguruma

void append_utf8(std::string& out, uint32_t cp);

// Decodes UTF-8, replacing each maximal invalid subsequence by U+FFFD (the WHATWG / Unicode
// "substitution of maximal subparts" practice that TextDecoder and Python's
// errors="replace" follow). Returns the code points and, in `offsets` if given, the byte
// offset of each one in `text` plus a final entry text.size().
std::vector<uint32_t> decode_utf8(std::string_view text, std::vector<size_t>* offsets = nullptr);

// `text` with invalid sequences replaced by U+FFFD; returns `text` unchanged when valid.
std::string sanitize_utf8(std::string_view text);
bool is_valid_utf8(std::string_view text);

// How many bytes at the end of `text` are the valid beginning of a UTF-8 sequence that
// is still missing continuation bytes (0..3). A streaming decoder holds those back.
size_t utf8_incomplete_tail(std::string_view text);

// Byte length of the UTF-8 sequence starting with `lead` (1 for invalid lead bytes, so a
// scanner always advances).
inline size_t utf8_sequence_length(uint8_t lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    if (lead >= 0xE0) return lead <= 0xEF ? 3 : 1;
    if (lead >= 0xC2) return 2;
    return 1;
}

}  // namespace spillway
