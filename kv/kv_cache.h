#pragma once
// The CPU KV cache: per layer, K and V cell-major in their tiers' GGUF block layouts
// (kv_layout.h). Quantize on write, read by attention straight from the blocks. K and V
// types are independent. Allocated once for n_ctx cells.
#include <cstdint>
#include <vector>

#include "kv/kv_codec.h"
#include "kv/kv_layout.h"
#include "model/model_spec.h"

namespace spillway {

struct KvCache {
    uint32_t n_ctx = 0;
    KvType k_type = KvType::f16;
    KvType v_type = KvType::f16;
    KvFormat k_format = KvFormat::f16;  // = the tiers above, or f32 for the exact reference cache
    KvFormat v_format = KvFormat::f16;
    std::vector<LayerKvLayout> layers;  // n_head_kv and head dims per layer
    std::vector<std::vector<uint8_t>> k;  // per layer: n_ctx * k_row bytes
    std::vector<std::vector<uint8_t>> v;  // per layer: n_ctx * v_row bytes
};

// Throws spillway::Error when head dims are not multiples of 32 (quantized tiers) or the
// allocation fails.
KvCache make_kv_cache(const ModelSpec& spec, uint32_t n_ctx, KvType k_type, KvType v_type);
// The exact reference: K and V kept as f32 (tests against float64 references only).
KvCache make_kv_cache_f32(const ModelSpec& spec, uint32_t n_ctx);

uint64_t kv_k_row_bytes(const KvCache& cache, uint32_t layer);
uint64_t kv_v_row_bytes(const KvCache& cache, uint32_t layer);
const uint8_t* kv_k_cells(const KvCache& cache, uint32_t layer, uint32_t first_cell);
const uint8_t* kv_v_cells(const KvCache& cache, uint32_t layer, uint32_t first_cell);

// Stores one cell's K (n_head_kv * head_dim_k values) and V (n_head_kv * head_dim_v) of a layer.
void kv_write_cell(KvCache& cache, uint32_t layer, uint32_t cell, const float* k, const float* v);

// Total bytes the cache holds.
uint64_t kv_cache_total_bytes(const KvCache& cache);

}  // namespace spillway
