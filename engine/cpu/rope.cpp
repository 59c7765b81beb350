#include "engine/cpu/rope.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace spillway {
namespace {

// The dimension index (counted in rotated dims) at which a frequency completes n_rot
// turns over the original context: llama.cpp's yarn correction dimension.
double yarn_corr_dim(uint32_t n_dims, uint32_t n_ctx_orig, double n_rot, double base) {
    return n_dims * std::log(n_ctx_orig / (n_rot * 2.0 * M_PI)) / (2.0 * std::log(base));
}

}  // namespace

RopeTables make_rope_tables(const RopeSpec& spec, uint32_t head_dim) {
    RopeTables t;
    t.type = spec.type;
    t.n_dims = spec.n_dims ? spec.n_dims : head_dim;
    if (t.n_dims > head_dim || t.n_dims % 2 != 0) fail("rope: n_dims must be even and <= head_dim");
    if (!(spec.freq_base > 0.0f)) fail("rope: freq_base must be positive");
    const uint32_t half = t.n_dims / 2;
    t.inv_freq.resize(half);
    t.ramp_mix.assign(half, 0.0f);
    for (uint32_t i = 0; i < half; ++i)
        t.inv_freq[i] = std::pow((double)spec.freq_base, -2.0 * i / t.n_dims);

    const float factor = spec.scaling_factor > 0.0f ? spec.scaling_factor : 1.0f;
    if (spec.scaling == RopeScaling::linear) {
        t.freq_scale = 1.0f / factor;
    } else if (spec.scaling == RopeScaling::yarn) {
        t.freq_scale = 1.0f / factor;
        // llama.cpp: a negative ext_factor means "1 for YaRN".
        const float ext_factor = spec.yarn_ext_factor < 0.0f ? 1.0f : spec.yarn_ext_factor;
        const uint32_t n_orig = spec.original_context ? spec.original_context : 4096;
        const double low_f = std::floor(yarn_corr_dim(t.n_dims, n_orig, spec.yarn_beta_fast, spec.freq_base));
        const double high_f = std::ceil(yarn_corr_dim(t.n_dims, n_orig, spec.yarn_beta_slow, spec.freq_base));
        const double low = std::max(0.0, low_f);
        const double high = std::min((double)t.n_dims - 1, high_f);
        for (uint32_t i = 0; i < half; ++i) {
            const double y = (i - low) / std::max(0.001, high - low);
            t.ramp_mix[i] = (float)((1.0 - std::min(1.0, std::max(0.0, y))) * ext_factor);
        }
        t.mscale = spec.yarn_attn_factor;
        if (ext_factor != 0.0f) t.mscale *= 1.0f + 0.1f * std::log(factor);
    }
    return t;
}

void rope_angles(const RopeTables& t, uint32_t pos, float* cos_out, float* sin_out) {
    const uint32_t half = t.n_dims / 2;
    for (uint32_t i = 0; i < half; ++i) {
        // Angles in double: positions reach 1M and f32 pos*freq loses the phase.
        const double extrap = (double)pos * t.inv_freq[i];
        const double interp = extrap * t.freq_scale;
        const double mix = t.ramp_mix[i];
        const double theta = interp * (1.0 - mix) + extrap * mix;
        cos_out[i] = (float)std::cos(theta) * t.mscale;
        sin_out[i] = (float)std::sin(theta) * t.mscale;
    }
}

void rope_apply_cpu(const RopeTables& t, const float* cos_v, const float* sin_v, float* x,
                    uint32_t n_heads, uint32_t head_dim) {
    const uint32_t half = t.n_dims / 2;
    for (uint32_t h = 0; h < n_heads; ++h) {
        float* head = x + (size_t)h * head_dim;
        for (uint32_t i = 0; i < half; ++i) {
            // normal: pair (2i, 2i+1); neox: pair (i, i + n_dims/2).
            const uint32_t a = t.type == RopeType::normal ? 2 * i : i;
            const uint32_t b = t.type == RopeType::normal ? 2 * i + 1 : i + half;
            const float x0 = head[a], x1 = head[b];
            head[a] = x0 * cos_v[i] - x1 * sin_v[i];
            head[b] = x0 * sin_v[i] + x1 * cos_v[i];
        }
    }
}

void rope_cpu(const RopeTables& t, float* x, uint32_t n_heads, uint32_t head_dim, uint32_t pos) {
    // Heads are <= 512 dims in every supported model: stack buffers, no allocation.
    float cos_v[512], sin_v[512];
    if (t.n_dims / 2 > 512) fail("rope: head too large");
    rope_angles(t, pos, cos_v, sin_v);
    rope_apply_cpu(t, cos_v, sin_v, x, n_heads, head_dim);
}

}  // namespace spillway
