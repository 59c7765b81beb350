// The persistent decode layer kernel (decode_layer.cuh) against a CPU reference of the same
// chain: wo -> residual add -> RMSNorm -> gate|up -> SwiGLU -> down -> residual add -> RMSNorm
// -> q|k|v, each x quantized to int16 blocks by the host twin of the kernel's rounding.
// Reference products in double over the dequantized weights. The GPU's intermediate values
// differ from the reference's by f32 summation error, which can move a quantized x value by one
// step (~3e-5 of its block's max): tolerance 2e-4 relative (norm-wise) on every output.
#include "engine/cuda/decode_layer.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "act_q16_ref.h"
#include "cuda_test_util.h"
#include "common/error.h"
#include "gguf/quants.h"

namespace spillway {
namespace {

using namespace cuda_test;

struct Q8Matrix {
    std::vector<uint8_t> bytes;
    std::vector<float> values;
    uint32_t rows = 0, cols = 0;
};

Q8Matrix random_q8(std::mt19937& rng, uint32_t rows, uint32_t cols) {
    const std::vector<float> w = random_floats(rng, (size_t)rows * cols, 0.05f);
    const uint64_t row_bytes = *ggml_row_bytes(GgmlType::Q8_0, cols);
    Q8Matrix m{std::vector<uint8_t>(row_bytes * rows), std::vector<float>((size_t)rows * cols), rows, cols};
    for (uint32_t r = 0; r < rows; ++r) {
        quantize_row(GgmlType::Q8_0, w.data() + (size_t)r * cols, m.bytes.data() + r * row_bytes, cols);
        dequantize_row(GgmlType::Q8_0, m.bytes.data() + r * row_bytes, m.values.data() + (size_t)r * cols, cols);
    }
    return m;
}

// W times x quantized by the host twin, in double.
std::vector<float> product(const Q8Matrix& m, const std::vector<float>& x) {
    const std::vector<float> xq = dequantize_act_q16_host(quantize_act_q16_host(x));
    std::vector<float> y(m.rows);
    for (uint32_t r = 0; r < m.rows; ++r) {
        double s = 0.0;
        for (uint32_t c = 0; c < m.cols; ++c) s += (double)m.values[(size_t)r * m.cols + c] * xq[c];
        y[r] = (float)s;
    }
    return y;
}

std::vector<float> rmsnorm(const std::vector<float>& h, const std::vector<float>& w, float eps) {
    double ss = 0.0;
    for (float v : h) ss += (double)v * v;
    const float inv = 1.0f / std::sqrt((float)(ss / h.size()) + eps);
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = h[i] * inv * w[i];
    return out;
}

struct LayerCase {
    uint32_t embd, ff, qkv_rows;
    bool with_qkv;
    int runs = 2;         // launches from the same inputs, all bit-identical
    bool paired = false;  // gate|up as swiglu_pairs (writes SwiGLU), down reads it as f32 (the engine's way)
};

void check_decode_layer(const LayerCase& c) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("embd=" + std::to_string(c.embd) + " ff=" + std::to_string(c.ff) + " qkv=" + std::to_string(c.qkv_rows) +
                 " seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    const float eps = 1e-6f;
    const Q8Matrix wo = random_q8(rng, c.embd, c.embd), gu = random_q8(rng, 2 * c.ff, c.embd),
                   down = random_q8(rng, c.embd, c.ff), qkv = random_q8(rng, c.qkv_rows, c.embd);
    const std::vector<float> attn = random_floats(rng, c.embd), h0 = random_floats(rng, c.embd);
    std::vector<float> ffn_w = random_floats(rng, c.embd, 0.1f), attn_w = random_floats(rng, c.embd, 0.1f);
    for (float& v : ffn_w) v += 1.0f;
    for (float& v : attn_w) v += 1.0f;

    // Reference.
    std::vector<float> h1 = h0;
    const std::vector<float> y_o = product(wo, attn);
    for (uint32_t i = 0; i < c.embd; ++i) h1[i] += y_o[i];
    const std::vector<float> ref_gu = product(gu, rmsnorm(h1, ffn_w, eps));
    std::vector<float> act(c.ff);
    for (uint32_t i = 0; i < c.ff; ++i) {
        const float g = ref_gu[i], u = ref_gu[c.ff + i];
        act[i] = g / (1.0f + std::exp(-g)) * u;
    }
    std::vector<float> ref_h2 = h1;
    const std::vector<float> y_d = product(down, act);
    for (uint32_t i = 0; i < c.embd; ++i) ref_h2[i] += y_d[i];
    const std::vector<float> ref_qkv = c.with_qkv ? product(qkv, rmsnorm(ref_h2, attn_w, eps)) : std::vector<float>{};

    // GPU.
    const HostActQ16 attn_q = quantize_act_q16_host(attn);
    DeviceBuffer<uint8_t> d_wo = to_device(wo.bytes), d_gu = to_device(gu.bytes), d_down = to_device(down.bytes),
                          d_qkv = to_device(qkv.bytes);
    DeviceBuffer<int16_t> d_xq = to_device(attn_q.q);
    DeviceBuffer<float> d_xd = to_device(attn_q.d), d_ffn_w = to_device(ffn_w), d_attn_w = to_device(attn_w);
    DeviceBuffer<float> d_stream(c.embd), d_gate_up(2 * c.ff), d_out(c.qkv_rows);
    DeviceBuffer<uint8_t> barrier(decode_layer_scratch_bytes());
    SPILLWAY_CUDA_CHECK(cudaMemset(barrier.data(), 0, barrier.bytes()));

    DecodeLayerArgs a;
    a.stream = d_stream.data();
    a.x_q16 = ActQ16{d_xq.data(), d_xd.data()};
    a.eps = eps;
    a.phases[0] = DecodeGemvPhase{d_wo.data(), c.embd, c.embd, DecodeX::act_q16, DecodeY::add_to_stream};
    a.phases[1] = DecodeGemvPhase{d_gu.data(), 2 * c.ff, c.embd, DecodeX::stream_rmsnorm, DecodeY::store, d_ffn_w.data(),
                                  nullptr, d_gate_up.data()};
    a.phases[2] = DecodeGemvPhase{d_down.data(), c.embd, c.ff, DecodeX::swiglu, DecodeY::add_to_stream, nullptr,
                                  d_gate_up.data()};
    if (c.paired) {
        a.phases[1].y = DecodeY::swiglu_pairs;  // out = d_gate_up[0, ff)
        a.phases[2].x = DecodeX::f32;
        a.phases[2].gate_up = nullptr;
        a.phases[2].x_f32 = d_gate_up.data();
    }
    a.phases[3] = DecodeGemvPhase{d_qkv.data(), c.qkv_rows, c.embd, DecodeX::stream_rmsnorm, DecodeY::store,
                                  d_attn_w.data(), nullptr, d_out.data()};
    a.n_phases = c.with_qkv ? 4 : 3;

    // Every ring shape; per shape several launches from the same inputs (each finds the
    // barrier words the last one left): outputs poisoned before each, and bit-identical between
    // them (shapes cut rows between warps at different chunks, so they may differ by rounding).
    // Repeats matter: a ring protocol error shows up as a wrong stage read only when some
    // consumer runs ahead.
    for (uint32_t ring = 0; ring < kDecodeRingShapes; ++ring) {
        SCOPED_TRACE(std::string("ring ") + decode_ring_name((DecodeRing)ring));
        std::vector<float> first_stream, first_gu, first_out;
        for (int run = 0; run < c.runs; ++run) {
            SPILLWAY_CUDA_CHECK(cudaMemcpy(d_stream.data(), h0.data(), h0.size() * 4, cudaMemcpyHostToDevice));
            poison(d_gate_up);
            poison(d_out);
            decode_layer_cuda(a, barrier.data(), nullptr, nullptr, (DecodeRing)ring);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<float> got_stream = to_host(d_stream), got_gu = to_host(d_gate_up), got_out = to_host(d_out);
            if (c.paired) {
                EXPECT_LT(rel_error(got_gu.data(), act.data(), c.ff), 2e-4) << "SwiGLU of gate|up, run " << run;
                EXPECT_EQ(count_nan(std::vector<float>(got_gu.begin() + c.ff, got_gu.end())), (size_t)c.ff)
                    << "swiglu_pairs wrote past its n outputs";
            } else {
                EXPECT_LT(rel_error(got_gu, ref_gu), 2e-4) << "gate|up, run " << run;
            }
            EXPECT_LT(rel_error(got_stream, ref_h2), 2e-4) << "stream after down, run " << run;
            if (c.with_qkv) {
                EXPECT_LT(rel_error(got_out, ref_qkv), 2e-4) << "q|k|v, run " << run;
            } else {
                EXPECT_EQ(count_nan(got_out), got_out.size()) << "a 3-phase launch wrote the 4th phase's output";
            }
            if (run == 0) {
                first_stream = got_stream;
                first_gu = got_gu;
                first_out = got_out;
            } else {
                EXPECT_EQ(std::memcmp(first_stream.data(), got_stream.data(), got_stream.size() * 4), 0) << "not deterministic";
                EXPECT_EQ(std::memcmp(first_gu.data(), got_gu.data(), got_gu.size() * 4), 0) << "not deterministic";
                if (c.with_qkv) EXPECT_EQ(std::memcmp(first_out.data(), got_out.data(), got_out.size() * 4), 0);
            }
        }
    }
    // The scratch is left ready for the next launch: arrival count zero, every hand-over slot
    // zero (a stale slot would add an old partial sum to a cut row). Word 1 is the barrier's
    // generation, which only grows.
    const std::vector<uint8_t> scratch = to_host(barrier);
    uint32_t count = 0;
    std::memcpy(&count, scratch.data(), 4);
    EXPECT_EQ(count, 0u) << "the barrier's arrival count must be back to zero after a launch";
    EXPECT_EQ(std::count(scratch.begin() + 16, scratch.end(), 0), (long)(scratch.size() - 16))
        << "hand-over slots left set";
}

TEST(CudaDecodeLayer, MatchesCpuChain) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!decode_layer_supported()) GTEST_SKIP() << "the persistent decode layer kernel needs sm_90";
    // The tiny preset (fewer rows than blocks: some blocks own no rows of a phase), an odd
    // mid-size shape (partial last chunk of a row), and the Qwen2.5-14B layer (many chunks
    // per warp, row pairs cut between warps, the ring running on across the phases).
    check_decode_layer({256, 768, 512, true});
    check_decode_layer({1280, 3328, 1792, false});
    check_decode_layer({5120, 13824, 7168, true, 8});
    // The engine's arrangement: gate|up writes SwiGLU itself (gate row j with up row j).
    check_decode_layer({256, 768, 512, true, 2, true});
    check_decode_layer({5120, 13824, 7168, true, 4, true});
    // An odd q|k|v row count (a half row pair), and the widest x the kernel takes (14336).
    check_decode_layer({5120, 13824, 7167, true, 2, true});
    check_decode_layer({256, 14336, 512, true, 2, true});
}

