#include <cstring>

#include "engine/cpu/weight_kernels.h"

namespace spillway {
namespace {

float dot(const uint8_t* row, const float* x, size_t n) {
    return dot_f32(reinterpret_cast<const float*>(row), x, n);
}
void dequantize(const uint8_t* row, float* y, size_t n) { std::memcpy(y, row, n * sizeof(float)); }

}  // namespace

const WeightKernels& weight_kernels_f32() {
    static const WeightKernels k{GgmlType::F32, dot, dequantize};
    return k;
}

}  // namespace spillway
