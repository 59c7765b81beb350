#include "tokenizer/unicode.h"

#include <algorithm>

namespace spillway {
namespace {

bool in_ranges(const CodepointRange* ranges, size_t count, uint32_t cp) {
    const CodepointRange* end = ranges + count;
    // First range whose last >= cp; cp is inside iff that range starts at or before it.
    const CodepointRange* it = std::lower_bound(
        ranges, end, cp, [](const CodepointRange& r, uint32_t value) { return r.last < value; });
    return it != end && it->first <= cp;
}

// Incremental WHATWG UTF-8 decoder state; emit(cp, is_error) receives each code point.
struct Utf8Decoder {
    uint32_t cp = 0;
    int needed = 0;
    int seen = 0;
    uint8_t lower = 0x80;
    uint8_t upper = 0xBF;

    void reset() {
        cp = 0;
        needed = seen = 0;
        lower = 0x80;
        upper = 0xBF;
    }

    // Returns true when `byte` was consumed; false when it must be fed again after the
    // U+FFFD that was emitted for the broken sequence before it.
    template <class Emit>
    bool feed(uint8_t byte, Emit&& emit) {
        if (needed == 0) {
            if (byte < 0x80) {
                emit(byte, false);
            } else if (byte >= 0xC2 && byte <= 0xDF) {
                needed = 1;
                cp = byte & 0x1F;
            } else if (byte >= 0xE0 && byte <= 0xEF) {
                if (byte == 0xE0) lower = 0xA0;  // overlong
                if (byte == 0xED) upper = 0x9F;  // surrogates
                needed = 2;
                cp = byte & 0x0F;
            } else if (byte >= 0xF0 && byte <= 0xF4) {
                if (byte == 0xF0) lower = 0x90;  // overlong
                if (byte == 0xF4) upper = 0x8F;  // above U+10FFFF
                needed = 3;
                cp = byte & 0x07;
            } else {
                emit(kReplacementChar, true);
            }
            return true;
        }
        if (byte < lower || byte > upper) {
            reset();
            emit(kReplacementChar, true);
            return false;
        }
        lower = 0x80;
        upper = 0xBF;
        cp = (cp << 6) | (byte & 0x3F);
        if (++seen == needed) {
            emit(cp, false);
            reset();
        }
        return true;
    }
};

}  // namespace

bool is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(unicode_tables::kLetters, unicode_tables::kLetters_count, cp);
}

bool is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(unicode_tables::kNumbers, unicode_tables::kNumbers_count, cp);
}

bool is_whitespace(uint32_t cp) {
    // The White_Space property (PropList.txt): short and stable, so listed by hand.
    switch (cp) {
        case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20:
        case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
        case 0x202F: case 0x205F: case 0x3000:
            return true;
        default:
            return cp >= 0x2000 && cp <= 0x200A;
    }
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

std::vector<uint32_t> decode_utf8(std::string_view text, std::vector<size_t>* offsets) {
    std::vector<uint32_t> cps;
    cps.reserve(text.size());
    if (offsets) {
        offsets->clear();
        offsets->reserve(text.size() + 1);
    }
    Utf8Decoder decoder;
    size_t sequence_start = 0;
    for (size_t i = 0; i < text.size();) {
        if (decoder.needed == 0) sequence_start = i;
        auto emit = [&](uint32_t cp, bool) {
            cps.push_back(cp);
            if (offsets) offsets->push_back(sequence_start);
            sequence_start = i + 1;
        };
        if (decoder.feed(static_cast<uint8_t>(text[i]), emit)) ++i;
        else sequence_start = i;
    }
    if (decoder.needed != 0) {
        cps.push_back(kReplacementChar);
        if (offsets) offsets->push_back(sequence_start);
    }
    if (offsets) offsets->push_back(text.size());
    return cps;
}

bool is_valid_utf8(std::string_view text) {
    bool valid = true;
    Utf8Decoder decoder;
    for (size_t i = 0; i < text.size() && valid; ++i) {
        bool consumed = decoder.feed(static_cast<uint8_t>(text[i]),
                                     [&](uint32_t, bool error) { valid = valid && !error; });
        valid = valid && consumed;
    }
    return valid && decoder.needed == 0;
}

std::string sanitize_utf8(std::string_view text) {
    if (is_valid_utf8(text)) return std::string(text);
    std::string out;
    out.reserve(text.size() + 8);
    for (uint32_t cp : decode_utf8(text)) append_utf8(out, cp);
    return out;
}

size_t utf8_incomplete_tail(std::string_view text) {
    // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
    size_t n = text.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        uint8_t byte = static_cast<uint8_t>(text[n - back]);
        if ((byte & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
        size_t length = utf8_sequence_length(byte);
        if (length <= back) return 0;  // complete (or a lone invalid byte)
        // Incomplete: hold it back only if the bytes so far could still become valid.
        Utf8Decoder decoder;
        bool ok = true;
        for (size_t k = n - back; k < n && ok; ++k)
            ok = decoder.feed(static_cast<uint8_t>(text[k]), [&](uint32_t, bool) { ok = false; });
        return ok && decoder.needed != 0 ? back : 0;
    }
    return 0;
}

}  // namespace spillway
