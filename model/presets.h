#pragma once
// Preset model shapes for make-model, plan and bench: real architectures' metadata and
// tensor tables (no data), so ModelSpec, weight bytes and KV sizes are exactly those of
// the real model with the chosen weight type.
#include <string>
#include <vector>

#include "gguf/ggml_types.h"
#include "gguf/gguf.h"

namespace spillway {

// "tiny", "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-14b" (the -1M model's shape), "llama3-8b".
std::vector<std::string> preset_names();

// Metadata (incl. tokenizer vocab) and tensor infos of a preset with weights of `wtype`
// (f32, f16, bf16 or q8_0; 1-D tensors such as norms stay f32). Throws on an unknown name.
GgufHeader preset_header(const std::string& name, GgmlType wtype);

}  // namespace spillway
