#pragma once
// A tokenizer vocabulary as GGUF files describe it (the tokenizer.ggml.* keys written by
// llama.cpp's converters and by our own tokenizer.json converter), loaded into the lookup
// structures encoding needs.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenize.h"

namespace spillway {

struct GgufHeader;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
    undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

// tokenizer.ggml.model: "gpt2" is byte-level BPE with merge ranks; "llama" is
// SentencePiece-style BPE driven by scores, with ▁ for spaces and <0xXX> byte fallback.
enum class VocabKind { byte_bpe, sentencepiece };

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct MergeResult {
    int32_t rank;    // lower merges first
    int32_t result;  // the merged token
};

struct Vocab {
    VocabKind kind = VocabKind::byte_bpe;
    PreTokenizer pre = PreTokenizer::gpt2;
    std::string pre_name;
    std::vector<std::string> tokens;
    std::vector<TokenType> types;
    std::vector<float> scores;  // sentencepiece only
    TokenIdMap ids;
    // Byte-level BPE: (left id << 32 | right id) -> merge.
    std::unordered_map<uint64_t, MergeResult> merges;
    // Llama 3 looks a whole pre-tokenized piece up before merging (HF "ignore_merges").
    bool ignore_merges = false;

    int32_t bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
    bool add_bos = false;
    bool add_eos = false;
    bool add_space_prefix = true;  // sentencepiece: prefix ▁ to text
    std::string chat_template;

    // Token for each byte value: the byte-level char token (byte_bpe) or <0xXX>
    // (sentencepiece); -1 when the vocabulary lacks it.
    std::array<int32_t, 256> byte_token{};

    // Sentencepiece: ASCII bytes that no multi-byte token contains (e.g. '\n' in Llama 2,
    // which is only <0x0A>). No merge can cross them, so the merge loop runs on the text
    // between them separately and its queue stays small.
    std::array<bool, 128> merge_barrier{};
    size_t max_token_bytes = 0;  // no merge can produce anything longer

    int32_t size() const { return static_cast<int32_t>(tokens.size()); }
    // Tokens that encode() can find written in the text (control and unknown ones only
    // with parse_special); sentencepiece restarts its ▁ prefix after them.
    bool is_matched_in_text(int32_t id) const {
        TokenType t = types[id];
        return t == TokenType::control || t == TokenType::unknown || t == TokenType::user_defined;
    }
};

// Reads and validates the tokenizer.* keys; throws spillway::Error naming the key at fault.
Vocab load_vocab(const GgufHeader& header);

// GPT-2's reversible byte <-> printable code point mapping used by byte-level BPE vocabs.
uint32_t byte_to_codepoint(uint8_t byte);
int byte_from_codepoint(uint32_t cp);  // -1 when cp is not one of the 256

}  // namespace spillway
