#pragma once
// Text <-> token ids for GGUF vocabularies (byte-level BPE "gpt2" and SentencePiece-style
// "llama"), with special-token parsing, BOS/EOS handling and a streaming decoder.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace spillway {

struct EncodeOptions {
    bool add_special = true;     // BOS/EOS as the vocabulary's add_bos/add_eos say
    bool parse_special = false;  // match control tokens ("<|im_start|>") written in the text;
                                 // user-defined tokens are always matched
};

struct DecodeOptions {
    bool render_special = false;  // write control tokens' text instead of nothing
};

class Tokenizer {
public:
    explicit Tokenizer(const GgufHeader& header);
    explicit Tokenizer(Vocab vocab);

    // Invalid UTF-8 in `text` is read as U+FFFD per maximal invalid subsequence (what
    // JS TextDecoder and Python's errors="replace" do), so ids match those tokenizers.
    std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;

    // Raw bytes of the ids joined (may be invalid UTF-8 if the ids split a character:
    // use StreamDecoder to print). The sentencepiece space prefix that encode() adds
    // at the start and after special tokens is removed again, so for valid UTF-8 text
    // decode(encode(text, {.add_special = false, .parse_special = true}), {.render_special = true}) == text.
    std::string decode(const std::vector<int32_t>& ids, const DecodeOptions& options = {}) const;

    // One token's bytes; `after_boundary` = it follows the start or a special token
    // (where sentencepiece drops the leading space its encoder added).
    std::string token_bytes(int32_t id, bool after_boundary, const DecodeOptions& options) const;

    const Vocab& vocab() const { return vocab_; }
    int32_t bos() const { return vocab_.bos; }
    int32_t eos() const { return vocab_.eos; }
    // True for tokens that end a generated turn (EOS, EOT such as <|im_end|>, <|eot_id|>).
    bool is_end_of_generation(int32_t id) const;

private:
    struct Fragment {
        bool is_token;
        int32_t id;
        std::string_view text;
    };
    std::vector<Fragment> split_special(std::string_view text, bool parse_special) const;
    void encode_byte_bpe(std::string_view text, std::vector<int32_t>& out) const;
    void encode_sentencepiece(std::string_view text, bool add_prefix, std::vector<int32_t>& out) const;
    void merge_sentencepiece(std::string_view text, std::vector<int32_t>& out) const;

    Vocab vocab_;
    // Tokens matched in raw text, bucketed by first byte, longest first.
    std::vector<int32_t> special_by_first_byte_[256];
};

// Turns a stream of ids into text that never ends inside a UTF-8 character: bytes of an
// incomplete character are held until the next token completes them; bytes that can never
// form a character are replaced by U+FFFD.
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options = {})
        : tokenizer_(tokenizer), options_(options) {}
    std::string push(int32_t id);
    // Flushes what is held; an unfinished character at the end becomes U+FFFD.
    std::string finish();

private:
    const Tokenizer& tokenizer_;
    DecodeOptions options_;
    std::string pending_;
    bool after_boundary_ = true;
};

}  // namespace spillway
