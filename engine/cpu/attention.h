#pragma once
// Single-query attention over a contiguous range of KV cells, returning a partial result
// (output normalised by its own softmax sum, plus the log-sum-exp of its scaled scores), and
// the merge of partials. One pass over all cells == split into ranges + merge: the CUDA
// flash-decoding kernels and the spilled cache (resident window + streamed tail) use
// exactly this split, and this is their reference.
#include <cstdint>

#include "kv/kv_layout.h"

namespace spillway {

struct AttentionShape {
    uint32_t n_head = 0;      // query heads
    uint32_t n_head_kv = 0;   // KV heads; query head h uses KV head h / (n_head / n_head_kv)
    uint32_t head_dim_k = 0;
    uint32_t head_dim_v = 0;
    float scale = 0.0f;       // usually 1/sqrt(head_dim_k)
};

// q: [n_head][head_dim_k] f32. k_cells / v_cells: n_cells rows in the layout of kv_layout.h.
// out: [n_head][head_dim_v] f32 (normalised within this range); lse: [n_head], natural log.
// n_cells == 0 gives out = 0 and lse = -inf (the merge identity).
void attention_partial_cpu(const AttentionShape& shape, const float* q, KvType k_type,
                           const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                           uint32_t n_cells, float* out, float* lse);

// Merges partial b into a, in place: a := softmax-weighted combination of a and b.
void attention_merge_cpu(uint32_t n_head, uint32_t head_dim_v, float* out_a, float* lse_a,
                         const float* out_b, const float* lse_b);

}  // namespace spillway
