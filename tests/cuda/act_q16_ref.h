#pragma once
// Host twin of engine/cuda/act_quant_device.cuh: x quantized per 32 values to int16 with one
// f32 scale (d = amax / 32767 in f32, q = round-half-even(x / d), 0 for an all-zero block).
// The GPU does the same IEEE operations, so q and d must match bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace spillway::cuda_test {

struct HostActQ16 {
    std::vector<int16_t> q;
    std::vector<float> d;
};

inline HostActQ16 quantize_act_q16_host(const std::vector<float>& x) {
    HostActQ16 out;
    out.q.resize(x.size());
    out.d.resize(x.size() / 32);
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0.0f;
        for (size_t i = 32 * b; i < 32 * b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 32767.0f;
        out.d[b] = d;
        for (size_t i = 32 * b; i < 32 * b + 32; ++i) {
            const float r = d > 0.0f ? std::nearbyint(x[i] / d) : 0.0f;
            out.q[i] = (int16_t)std::clamp(r, -32767.0f, 32767.0f);
        }
    }
    return out;
}

inline std::vector<float> dequantize_act_q16_host(const HostActQ16& a) {
    std::vector<float> x(a.q.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = a.d[i / 32] * (float)a.q[i];
    return x;
}

}  // namespace spillway::cuda_test
