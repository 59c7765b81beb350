#include <cstring>

#include "engine/cpu/weight_kernels.h"
#include "gguf/quants.h"

namespace spillway {
namespace {

// Rows of q4_0 blocks (18 bytes: f16 scale + 16 bytes of nibbles; low nibbles are values
// 0..15 of the block, high nibbles values 16..31, each offset by 8).
float dot(const uint8_t* row, const float* x, size_t n) {
    float sum = 0.0f;
    for (size_t b = 0; b < n / kQK4_0; ++b) {
        const uint8_t* block = row + b * sizeof(BlockQ4_0);
        uint16_t d;
        std::memcpy(&d, block, 2);
        const uint8_t* qs = block + 2;
        const float* xb = x + b * kQK4_0;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < 16; i += 8)
            for (int j = 0; j < 8; ++j)
                acc[j] += (float)((qs[i + j] & 0x0F) - 8) * xb[i + j] +
                          (float)((qs[i + j] >> 4) - 8) * xb[i + j + 16];
        sum += fp16_table_to_fp32(d) *
               (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
    }
    return sum;
}
void dequantize(const uint8_t* row, float* y, size_t n) {
    for (size_t b = 0; b < n / kQK4_0; ++b) {
        const uint8_t* block = row + b * sizeof(BlockQ4_0);
        uint16_t d;
        std::memcpy(&d, block, 2);
        const float scale = fp16_table_to_fp32(d);
        const uint8_t* qs = block + 2;
        for (int i = 0; i < 16; ++i) {
            y[b * kQK4_0 + i] = scale * (float)((qs[i] & 0x0F) - 8);
            y[b * kQK4_0 + i + 16] = scale * (float)((qs[i] >> 4) - 8);
        }
    }
}

}  // namespace

const WeightKernels& weight_kernels_q4_0() {
    static const WeightKernels k{GgmlType::Q4_0, dot, dequantize};
    return k;
}

}  // namespace spillway
