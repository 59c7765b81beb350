#pragma once
// ModelSpec: everything the planner and the engines need to know about a model's shape,
// read from GGUF metadata (llama, qwen2). Plain data plus free functions.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gguf/ggml_types.h"

namespace spillway {

struct GgufHeader;

enum class Arch { llama, qwen2 };
const char* arch_name(Arch arch);

// "normal" rotates adjacent pairs (llama files, whose Q/K rows the converter permuted);
// "neox" rotates the two halves of each head (qwen2).
enum class RopeType { normal, neox };
enum class RopeScaling { none, linear, yarn };

struct RopeSpec {
    RopeType type = RopeType::normal;
    float freq_base = 10000.0f;
    uint32_t n_dims = 0;                 // rotated dims per head (rope.dimension_count; default head_dim_k)
    RopeScaling scaling = RopeScaling::none;
    float scaling_factor = 1.0f;         // linear and YaRN
    uint32_t original_context = 0;       // rope.scaling.original_context_length (YaRN)
    float yarn_ext_factor = -1.0f;       // <0: derive from scaling as llama.cpp does
    float yarn_attn_factor = 1.0f;
    float yarn_beta_fast = 32.0f;
    float yarn_beta_slow = 1.0f;
    float yarn_log_multiplier = 0.0f;    // rope.scaling.yarn_log_multiplier if present
};

// KV cache storage types, in GGUF's own block layouts.
enum class KvType { f16, q8_0, q4_0 };
const char* kv_type_name(KvType type);
std::optional<KvType> kv_type_from_name(const std::string& name);  // "f16", "q8_0", "q4_0"
GgmlType kv_ggml_type(KvType type);
// Bytes to store `n_values` values (n_values a multiple of 32 for the quantized types).
uint64_t kv_row_bytes(KvType type, uint64_t n_values);

struct LayerSpec {
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;
    bool is_local = false;           // sliding-window layer: holds at most swa_window cells
    uint64_t weight_bytes = 0;       // all tensors of this layer (blk.N.*)
};

struct ModelSpec {
    Arch arch = Arch::llama;
    std::string name;                // general.name if present
    uint32_t n_layer = 0;
    uint32_t n_embd = 0;
    uint32_t n_head = 0;             // query heads (first layer; per-layer values in layers)
    uint32_t n_ff = 0;
    uint32_t n_vocab = 0;
    uint32_t n_ctx_train = 0;
    uint32_t head_dim_k = 0;         // attention.key_length or n_embd / n_head
    uint32_t head_dim_v = 0;         // attention.value_length or n_embd / n_head
    float norm_eps = 1e-5f;
    RopeSpec rope;
    uint32_t swa_window = 0;         // 0: no sliding-window layers
    bool tied_embeddings = false;    // no output.weight: the head reuses token_embd
    bool has_qkv_bias = false;
    std::vector<LayerSpec> layers;

    // Weight bytes, derived from the tensor table.
    uint64_t weight_bytes_total = 0;
    uint64_t weight_bytes_non_layer = 0;              // embeddings, output norm, head
    uint64_t weight_bytes_token_embd = 0;             // the embedding table alone
    std::map<GgmlType, uint64_t> weight_bytes_by_type;
    std::map<GgmlType, uint64_t> tensor_count_by_type;

    // Things that are legal but limit what spillway can do with the model (e.g. a head dim
    // that is not a multiple of 32 rules out the quantized KV tiers). Shown by `info`.
    std::vector<std::string> notes;
};

// Builds and validates a ModelSpec from GGUF metadata and the tensor table (no tensor data
// is read). Throws spillway::Error listing every missing or inconsistent key at once.
ModelSpec model_spec_from_gguf(const GgufHeader& header);

// Whether every layer's K and V rows split into whole blocks of `type` (head dims that are
// multiples of 32 for q8_0 / q4_0). The planner skips tiers for which this is false.
bool kv_type_fits(const ModelSpec& spec, KvType type);

// KV bytes one cell (one token position) takes in layer `layer` for K type `k`, V type `v`.
uint64_t layer_kv_bytes_per_cell(const ModelSpec& spec, uint32_t layer, KvType k, KvType v);
// Summed over all layers (each layer counted once per cell).
uint64_t kv_bytes_per_cell(const ModelSpec& spec, KvType k, KvType v);
// Whole cache for `n_ctx` cells: local (sliding-window) layers hold min(n_ctx, swa_window).
uint64_t kv_cache_bytes(const ModelSpec& spec, uint64_t n_ctx, KvType k, KvType v);

}  // namespace spillway
