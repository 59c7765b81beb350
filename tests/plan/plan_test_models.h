#pragma once
// Model shapes and host profiles for the planner tests, built by hand so the planner's
// tests do not depend on the preset tables (a preset-based test checks they agree).
#include <cstdint>

#include "model/model_spec.h"
#include "probe/probe_values.h"

namespace spillway::plan_test {

// Bytes of `n` values stored as q8_0 (34 bytes per block of 32) or f32.
inline uint64_t q8_bytes(uint64_t n) { return n / 32 * 34; }
inline uint64_t f32_bytes(uint64_t n) { return n * 4; }

// Qwen2.5-14B(-Instruct-1M) shape with Q8_0 weights (1-D tensors f32), ~15.7 GB.
inline ModelSpec qwen14b_q8() {
    ModelSpec m;
    m.arch = Arch::qwen2;
    m.name = "qwen2.5-14b (hand-built)";
    m.n_layer = 48;
    m.n_embd = 5120;
    m.n_head = 40;
    m.n_ff = 13824;
    m.n_vocab = 152064;
    m.n_ctx_train = 1010000;
    m.head_dim_k = m.head_dim_v = 128;
    m.has_qkv_bias = true;
    const uint64_t e = m.n_embd, kv = 8 * 128, ff = m.n_ff;
    uint64_t layer = q8_bytes(e * e) * 2 + q8_bytes(e * kv) * 2 + q8_bytes(e * ff) * 3 +
                     f32_bytes(e + 2 * kv) /* q/k/v bias */ + f32_bytes(2 * e) /* norms */;
    for (uint32_t i = 0; i < m.n_layer; ++i) m.layers.push_back({40, 8, false, layer});
    m.weight_bytes_non_layer = 2 * q8_bytes(m.n_vocab * e) + f32_bytes(e);  // token_embd, output, output_norm
    m.weight_bytes_token_embd = q8_bytes(m.n_vocab * e);
    m.weight_bytes_total = layer * m.n_layer + m.weight_bytes_non_layer;
    return m;
}

// A small model with sliding-window layers (every other layer local, window 1024).
inline ModelSpec swa_model() {
    ModelSpec m;
    m.n_layer = 4;
    m.n_embd = 512;
    m.n_head = 8;
    m.n_ff = 1024;
    m.n_vocab = 1000;
    m.head_dim_k = m.head_dim_v = 64;
    m.swa_window = 1024;
    for (uint32_t i = 0; i < m.n_layer; ++i) m.layers.push_back({8, 2, i % 2 == 1, 1000000});
    m.weight_bytes_non_layer = 1000000;
    m.weight_bytes_token_embd = 500000;
    m.weight_bytes_total = 5000000;
    return m;
}

// The spec's two hosts (the values of profiles/*.json).
inline ProbeValues rtx6000_bs2() {
    ProbeValues v;
    v.gpu_name = "NVIDIA RTX 6000 Ada Generation";
    v.vram_total_mib = 49152;
    v.vram_bw_gbps = 960;
    v.pcie_h2d_gbps = 51.2;
    v.host_ram_gbps = 9.3;
    v.c_engage_ms = 0.82;
    v.origin = "test rtx6000";
    return v;
}

inline ProbeValues rtx3090_solidpc() {
    ProbeValues v;
    v.gpu_name = "NVIDIA GeForce RTX 3090";
    v.vram_total_mib = 24576;
    v.vram_bw_gbps = 936;
    v.pcie_h2d_gbps = 6.7;
    v.host_ram_gbps = 11.5;
    v.c_engage_ms = 0.80;
    v.origin = "test rtx3090";
    return v;
}

}  // namespace spillway::plan_test
