#pragma once
// The test model's vocabulary: a byte-level BPE ("gpt2" model, llama-bpe pre-tokenizer) whose
// merges are learned from the closed text of our niah generator, so that every piece that
// text pre-tokenizes into -- each key word, each template and essay word, each digit group of
// up to three digits -- is exactly one token. Byte-level alone never left chance (DESIGN.md).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace spillway::niahtrain {

struct VocabFile {
    std::string pre = "llama-bpe";
    std::vector<std::string> tokens;  // byte-level form (GPT-2's byte-to-unicode map)
    std::vector<int32_t> types;       // tokenizer.ggml.token_type
    std::vector<std::string> merges;  // "left right", rank order
    int32_t bos = -1, eos = -1;
};

// Learns the vocabulary from `corpus_samples` niah prompts per task (plus fixed digit and
// hex groups). Deterministic.
VocabFile build_vocab(uint32_t corpus_samples);

void save_vocab_json(const VocabFile& vocab, const std::string& path);
VocabFile load_vocab_json(const std::string& path);

// The GGUF tokenizer.* keys for this vocabulary, loaded with our own tokenizer, exactly as
// the engine will load them from the exported model.
Tokenizer make_tokenizer(const VocabFile& vocab);

// Pieces the vocabulary promises to hold as one token, with the reason ("key word", ...).
struct Promise {
    std::string text;
    std::string what;
};
std::vector<Promise> vocab_promises();

}  // namespace spillway::niahtrain
