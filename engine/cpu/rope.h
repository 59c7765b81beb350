#pragma once
// Rotary position embedding, "normal" (adjacent pairs: llama GGUF files) and "neox"
// (half-split: qwen2), with linear and YaRN frequency scaling following llama.cpp's
// rope_yarn (the files users have were made for it).
//
// Pair i of a head (0 <= i < n_dims/2) rotates by theta = pos * base^(-2i/n_dims), then:
//  - linear: theta *= 1/factor;
//  - YaRN:   theta = interp*(1-mix) + extrap*mix with interp = extrap/factor and
//            mix = ext_factor * (1 - clamp((i - low) / max(0.001, high - low), 0, 1)),
//            [low, high] the correction dims of beta_fast / beta_slow at the original
//            context; cos and sin are multiplied by attn_factor * (1 + 0.1 ln(factor)).
// Dims >= n_dims pass through unchanged.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/model_spec.h"

namespace spillway {

// Per-pair constants derived once from a RopeSpec and the head size (no per-token work
// beyond one cos/sin per pair and position).
struct RopeTables {
    RopeType type = RopeType::normal;
    uint32_t n_dims = 0;
    std::vector<double> inv_freq; // base^(-2i/n_dims), i < n_dims/2 (double: pos * freq at 1M positions)
    std::vector<float> ramp_mix;  // YaRN extrapolation weight per pair; 0 = fully interpolated
    float freq_scale = 1.0f;      // 1/factor for linear and YaRN, else 1
    float mscale = 1.0f;          // multiplies cos and sin
};

RopeTables make_rope_tables(const RopeSpec& spec, uint32_t head_dim);

// Rotates n_heads heads of head_dim values each (contiguous), all at position `pos`.
void rope_cpu(const RopeTables& tables, float* x, uint32_t n_heads, uint32_t head_dim, uint32_t pos);

// cos/sin for every pair at `pos` (n_dims/2 each); rope_apply_cpu uses them for many heads.
void rope_angles(const RopeTables& tables, uint32_t pos, float* cos_out, float* sin_out);
void rope_apply_cpu(const RopeTables& tables, const float* cos_v, const float* sin_v, float* x,
                    uint32_t n_heads, uint32_t head_dim);

}  // namespace spillway
