#pragma once
// Our converter from a Hugging Face tokenizer.json (plus, optionally, its
// tokenizer_config.json) to GGUF vocabulary metadata: the tokenizer.* keys llama.cpp's
// convert_hf_to_gguf.py writes, so a vocab built here loads exactly like one from a
// downloaded GGUF. Supports the two families we run: byte-level BPE (Qwen2, Llama 3) and
// SentencePiece-style BPE with byte fallback (Llama 2, Mistral).
#include <string>
#include <string_view>

#include "gguf/gguf.h"

namespace spillway {

// Throws spillway::Error when the JSON is malformed or describes a tokenizer we do not
// implement (WordPiece, Unigram, an unknown pre-tokenizer regex...).
GgufHeader gguf_vocab_from_hf_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json = {});

// Same, from files; `config_path` may be empty.
GgufHeader gguf_vocab_from_hf_files(const std::string& tokenizer_json_path, const std::string& config_path = "");

}  // namespace spillway
