#pragma once
// How a layer's KV cells are stored, on the CPU and on the GPU alike (fixed choice):
// K and V of a layer are each cell-major. Cell c occupies one row of n_head_kv * head_dim
// values in its KvType's GGUF block layout (f16: 2 B/value; q8_0: 34 B per 32; q4_0: 18 B
// per 32), so K row bytes = kv_row_bytes(k_type, n_head_kv * head_dim_k). Blocks never
// straddle heads because head dims are multiples of 32. V is not transposed: attention
// over a contiguous range of cells reads one contiguous byte range of K and of V, which is
// what lets a spilled tail be copied and attended as a unit.
#include <cstdint>

#include "model/model_spec.h"

namespace spillway {

struct LayerKvLayout {
    KvType k_type = KvType::f16;
    KvType v_type = KvType::f16;
    uint32_t n_head_kv = 0;
    uint32_t head_dim_k = 0;
    uint32_t head_dim_v = 0;
    uint64_t k_row_bytes() const { return kv_row_bytes(k_type, (uint64_t)n_head_kv * head_dim_k); }
    uint64_t v_row_bytes() const { return kv_row_bytes(v_type, (uint64_t)n_head_kv * head_dim_v); }
};

}  // namespace spillway
