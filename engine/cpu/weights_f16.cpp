#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "engine/cpu/weight_kernels.h"

namespace spillway {
namespace {

float dot(const uint8_t* row, const float* x, size_t n) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row);  // tensor data is 32-byte aligned
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += fp16_table_to_fp32(w[i + j]) * x[i + j];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) sum += fp16_table_to_fp32(w[i]) * x[i];
    return sum;
}
#if defined(__x86_64__)
// F16C converts eight halves per instruction instead of a table lookup each.
__attribute__((target("avx2,fma,f16c"))) float dot_avx2(const uint8_t* row, const float* x, size_t n) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8)));
        acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), acc1);
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    float sum = _mm_cvtss_f32(s4);
    for (; i < n; ++i) sum += fp16_table_to_fp32(w[i]) * x[i];
    return sum;
}
#endif

using DotFn = float (*)(const uint8_t*, const float*, size_t);
DotFn best_dot() {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return dot_avx2;
#endif
    return dot;
}

void dequantize(const uint8_t* row, float* y, size_t n) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row);
    for (size_t i = 0; i < n; ++i) y[i] = fp16_table_to_fp32(w[i]);
}

}  // namespace

const WeightKernels& weight_kernels_f16() {
    static const WeightKernels k{GgmlType::F16, best_dot(), dequantize};
    return k;
}

}  // namespace spillway
