#pragma once
// Q8_0 codes to f16 values on the device, bit-identical wherever a prefill path dequantizes
// (cuda_prefill.cu's weight tiles, prefill_gemm_q8s.cu's register fragments): each value is
// d * q rounded once to f16. Internal to engine/cuda.
#include <cuda_fp16.h>

#include <cstdint>

namespace spillway {

// `f16_bits` holds two f16 values 1024 + (q + 128) (a biased byte under 0x64): q exactly after
// subtracting 1152, then times the block scale d, rounded once.
__device__ __forceinline__ uint32_t q8_biased_half2_times(uint32_t f16_bits, __half2 d) {
    const __half2 bias = __float2half2_rn(1024.0f + 128.0f);
    const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&f16_bits), bias), d);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// `biased` holds four codes as bytes q + 128 (the codes xor 0x80808080); sel 0x4140 takes
// bytes 0 and 1, 0x4342 bytes 2 and 3, as a half2 (low half first). 0x64 above a byte is the
// f16 1024 + byte, exact, so subtracting 1152 gives q exactly and the multiply rounds once.
__device__ __forceinline__ uint32_t q8_pair_to_half2(uint32_t biased, int sel, __half2 d) {
    return q8_biased_half2_times(__byte_perm(biased, 0x64646464u, sel), d);
}

// The same with the 0x64 bytes in a register (`k64` = 0x64646464, from q8_bias_bytes()) and the
// selector an immediate: SASS's PRMT takes one immediate, and with the constant bytes there the
// selector had to be copied into a register for every call (the codes GEMM's hot loop).
template <int kSel>
__device__ __forceinline__ uint32_t q8_pair_to_half2(uint32_t biased, uint32_t k64, __half2 d) {
    uint32_t a;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(a) : "r"(biased), "r"(k64), "n"(kSel));
    return q8_biased_half2_times(a, d);
}
// 0x64646464 as a value the compiler does not fold back into an immediate.
__device__ __forceinline__ uint32_t q8_bias_bytes() {
    uint32_t k;
    asm volatile("mov.b32 %0, 0x64646464;\n" : "=r"(k));
    return k;
}

}  // namespace spillway
