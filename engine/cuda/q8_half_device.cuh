#pragma once
// Q8_0 codes to f16 values on the device, bit-identical wherever a prefill path dequantizes
// (cuda_prefill.cu's weight tiles, prefill_gemm_q8s.cu's register fragments): each value is
// d * q rounded once to f16. Internal to engine/cuda.
#include <cuda_fp16.h>

#include <cstdint>

namespace spillway {

// `biased` holds four codes as bytes q + 128 (the codes xor 0x80808080); sel 0x4140 takes
// bytes 0 and 1, 0x4342 bytes 2 and 3, as a half2 (low half first). 0x64 above a byte is the
// f16 1024 + byte, exact, so subtracting 1152 gives q exactly and the multiply rounds once.
__device__ __forceinline__ uint32_t q8_pair_to_half2(uint32_t biased, int sel, __half2 d) {
    const __half2 bias = __float2half2_rn(1024.0f + 128.0f);
    const uint32_t a = __byte_perm(biased, 0x64646464u, sel);
    const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&a), bias), d);
    return *reinterpret_cast<const uint32_t*>(&h);
}

}  // namespace spillway
