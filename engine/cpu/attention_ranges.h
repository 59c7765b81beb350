#pragma once
// Additions to attention.h for the CPU forward pass: the same partial attention restricted
// to a range of KV heads, so threads can split the work by head (each writes only its
// heads' rows of out / lse), over any KvFormat (the tiers, or the f32 reference cache).
#include <cstdint>

#include "engine/cpu/attention.h"
#include "kv/kv_codec.h"

namespace spillway {

void attention_partial_cpu_kv_heads(const AttentionShape& shape, const float* q, KvFormat k_type,
                                    const uint8_t* k_cells, KvFormat v_type, const uint8_t* v_cells,
                                    uint32_t n_cells, uint32_t kv_head_begin, uint32_t kv_head_end,
                                    float* out, float* lse);

}  // namespace spillway
