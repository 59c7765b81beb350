#pragma once
// Byte geometry of one head's K or V slice in the cache's block formats, shared by the decode
// and prefill attention kernels that copy cells into shared-memory tiles (cp.async).
#include <cstddef>
#include <cstdint>

#include "model/model_spec.h"

namespace spillway::kv_tile {

// Bytes of one head's d values in a cell: f16 2 B/value, q8_0 34 B and q4_0 18 B per 32.
__host__ __device__ constexpr uint32_t slice_bytes(KvType type, int d) {
    return type == KvType::f16 ? d * 2 : type == KvType::q8_0 ? d / 32 * 34 : d / 32 * 18;
}
// The widest cp.async chunk (16, 8 or 4 bytes) that tiles a slice exactly.
__host__ __device__ constexpr uint32_t copy_chunk(uint32_t slice) {
    return slice % 16 == 0 ? 16 : slice % 8 == 0 ? 8 : 4;
}
__host__ __device__ constexpr size_t align128(size_t n) { return (n + 127) / 128 * 128; }

}  // namespace spillway::kv_tile
