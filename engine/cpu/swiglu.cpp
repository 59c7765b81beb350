#include "engine/cpu/swiglu.h"

#include <cmath>

namespace spillway {

void swiglu_cpu(const float* gate, const float* up, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

}  // namespace spillway
