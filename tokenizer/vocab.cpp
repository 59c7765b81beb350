#include "tokenizer/vocab.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/unicode.h"

namespace spillway {
namespace {

const GgufValue* find_array(const GgufHeader& header, const char* key, GgufValueType element,
                            bool required) {
    const GgufValue* value = header.find(key);
    if (!value) {
        if (required) fail(std::string("tokenizer: GGUF metadata lacks ") + key);
        return nullptr;
    }
    if (value->type != GgufValueType::ARRAY)
        fail(std::string("tokenizer: ") + key + " is a " + gguf_value_type_name(value->type) +
             ", expected an array");
    bool numeric_ok = element != GgufValueType::STRING && value->array_type != GgufValueType::STRING &&
                      value->array_type != GgufValueType::ARRAY;
    if (value->array_type != element && !numeric_ok)
        fail(std::string("tokenizer: ") + key + " holds " + gguf_value_type_name(value->array_type) +
             ", expected " + gguf_value_type_name(element));
    return value;
}

std::string get_string(const GgufHeader& header, const char* key, const std::string& fallback) {
    const GgufValue* value = header.find(key);
    if (!value) return fallback;
    if (value->type != GgufValueType::STRING)
        fail(std::string("tokenizer: ") + key + " is not a string");
    return value->s;
}

bool get_bool(const GgufHeader& header, const char* key, bool fallback) {
    const GgufValue* value = header.find(key);
    if (!value) return fallback;
    if (value->type == GgufValueType::BOOL) return value->b;
    if (auto u = value->as_uint()) return *u != 0;
    fail(std::string("tokenizer: ") + key + " is not a bool");
}

int32_t get_token_id(const GgufHeader& header, const char* key, int32_t n_tokens) {
    const GgufValue* value = header.find(key);
    if (!value) return -1;
    auto id = value->as_int();
    // Some converters write -1 (as int32) or UINT32_MAX for "none".
    if (id && (*id == -1 || *id == 0xFFFFFFFFll)) return -1;
    if (!id || *id < 0 || *id >= n_tokens)
        fail(std::string("tokenizer: ") + key + " is not a token id below " + std::to_string(n_tokens));
    return static_cast<int32_t>(*id);
}

int32_t lookup(const Vocab& vocab, std::string_view text) {
    auto it = vocab.ids.find(text);
    return it == vocab.ids.end() ? -1 : it->second;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t byte) {
    // Printable Latin-1 bytes stand for themselves; the rest are moved to 256.. in order.
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    if (printable(byte)) return byte;
    uint32_t shifted = 256;
    for (int b = 0; b < byte; ++b)
        if (!printable(b)) ++shifted;
    return shifted;
}

int byte_from_codepoint(uint32_t cp) {
    static const auto table = [] {
        std::array<int16_t, 324> t{};
        t.fill(-1);
        for (int b = 0; b < 256; ++b) t[byte_to_codepoint(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
        return t;
    }();
    return cp < table.size() ? table[cp] : -1;
}

Vocab load_vocab(const GgufHeader& header) {
    Vocab vocab;
    std::string model = get_string(header, "tokenizer.ggml.model", "");
    if (model == "gpt2") vocab.kind = VocabKind::byte_bpe;
    else if (model == "llama") vocab.kind = VocabKind::sentencepiece;
    else if (model.empty()) fail("tokenizer: GGUF metadata lacks tokenizer.ggml.model");
    else fail("tokenizer: unsupported tokenizer.ggml.model \"" + model + "\" (supported: gpt2, llama)");

    const GgufValue* tokens = find_array(header, "tokenizer.ggml.tokens", GgufValueType::STRING, true);
    if (tokens->array.empty()) fail("tokenizer: tokenizer.ggml.tokens is empty");
    if (tokens->array.size() > 0x7FFFFFFF) fail("tokenizer: tokenizer.ggml.tokens is too large");
    const auto n = static_cast<int32_t>(tokens->array.size());
    vocab.tokens.reserve(n);
    vocab.ids.reserve(n);
    for (int32_t id = 0; id < n; ++id) {
        vocab.tokens.push_back(tokens->array[id].s);
        // First id wins for duplicate strings, as in llama.cpp.
        vocab.ids.emplace(vocab.tokens.back(), id);
        vocab.max_token_bytes = std::max(vocab.max_token_bytes, vocab.tokens.back().size());
    }

    vocab.types.assign(n, TokenType::normal);
    if (const GgufValue* types = find_array(header, "tokenizer.ggml.token_type", GgufValueType::INT32, false)) {
        if (static_cast<int64_t>(types->array.size()) != n)
            fail("tokenizer: tokenizer.ggml.token_type has " + std::to_string(types->array.size()) +
                 " entries for " + std::to_string(n) + " tokens");
        for (int32_t id = 0; id < n; ++id) {
            auto t = types->array[id].as_int();
            if (!t || *t < 0 || *t > 6) fail("tokenizer: bad tokenizer.ggml.token_type of token " + std::to_string(id));
            vocab.types[id] = static_cast<TokenType>(*t);
        }
    }

    vocab.scores.assign(n, 0.0f);
    if (const GgufValue* scores = find_array(header, "tokenizer.ggml.scores", GgufValueType::FLOAT32, false)) {
        if (static_cast<int64_t>(scores->array.size()) != n)
            fail("tokenizer: tokenizer.ggml.scores has " + std::to_string(scores->array.size()) +
                 " entries for " + std::to_string(n) + " tokens");
        for (int32_t id = 0; id < n; ++id) {
            auto f = scores->array[id].as_float();
            if (!f) fail("tokenizer: bad tokenizer.ggml.scores entry " + std::to_string(id));
            vocab.scores[id] = static_cast<float>(*f);
        }
    }

    vocab.byte_token.fill(-1);
    if (vocab.kind == VocabKind::byte_bpe) {
        vocab.pre_name = get_string(header, "tokenizer.ggml.pre", "default");
        vocab.pre = pre_tokenizer_from_name(vocab.pre_name);
        vocab.ignore_merges = vocab.pre == PreTokenizer::llama3;
        for (int b = 0; b < 256; ++b) {
            std::string text;
            append_utf8(text, byte_to_codepoint(static_cast<uint8_t>(b)));
            vocab.byte_token[b] = lookup(vocab, text);
        }
        const GgufValue* merges = find_array(header, "tokenizer.ggml.merges", GgufValueType::STRING, true);
        vocab.merges.reserve(merges->array.size());
        for (size_t rank = 0; rank < merges->array.size(); ++rank) {
            const std::string& merge = merges->array[rank].s;
            // Byte-level tokens never contain a real space (it is mapped to 'Ġ').
            size_t space = merge.find(' ', 1);
            if (space == std::string::npos)
                fail("tokenizer: tokenizer.ggml.merges entry " + std::to_string(rank) + " has no space: \"" + merge + "\"");
            std::string_view left(merge.data(), space);
            std::string_view right(merge.data() + space + 1, merge.size() - space - 1);
            int32_t l = lookup(vocab, left), r = lookup(vocab, right);
            int32_t result = lookup(vocab, merge.substr(0, space) + std::string(right));
            if (l < 0 || r < 0 || result < 0) continue;  // unusable merge: HF ignores it too
            uint64_t key = (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r);
            vocab.merges.emplace(key, MergeResult{static_cast<int32_t>(rank), result});
        }
    } else {
        for (int b = 0; b < 256; ++b) {
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", b);
            vocab.byte_token[b] = lookup(vocab, name);
        }
        vocab.add_space_prefix = get_bool(header, "tokenizer.ggml.add_space_prefix", true);
        vocab.merge_barrier.fill(true);
        for (const std::string& token : vocab.tokens) {
            if (token.size() < 2) continue;
            for (char c : token)
                if (static_cast<uint8_t>(c) < 128) vocab.merge_barrier[static_cast<uint8_t>(c)] = false;
        }
    }

    vocab.bos = get_token_id(header, "tokenizer.ggml.bos_token_id", n);
    vocab.eos = get_token_id(header, "tokenizer.ggml.eos_token_id", n);
    vocab.eot = get_token_id(header, "tokenizer.ggml.eot_token_id", n);
    vocab.unk = get_token_id(header, "tokenizer.ggml.unknown_token_id", n);
    vocab.pad = get_token_id(header, "tokenizer.ggml.padding_token_id", n);
    if (vocab.unk < 0) {
        for (int32_t id = 0; id < n && vocab.unk < 0; ++id)
            if (vocab.types[id] == TokenType::unknown) vocab.unk = id;
    }
    if (vocab.eot < 0) {
        // Chat models end a turn with these even when EOS is another token.
        for (const char* name : {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"})
            if (int32_t id = lookup(vocab, name); id >= 0 && vocab.eot < 0) vocab.eot = id;
    }
    // llama.cpp's defaults when the keys are absent: SentencePiece and Llama 3 add BOS.
    bool default_bos = vocab.kind == VocabKind::sentencepiece || vocab.pre == PreTokenizer::llama3;
    vocab.add_bos = get_bool(header, "tokenizer.ggml.add_bos_token", default_bos) && vocab.bos >= 0;
    vocab.add_eos = get_bool(header, "tokenizer.ggml.add_eos_token", false) && vocab.eos >= 0;
    vocab.chat_template = get_string(header, "tokenizer.chat_template", "");
    return vocab;
}

}  // namespace spillway
