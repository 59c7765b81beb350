#include "engine/cpu/weight_kernels.h"

#include <array>
#include <string>

#include "common/error.h"
#include "common/fp16.h"

namespace spillway {

const WeightKernels* find_weight_kernels(GgmlType type) {
    // One line per supported type.
    static const WeightKernels* const kAll[] = {
        &weight_kernels_f32(), &weight_kernels_f16(), &weight_kernels_bf16(),
        &weight_kernels_q8_0(), &weight_kernels_q4_0(),
    };
    for (const WeightKernels* k : kAll)
        if (k->type == type) return k;
    return nullptr;
}

const WeightKernels& weight_kernels(GgmlType type) {
    const WeightKernels* k = find_weight_kernels(type);
    if (!k) fail(std::string("the CPU engine does not support weight type ") + ggml_type_name(type));
    return *k;
}

float dot_f32(const float* a, const float* b, size_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

float fp16_table_to_fp32(uint16_t h) {
    static const std::array<float, 65536>* table = [] {
        auto* t = new std::array<float, 65536>;
        for (uint32_t i = 0; i < 65536; ++i) (*t)[i] = fp16_to_fp32((uint16_t)i);
        return t;
    }();
    return (*table)[h];
}

}  // namespace spillway