// One phase whose x is the RMSNorm of the stream (built while the whole ring of weight copies
// is in flight), against the same reference, with every ring shape.
TEST(CudaDecodeLayer, SinglePhaseFromTheStream) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!decode_layer_supported()) GTEST_SKIP() << "the persistent decode layer kernel needs sm_90";
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{{7168, 5120}, {33, 512}}) {
        const Q8Matrix w = random_q8(rng, rows, cols);
        const std::vector<float> h = random_floats(rng, cols);
        std::vector<float> norm_w = random_floats(rng, cols, 0.1f);
        for (float& v : norm_w) v += 1.0f;
        const std::vector<float> ref = product(w, rmsnorm(h, norm_w, 1e-6f));
        DeviceBuffer<uint8_t> d_w = to_device(w.bytes), scratch(decode_layer_scratch_bytes());
        SPILLWAY_CUDA_CHECK(cudaMemset(scratch.data(), 0, scratch.bytes()));
        DeviceBuffer<float> d_h = to_device(h), d_norm = to_device(norm_w), d_out(rows);
        DecodeLayerArgs a;
        a.stream = d_h.data();
        a.eps = 1e-6f;
        a.n_phases = 1;
        a.phases[0] = DecodeGemvPhase{d_w.data(), rows, cols, DecodeX::stream_rmsnorm, DecodeY::store, d_norm.data(),
                                      nullptr, d_out.data()};
        for (uint32_t ring = 0; ring < kDecodeRingShapes; ++ring) {
            poison(d_out);
            decode_layer_cuda(a, scratch.data(), nullptr, nullptr, (DecodeRing)ring);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_LT(rel_error(to_host(d_out), ref), 2e-4) << rows << "x" << cols << " ring " << ring;
            EXPECT_EQ(to_host(d_h), h) << "a store phase changed the stream";
        }
    }
}

