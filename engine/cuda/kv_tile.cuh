#pragma once
// Byte geometry of one head's K or V slice in the cache's block formats, the cp.async copies,
// and the q8_0 / q4_0 -> f16 dequantization of eight values, shared by the decode and prefill
// attention kernels that stage cells in shared memory.
#include <cstddef>
#include <cstdint>
#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

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

#ifdef __CUDACC__
// One asynchronous global->shared copy of kBytes (16 bypasses L1; 4 and 8 cache in it).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    if constexpr (kBytes == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(gmem), "n"(kBytes));
    }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Four bytes from two 2-byte aligned halves (q8_0 / q4_0 blocks are 34 / 18 bytes long, so
// their quants are only 2-byte aligned).
__device__ __forceinline__ uint32_t load_u32_from_u16(const uint8_t* p) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return __byte_perm(h[0], h[1], 0x5410);
}

// Four unsigned bytes u as two half2 of d * (u - bias): 0x64 above a byte is the half 1024 + u,
// exactly, so the subtraction is exact as well (no int-to-float conversions, which run at
// 16/clk/SM and were the bottleneck), and d * q is rounded once.
__device__ __forceinline__ uint32_t bytes_lo_to_half2(uint32_t bytes, __half2 bias, __half2 d) {
    const uint32_t a = __byte_perm(bytes, 0x64646464u, 0x4140);
    const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&a), bias), d);
    return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t bytes_hi_to_half2(uint32_t bytes, __half2 bias, __half2 d) {
    const uint32_t a = __byte_perm(bytes, 0x64646464u, 0x4342);
    const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&a), bias), d);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Values 8j .. 8j+7 of one cell's quantized (q8_0 / q4_0) head slice as eight f16.
template <KvType T>
__device__ __forceinline__ uint4 dequant8_quantized(const uint8_t* slice, int j) {
    static_assert(T == KvType::q8_0 || T == KvType::q4_0, "quantized tiers only");
    const int part = j % 4;
    const uint8_t* blk = slice + (j / 4) * (T == KvType::q8_0 ? 34 : 18);
    const __half2 d = __half2half2(*reinterpret_cast<const __half*>(blk));
    uint32_t lo, hi;
    __half2 bias;
    if constexpr (T == KvType::q8_0) {
        lo = load_u32_from_u16(blk + 2 + 8 * part) ^ 0x80808080u;  // signed -> unsigned + 128
        hi = load_u32_from_u16(blk + 6 + 8 * part) ^ 0x80808080u;
        bias = __float2half2_rn(1024.0f + 128.0f);
    } else {
        // q4_0: values 0..15 are the low nibbles of qs[0..15], 16..31 the high nibbles.
        const int shift = part < 2 ? 0 : 4;
        lo = (load_u32_from_u16(blk + 2 + 8 * (part % 2)) >> shift) & 0x0F0F0F0Fu;
        hi = (load_u32_from_u16(blk + 6 + 8 * (part % 2)) >> shift) & 0x0F0F0F0Fu;
        bias = __float2half2_rn(1024.0f + 8.0f);
    }
    return make_uint4(bytes_lo_to_half2(lo, bias, d), bytes_hi_to_half2(lo, bias, d), bytes_lo_to_half2(hi, bias, d),
                      bytes_hi_to_half2(hi, bias, d));
}
#endif

}  // namespace spillway::kv_tile
