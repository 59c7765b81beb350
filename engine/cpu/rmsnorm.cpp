#include "engine/cpu/rmsnorm.h"

#include <cmath>

namespace spillway {

void rmsnorm_cpu(const float* x, const float* weight, float* y, size_t n, float eps) {
    // Sum of squares in double: rows are up to ~8k wide and this is once per row.
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += (double)x[i] * x[i];
    const float inv = (float)(1.0 / std::sqrt(sum / (double)n + eps));
    for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv * weight[i];
}

}  // namespace spillway
