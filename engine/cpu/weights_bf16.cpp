#include <cstring>

#include "common/fp16.h"
#include "engine/cpu/weight_kernels.h"

namespace spillway {
namespace {

float dot(const uint8_t* row, const float* x, size_t n) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += bf16_to_fp32(w[i + j]) * x[i + j];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) sum += bf16_to_fp32(w[i]) * x[i];
    return sum;
}
void dequantize(const uint8_t* row, float* y, size_t n) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row);
    for (size_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(w[i]);
}

}  // namespace

const WeightKernels& weight_kernels_bf16() {
    static const WeightKernels k{GgmlType::BF16, dot, dequantize};
    return k;
}

}  // namespace spillway
