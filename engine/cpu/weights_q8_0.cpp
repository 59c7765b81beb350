#include <cstring>

#include "engine/cpu/weight_kernels.h"
#include "gguf/quants.h"

namespace spillway {
namespace {

// Rows of q8_0 blocks (34 bytes: f16 scale + 32 int8). Each block's int8 x f32 products
// are summed first and scaled once.
float dot(const uint8_t* row, const float* x, size_t n) {
    float sum = 0.0f;
    for (size_t b = 0; b < n / kQK8_0; ++b) {
        const uint8_t* block = row + b * sizeof(BlockQ8_0);
        uint16_t d;
        std::memcpy(&d, block, 2);
        const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
        const float* xb = x + b * kQK8_0;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < kQK8_0; i += 8)
            for (int j = 0; j < 8; ++j) acc[j] += (float)qs[i + j] * xb[i + j];
        sum += fp16_table_to_fp32(d) *
               (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
    }
    return sum;
}
void dequantize(const uint8_t* row, float* y, size_t n) {
    for (size_t b = 0; b < n / kQK8_0; ++b) {
        const uint8_t* block = row + b * sizeof(BlockQ8_0);
        uint16_t d;
        std::memcpy(&d, block, 2);
        const float scale = fp16_table_to_fp32(d);
        const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
        for (int i = 0; i < kQK8_0; ++i) y[b * kQK8_0 + i] = scale * (float)qs[i];
    }
}

}  // namespace

const WeightKernels& weight_kernels_q8_0() {
    static const WeightKernels k{GgmlType::Q8_0, dot, dequantize};
    return k;
}

}  // namespace spillway
