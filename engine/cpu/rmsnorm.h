#pragma once
// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, over rows of n values.
#include <cstddef>

namespace spillway {

void rmsnorm_cpu(const float* x, const float* weight, float* y, size_t n, float eps);

}  // namespace spillway
