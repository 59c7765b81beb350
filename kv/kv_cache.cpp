#include "kv/kv_cache.h"

#include <string>

#include "common/error.h"

namespace spillway {

namespace {

KvCache make_cache(const ModelSpec& spec, uint32_t n_ctx, KvType k_type, KvType v_type, KvFormat k_format,
                   KvFormat v_format) {
    if (n_ctx == 0) fail("KV cache: context must be at least 1 cell");
    if (spec.layers.size() != spec.n_layer) fail("KV cache: model spec has no per-layer shapes");
    const bool quantized = k_type != KvType::f16 || v_type != KvType::f16;
    if (quantized && (spec.head_dim_k % 32 != 0 || spec.head_dim_v % 32 != 0))
        fail("KV cache: quantized tiers need head dims that are multiples of 32 (model has " +
             std::to_string(spec.head_dim_k) + "/" + std::to_string(spec.head_dim_v) + ")");
    KvCache cache;
    cache.n_ctx = n_ctx;
    cache.k_type = k_type;
    cache.v_type = v_type;
    cache.k_format = k_format;
    cache.v_format = v_format;
    for (const LayerSpec& layer : spec.layers) {
        LayerKvLayout l;
        l.k_type = k_type;
        l.v_type = v_type;
        l.n_head_kv = layer.n_head_kv;
        l.head_dim_k = spec.head_dim_k;
        l.head_dim_v = spec.head_dim_v;
        cache.layers.push_back(l);
        cache.k.emplace_back(kv_bytes(k_format, (uint64_t)l.n_head_kv * l.head_dim_k) * n_ctx);
        cache.v.emplace_back(kv_bytes(v_format, (uint64_t)l.n_head_kv * l.head_dim_v) * n_ctx);
    }
    return cache;
}

}  // namespace

KvCache make_kv_cache(const ModelSpec& spec, uint32_t n_ctx, KvType k_type, KvType v_type) {
    return make_cache(spec, n_ctx, k_type, v_type, kv_format(k_type), kv_format(v_type));
}

KvCache make_kv_cache_f32(const ModelSpec& spec, uint32_t n_ctx) {
    return make_cache(spec, n_ctx, KvType::f16, KvType::f16, KvFormat::f32, KvFormat::f32);
}

uint64_t kv_k_row_bytes(const KvCache& c, uint32_t layer) {
    const LayerKvLayout& l = c.layers[layer];
    return kv_bytes(c.k_format, (uint64_t)l.n_head_kv * l.head_dim_k);
}

uint64_t kv_v_row_bytes(const KvCache& c, uint32_t layer) {
    const LayerKvLayout& l = c.layers[layer];
    return kv_bytes(c.v_format, (uint64_t)l.n_head_kv * l.head_dim_v);
}

const uint8_t* kv_k_cells(const KvCache& c, uint32_t layer, uint32_t first_cell) {
    return c.k[layer].data() + kv_k_row_bytes(c, layer) * first_cell;
}

const uint8_t* kv_v_cells(const KvCache& c, uint32_t layer, uint32_t first_cell) {
    return c.v[layer].data() + kv_v_row_bytes(c, layer) * first_cell;
}

void kv_write_cell(KvCache& c, uint32_t layer, uint32_t cell, const float* k, const float* v) {
    if (cell >= c.n_ctx) fail("KV cache: cell " + std::to_string(cell) + " beyond context " + std::to_string(c.n_ctx));
    const LayerKvLayout& l = c.layers[layer];
    kv_store_row(c.k_format, k, c.k[layer].data() + kv_k_row_bytes(c, layer) * cell,
                 (size_t)l.n_head_kv * l.head_dim_k);
    kv_store_row(c.v_format, v, c.v[layer].data() + kv_v_row_bytes(c, layer) * cell,
                 (size_t)l.n_head_kv * l.head_dim_v);
}

uint64_t kv_cache_total_bytes(const KvCache& c) {
    uint64_t total = 0;
    for (size_t i = 0; i < c.k.size(); ++i) total += c.k[i].size() + c.v[i].size();
    return total;
}

}  // namespace spillway