TEST(CudaDecodeLayer, RejectsUnsupportedInputs) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!decode_layer_supported()) GTEST_SKIP() << "the persistent decode layer kernel needs sm_90";
    EXPECT_FALSE(decode_layer_phase_fits(256, 896));
    EXPECT_FALSE(decode_layer_phase_fits(256, 32768));
    EXPECT_FALSE(decode_layer_phase_fits(0, 256));
    EXPECT_TRUE(decode_layer_phase_fits(1, 14336));
    EXPECT_FALSE(decode_layer_phase_fits(1, 14592));
    DeviceBuffer<uint8_t> w(*ggml_row_bytes(GgmlType::Q8_0, 512) * 512);
    DeviceBuffer<float> stream(512), out(512);
    DeviceBuffer<uint8_t> barrier(decode_layer_scratch_bytes());
    DecodeLayerArgs a;
    a.stream = stream.data();
    a.n_phases = 1;
    a.phases[0] = DecodeGemvPhase{w.data(), 512, 512, DecodeX::stream_rmsnorm, DecodeY::add_to_stream, stream.data()};
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr), Error);  // reads and adds to the stream
    a.phases[0] = DecodeGemvPhase{w.data(), 512, 512, DecodeX::act_q16, DecodeY::store, nullptr, nullptr, out.data()};
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr), Error);  // no x_q16
    a.phases[0] = DecodeGemvPhase{w.data(), 512, 500, DecodeX::stream_rmsnorm, DecodeY::store, stream.data(), nullptr,
                                  out.data()};
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr), Error);  // cols not a multiple of 256
    a.phases[0].cols = 512;
    // A phase may not write what it reads: the other blocks may still be reading it.
    a.phases[0] = DecodeGemvPhase{w.data(), 512, 512, DecodeX::f32, DecodeY::add_to_stream};
    a.phases[0].x_f32 = stream.data();
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr), Error);
    a.phases[0] = DecodeGemvPhase{w.data(), 512, 512, DecodeX::stream_rmsnorm, DecodeY::store, out.data(), nullptr,
                                  out.data()};  // out is also the norm weight
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr), Error);
    a.phases[0] = DecodeGemvPhase{w.data(), 511, 512, DecodeX::f32, DecodeY::swiglu_pairs, nullptr, nullptr, out.data()};
    a.phases[0].x_f32 = stream.data();
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr), Error);  // odd rows cannot pair gate with up
    a.phases[0].rows = 512;
    a.phases[0].y = static_cast<DecodeY>(7);
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr), Error);  // unknown output kind
    a.phases[0].y = DecodeY::store;
    a.n_phases = 0;
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr), Error);
    a.n_phases = 1;
    EXPECT_THROW(decode_layer_cuda(a, nullptr, nullptr), Error);
    EXPECT_THROW(decode_layer_cuda(a, barrier.data(), nullptr, nullptr, static_cast<DecodeRing>(kDecodeRingShapes)), Error);
}

}  // namespace
}  // namespace spillway
