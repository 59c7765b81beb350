#pragma once
// The Llama/Qwen2 weights the CPU forward pass reads: views into a mapped GGUF file (or
// into buffers a test or benchmark owns), plus norms and biases widened to f32 at load.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/matmul.h"
#include "engine/cpu/rope.h"
#include "model/model_spec.h"

namespace spillway {

class GgufFile;

struct CpuLayerWeights {
    std::vector<float> attn_norm;           // n_embd
    WeightMatrix wq, wk, wv, wo;
    std::vector<float> bq, bk, bv;          // empty when the model has no QKV bias
    std::vector<float> ffn_norm;            // n_embd
    WeightMatrix ffn_gate, ffn_up, ffn_down;
};

struct CpuModel {
    ModelSpec spec;
    uint32_t n_head_kv = 0;                 // same for every layer (checked at load)
    WeightMatrix token_embd;                // n_vocab rows of n_embd
    WeightMatrix output;                    // the head: token_embd itself when tied
    std::vector<float> output_norm;
    std::vector<CpuLayerWeights> layers;
    RopeTables rope;
    std::shared_ptr<const GgufFile> file;   // keeps the mapping alive (null for in-memory models)
    std::vector<std::vector<uint8_t>> owned;  // weight bytes owned by in-memory models
};

// Binds every tensor of a llama/qwen2 GGUF (names as llama.cpp writes them) after checking
// each one's shape against the spec. Throws spillway::Error naming the tensor on mismatch.
CpuModel load_cpu_model(std::shared_ptr<const GgufFile> file, const ModelSpec& spec);

// Finishes a model whose matrices a caller bound itself (tests, benchmarks): checks shapes
// and builds the RoPE tables.
void finish_cpu_model(CpuModel& model);

// Bytes one decode step reads: every weight once (the tied head counted once more, since
// it is read as embedding row and as the head) plus K and V of `n_cells` cells.
uint64_t decode_bytes_per_token(const CpuModel& model, uint64_t n_cells, KvType k_type, KvType v_type);

}  // namespace spillway

namespace spillway {

// Opens a GGUF file, reads its ModelSpec and binds the weights (what `run` does).
CpuModel load_cpu_model_file(const std::string& path);

}  // namespace spillway
