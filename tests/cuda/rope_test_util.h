#pragma once
// RoPE tables of one head size on the device (the engine's RopeDeviceTables; NeoX by default), for the
// GPU tests that rotate heads: the decode attention's post-QKV work, the q|k|v epilogue.
#include <cstdint>

#include "cuda_test_util.h"
#include "engine/cpu/rope.h"
#include "engine/cuda/rope.cuh"

namespace spillway::cuda_test {

struct TestDeviceRope {
    DeviceBuffer<double> inv_freq;
    DeviceBuffer<float> ramp_mix;
    RopeDeviceTables tables;
    // Rotation over the whole head (n_dims = head_dim) or its first n_dims, Qwen2's base; neox
    // false: the normal (adjacent pairs) rotation.
    explicit TestDeviceRope(uint32_t head_dim, bool neox = true, uint32_t n_dims = 0) {
        RopeSpec spec;
        spec.type = neox ? RopeType::neox : RopeType::normal;
        spec.freq_base = 1000000.0f;
        spec.n_dims = n_dims != 0 ? n_dims : head_dim;
        const RopeTables host = make_rope_tables(spec, head_dim);
        inv_freq = to_device(host.inv_freq);
        ramp_mix = to_device(host.ramp_mix);
        tables.neox = neox;
        tables.n_dims = host.n_dims;
        tables.inv_freq = inv_freq.data();
        tables.ramp_mix = ramp_mix.data();
        tables.freq_scale = host.freq_scale;
        tables.mscale = host.mscale;
    }
};

}  // namespace spillway::cuda_test
