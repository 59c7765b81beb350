#pragma once
// The regex pre-tokenizers of byte-level BPE vocabularies, written as direct matchers
// over code points (no regex engine): each splits text into the pieces BPE then merges
// inside. The regexes they implement, as HF tokenizer.json files spell them:
//   qwen2:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
//           | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   llama3: the same with \p{N}{1,3} in place of \p{N}
//   gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
#include <string>
#include <string_view>
#include <vector>

namespace spillway {

enum class PreTokenizer { gpt2, qwen2, llama3 };

// Maps a GGUF tokenizer.ggml.pre value ("qwen2", "llama-bpe", "default", ...) to a
// matcher; throws spillway::Error naming the value when we do not implement it.
PreTokenizer pre_tokenizer_from_name(std::string_view name);

// Splits valid UTF-8 `text` into consecutive pieces that cover it exactly.
std::vector<std::string_view> pretokenize(std::string_view text, PreTokenizer kind);

}  // namespace spillway
