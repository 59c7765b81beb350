#include "tokenizer/pretokenize.h"

#include <cstdint>

#include "common/error.h"
#include "tokenizer/unicode.h"

namespace spillway {
namespace {

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 4, kNewline = 8 };

uint8_t classify(uint32_t cp) {
    if (cp == '\r' || cp == '\n') return kSpace | kNewline;
    if (is_whitespace(cp)) return kSpace;
    if (is_letter(cp)) return kLetter;
    if (is_number(cp)) return kNumber;
    return kOther;
}

uint32_t ascii_lower(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp; }

struct Matcher {
    const std::vector<uint32_t>& cps;
    const std::vector<uint8_t>& cls;
    size_t n;

    bool is(size_t i, uint8_t mask) const { return i < n && (cls[i] & mask) != 0; }
    bool is_punct(size_t i) const { return i < n && (cls[i] & (kLetter | kNumber | kSpace)) == 0; }

    // 's 't 're 've 'm 'll 'd; `ignore_case` for the (?i:...) form.
    size_t contraction(size_t i, bool ignore_case) const {
        if (cps[i] != '\'' || i + 1 >= n) return 0;
        auto at = [&](size_t k) { return ignore_case ? ascii_lower(cps[k]) : cps[k]; };
        uint32_t a = at(i + 1);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (i + 2 < n) {
            uint32_t b = at(i + 2);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        }
        return 0;
    }

    size_t run(size_t i, uint8_t mask) const {
        size_t j = i;
        while (is(j, mask)) ++j;
        return j - i;
    }

    // \s*[\r\n]+ : up to the last newline of the whitespace run starting at i.
    size_t space_to_newline(size_t i) const {
        size_t end = i + run(i, kSpace);
        for (size_t k = end; k > i; --k)
            if (cls[k - 1] & kNewline) return k - i;
        return 0;
    }

    // \s+(?!\S)|\s+ : a whitespace run, leaving its last char to prefix the next word
    // unless the run ends the text.
    size_t space_run(size_t i) const {
        size_t length = run(i, kSpace);
        if (i + length < n && length > 1) return length - 1;
        return length;
    }

    size_t match_qwen_llama(size_t i, size_t max_digits) const {
        if (size_t m = contraction(i, true)) return m;
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if (is(i, kLetter)) return run(i, kLetter);
        if (!is(i, kLetter | kNumber | kNewline) && is(i + 1, kLetter)) return 1 + run(i + 1, kLetter);
        if (is(i, kNumber)) {
            size_t m = run(i, kNumber);
            return m < max_digits ? m : max_digits;
        }
        //  ?[^\s\p{L}\p{N}]+[\r\n]*
        size_t start = (cps[i] == ' ' && is_punct(i + 1)) ? i + 1 : i;
        if (is_punct(start)) {
            size_t j = start;
            while (is_punct(j)) ++j;
            while (is(j, kNewline)) ++j;
            return j - i;
        }
        if (size_t m = space_to_newline(i)) return m;
        return space_run(i);  // i is whitespace here: every other class matched above
    }

    size_t match_gpt2(size_t i) const {
        if (size_t m = contraction(i, false)) return m;
        size_t start = (cps[i] == ' ' && i + 1 < n) ? i + 1 : i;
        if (is(start, kLetter)) return start - i + run(start, kLetter);
        if (is(start, kNumber)) return start - i + run(start, kNumber);
        if (is_punct(start)) {
            size_t j = start;
            while (is_punct(j)) ++j;
            return j - i;
        }
        return space_run(i);
    }
};

}  // namespace

PreTokenizer pre_tokenizer_from_name(std::string_view name) {
    if (name == "qwen2" || name == "deepseek-r1-qwen") return PreTokenizer::qwen2;
    if (name == "llama-bpe" || name == "llama3" || name == "smaug-bpe") return PreTokenizer::llama3;
    if (name == "default" || name == "gpt2" || name.empty()) return PreTokenizer::gpt2;
    fail("tokenizer: unsupported pre-tokenizer tokenizer.ggml.pre = \"" + std::string(name) +
         "\" (supported: qwen2, llama-bpe, default)");
}

std::vector<std::string_view> pretokenize(std::string_view text, PreTokenizer kind) {
    std::vector<size_t> offsets;
    std::vector<uint32_t> cps = decode_utf8(text, &offsets);
    std::vector<uint8_t> cls(cps.size());
    for (size_t i = 0; i < cps.size(); ++i) cls[i] = classify(cps[i]);
    Matcher matcher{cps, cls, cps.size()};

    std::vector<std::string_view> pieces;
    for (size_t i = 0; i < cps.size();) {
        size_t length = 0;
        switch (kind) {
            case PreTokenizer::qwen2: length = matcher.match_qwen_llama(i, 1); break;
            case PreTokenizer::llama3: length = matcher.match_qwen_llama(i, 3); break;
            case PreTokenizer::gpt2: length = matcher.match_gpt2(i); break;
        }
        if (length == 0) length = 1;  // cannot happen with these patterns; never loop forever
        pieces.push_back(text.substr(offsets[i], offsets[i + length] - offsets[i]));
        i += length;
    }
    return pieces;
}

}  // namespace spillway
