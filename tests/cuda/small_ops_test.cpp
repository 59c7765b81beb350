// RMSNorm (+ residual add), RoPE (normal, NeoX, YaRN tables), SwiGLU and the quantizing KV
// write vs the CPU engine's functions. Tolerances: 1e-5 relative for the f32 ops (only
// summation order and expf/sincos ulps differ); the KV write must produce the very bytes the
// CPU codec writes (same IEEE operations in the same order).
#include <algorithm>
#include <cmath>
#include <limits>

#include "act_q16_ref.h"
#include "common/fp16.h"
#include "cuda_test_util.h"
#include "engine/cuda/act_quant.cuh"
#include "engine/cuda/argmax.cuh"
#include "engine/cpu/sampler.h"
#include "engine/cpu/rmsnorm.h"
#include "engine/cpu/rope.h"
#include "engine/cpu/swiglu.h"
#include "engine/cuda/kv_write.cuh"
#include "engine/cuda/rmsnorm.cuh"
#include "engine/cuda/rope.cuh"
#include "engine/cuda/swiglu.cuh"
#include "kv/kv_codec.h"

namespace spillway {
namespace {

using namespace cuda_test;

// Greedy sampling: the first index of the largest value, NaN as -inf, 0 when nothing is finite
// or above -inf. The reference is written out here (the CPU sampler's argmax keeps a NaN at index
// 0); on NaN-free inputs it must also equal the CPU sampler's. One scratch serves every launch,
// so each launch also checks that the previous one rearmed the arrival count.
TEST(CudaSmallOps, ArgmaxFirstIndexOfTheLargestNanNeverWins) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const ArgmaxScratch scratch = make_argmax_scratch();
    DeviceBuffer<int32_t> d_out(1);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    auto reference = [](const std::vector<float>& v) {
        int32_t best = -1;
        for (size_t i = 0; i < v.size(); ++i) {
            const float x = std::isnan(v[i]) ? -std::numeric_limits<float>::infinity() : v[i];
            const float b = best < 0 ? 0.0f : (std::isnan(v[best]) ? -std::numeric_limits<float>::infinity() : v[best]);
            if (best < 0 || x > b) best = (int32_t)i;
        }
        return std::max(best, 0);
    };
    auto check = [&](const std::vector<float>& v, const std::string& what) {
        auto d_v = to_device(v);
        const int32_t poisoned = -7;
        SPILLWAY_CUDA_CHECK(cudaMemcpy(d_out.data(), &poisoned, sizeof poisoned, cudaMemcpyHostToDevice));
        argmax_cuda(d_v.data(), (uint32_t)v.size(), d_out.data(), scratch, nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const int32_t got = to_host(d_out)[0];
        EXPECT_EQ(got, reference(v)) << what << ", n " << v.size();
        if (std::none_of(v.begin(), v.end(), [](float x) { return std::isnan(x); }))
            EXPECT_EQ(got, argmax(v.data(), (uint32_t)v.size())) << what << " (CPU sampler), n " << v.size();
    };
    // 152064: the 14B vocabulary; 2.5M: more than one span per block (512 blocks x 4096).
    for (uint32_t n : {1u, 5u, 255u, 4096u, 4097u, 152064u, 2500001u}) {
        auto v = random_floats(rng, n, 8.0f);
        check(v, "random");
        // Ties: the maximum at three places, far apart (other blocks), the first must win.
        const float top = 100.0f;
        std::uniform_int_distribution<uint32_t> at(0, n - 1);
        std::vector<uint32_t> places{at(rng), at(rng), at(rng)};
        for (uint32_t p : places) v[p] = top;
        check(v, "ties");
        // NaN everywhere near and above the maximum's place never wins, nor a NaN at index 0.
        for (uint32_t i = 0; i < n; i += 97) v[i] = nan;
        v[0] = nan;
        check(v, "NaN");
        std::vector<float> all_nan(n, nan), all_minus_inf(n, -inf);
        check(all_nan, "all NaN");
        check(all_minus_inf, "all -inf");
        all_minus_inf[n - 1] = -1e30f;
        check(all_minus_inf, "one finite value last");
        all_minus_inf[n / 2] = inf;
        check(all_minus_inf, "+inf");
    }
}

TEST(CudaSmallOps, RmsNormWithAndWithoutResidualAdd) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (bool with_add : {false, true}) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE("add " + std::to_string(with_add) + " seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        const uint32_t rows = 3, dim = 5120;
        const float eps = 1e-6f;
        auto x = random_floats(rng, (size_t)rows * dim, 3.0f);
        const auto add = random_floats(rng, (size_t)rows * dim);
        const auto weight = random_floats(rng, dim);
        auto d_x = to_device(x);
        auto d_add = to_device(add);
        auto d_w = to_device(weight);
        DeviceBuffer<float> d_out(x.size());
        poison(d_out);
        rmsnorm_cuda(d_x.data(), with_add ? d_add.data() : nullptr, d_w.data(), d_out.data(), rows, dim, eps, nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        if (with_add)
            for (size_t i = 0; i < x.size(); ++i) x[i] += add[i];
        std::vector<float> ref(x.size());
        for (uint32_t r = 0; r < rows; ++r) rmsnorm_cpu(x.data() + r * dim, weight.data(), ref.data() + r * dim, dim, eps);
        const auto out = to_host(d_out);
        EXPECT_EQ(count_nan(out), 0u);
        EXPECT_LT(rel_error(out, ref), 1e-5);
        EXPECT_LT(rel_error(to_host(d_x), x), 1e-7) << "residual stream not updated";
    }
}

// The vector kernel with its quantized output (bytes equal to quantizing the GPU's own f32
// output on the host: same IEEE operations), and the scalar kernel for dims not a multiple of 4.
TEST(CudaSmallOps, RmsNormQuantizedOutputAndOddDims) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    // (dim, rows): 70 rows of 5120 and 3584 take the many-rows shape (128 threads per row).
    for (const auto& [dim, rows] : std::vector<std::pair<uint32_t, uint32_t>>{
             {5120, 2}, {13824, 2}, {999, 2}, {256, 2}, {5120, 70}, {3584, 70}, {13824, 70}}) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE("dim " + std::to_string(dim) + " rows " + std::to_string(rows) + " seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        const float eps = 1e-6f;
        auto x = random_floats(rng, (size_t)rows * dim, 3.0f);
        const auto add = random_floats(rng, (size_t)rows * dim);
        const auto weight = random_floats(rng, dim);
        auto d_x = to_device(x);
        auto d_add = to_device(add);
        auto d_w = to_device(weight);
        DeviceBuffer<float> d_out(x.size());
        DeviceBuffer<int16_t> d_q(x.size());
        DeviceBuffer<float> d_d(std::max<size_t>(1, x.size() / 32));
        poison(d_out);
        poison(d_q);
        poison(d_d);
        const bool quantized = dim % 32 == 0;
        rmsnorm_cuda(d_x.data(), d_add.data(), d_w.data(), d_out.data(), rows, dim, eps, nullptr,
                     quantized ? ActQ16{d_q.data(), d_d.data()} : ActQ16{});
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        for (size_t i = 0; i < x.size(); ++i) x[i] += add[i];
        std::vector<float> ref(x.size());
        for (uint32_t r = 0; r < rows; ++r) rmsnorm_cpu(x.data() + r * dim, weight.data(), ref.data() + r * dim, dim, eps);
        const auto out = to_host(d_out);
        EXPECT_EQ(count_nan(out), 0u);
        EXPECT_LT(rel_error(out, ref), 1e-5);
        EXPECT_LT(rel_error(to_host(d_x), x), 1e-7) << "residual stream not updated";
        if (quantized) {
            const HostActQ16 want = quantize_act_q16_host(out);
            EXPECT_EQ(to_host(d_q), want.q);
            EXPECT_EQ(to_host(d_d), want.d);
        }
    }
}

// A prefill chunk's norm writes the GEMMs' f16 input itself: bit for bit the f32 output
// rounded to nearest (what the separate conversion did), with or without the f32 output, for
// the vector kernel (5120, 13824) and the scalar one (999).
TEST(CudaSmallOps, RmsNormF16OutputEqualsRoundedF32) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (const auto& [dim, rows] : std::vector<std::pair<uint32_t, uint32_t>>{{5120, 3}, {13824, 3}, {999, 3}, {5120, 66}}) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE("dim " + std::to_string(dim) + " rows " + std::to_string(rows) + " seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        const auto x = random_floats(rng, (size_t)rows * dim, 3.0f);
        const auto add = random_floats(rng, (size_t)rows * dim);
        const auto weight = random_floats(rng, dim);
        auto d_w = to_device(weight);
        auto d_add = to_device(add);
        // f32 output alone (the reference), then f16 alone, then both, each from fresh x.
        auto d_x1 = to_device(x), d_x2 = to_device(x), d_x3 = to_device(x);
        DeviceBuffer<float> d_out(x.size()), d_out3(x.size());
        DeviceBuffer<__half> d_h2(x.size()), d_h3(x.size());
        poison(d_out);
        poison(d_out3);
        poison(d_h2);
        poison(d_h3);
        rmsnorm_cuda(d_x1.data(), d_add.data(), d_w.data(), d_out.data(), rows, dim, 1e-6f, nullptr);
        rmsnorm_cuda(d_x2.data(), d_add.data(), d_w.data(), nullptr, rows, dim, 1e-6f, nullptr, {}, d_h2.data());
        rmsnorm_cuda(d_x3.data(), d_add.data(), d_w.data(), d_out3.data(), rows, dim, 1e-6f, nullptr, {}, d_h3.data());
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const auto out = to_host(d_out);
        std::vector<uint16_t> want(out.size()), h2(out.size()), h3(out.size());
        for (size_t i = 0; i < out.size(); ++i) want[i] = fp32_to_fp16(out[i]);
        SPILLWAY_CUDA_CHECK(cudaMemcpy(h2.data(), d_h2.data(), d_h2.bytes(), cudaMemcpyDeviceToHost));
        SPILLWAY_CUDA_CHECK(cudaMemcpy(h3.data(), d_h3.data(), d_h3.bytes(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(h2, want) << "f16 alone";
        EXPECT_EQ(h3, want) << "f16 with f32";
        EXPECT_EQ(to_host(d_out3), out);
        EXPECT_EQ(to_host(d_x2), to_host(d_x1)) << "residual stream";
    }
    DeviceBuffer<float> x(64), w(64);
    EXPECT_THROW(rmsnorm_cuda(x.data(), nullptr, w.data(), nullptr, 1, 64, 1e-6f, nullptr), Error);  // no output
}

// SwiGLU into the down GEMM's f16 input (the SFU's exp2 and reciprocal): each value within half
// an f16 ulp of the f32 kernel's value plus 4e-6 of it (the fast path's own error), i.e. that
// value rounded to nearest or, next to a rounding midpoint, its neighbour; NaN gates stay NaN;
// the vector path (n % 4 == 0) and the scalar one (odd n).
TEST(CudaSmallOps, SwiGluF16WithinHalfAnUlpOfF32) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (size_t n : {(size_t)2 * 13824, (size_t)3 * 13824 + 5}) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE("n " + std::to_string(n) + " seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        auto gate = random_floats(rng, n, 4.0f);
        const auto up = random_floats(rng, n);
        // Gates far out on both sides (silu's tails and the capped exponent), and one NaN.
        for (size_t i = 0; i < 64; ++i) gate[i * 97] = (i % 2 ? 1.0f : -1.0f) * (float)(20 * i);
        gate[5] = std::nanf("");
        auto d_gate = to_device(gate), d_up = to_device(up);
        DeviceBuffer<float> d_out(n);
        DeviceBuffer<__half> d_h(n);
        poison(d_out);
        poison(d_h);
        swiglu_cuda(d_gate.data(), d_up.data(), d_out.data(), n, nullptr);
        swiglu_f16_cuda(d_gate.data(), d_up.data(), d_h.data(), n, nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const auto out = to_host(d_out);
        std::vector<uint16_t> got(n);
        SPILLWAY_CUDA_CHECK(cudaMemcpy(got.data(), d_h.data(), d_h.bytes(), cudaMemcpyDeviceToHost));
        size_t bad = 0, rounded_equal = 0;
        for (size_t i = 0; i < n; ++i) {
            const float g = fp16_to_fp32(got[i]), want = out[i];
            if (std::isnan(want)) {
                bad += !std::isnan(g);
                continue;
            }
            // Half an ulp of f16 at want's magnitude (subnormal spacing 2^-24 below 2^-14).
            const float mag = std::max(std::fabs(want), 6.103515625e-05f);
            const float half_ulp = std::ldexp(1.0f, std::ilogb(mag) - 11);
            bad += !(std::fabs(g - want) <= half_ulp + 4e-6f * std::fabs(want));
            rounded_equal += got[i] == fp32_to_fp16(want);
        }
        EXPECT_EQ(bad, 0u) << "of " << n;
        // Most values are the rounded f32 value itself (only those next to a midpoint may differ).
        EXPECT_GT(rounded_equal, n * 99 / 100) << "of " << n;
    }
}

// The stand-alone quantizer: bytes equal to the host twin, an all-zero block gives d = 0.
TEST(CudaSmallOps, QuantizeActQ16EqualsHostBytes) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n = 5120, tokens = 3;
    auto x = random_floats(rng, (size_t)n * tokens, 2.0f);
    for (int i = 64; i < 96; ++i) x[i] = 0.0f;
    x[200] = 1e-30f;  // a tiny block value next to normal ones
    auto d_x = to_device(x);
    DeviceBuffer<int16_t> d_q(x.size());
    DeviceBuffer<float> d_d(x.size() / 32);
    poison(d_q);
    poison(d_d);
    quantize_act_q16_cuda(d_x.data(), n, tokens, ActQ16{d_q.data(), d_d.data()}, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    const HostActQ16 want = quantize_act_q16_host(x);
    EXPECT_EQ(to_host(d_q), want.q);
    EXPECT_EQ(to_host(d_d), want.d);
    EXPECT_EQ(want.d[2], 0.0f);
    // Dequantized, it is x to ~2e-5 relative (rounding to 16 bits per block).
    EXPECT_LT(rel_error(dequantize_act_q16_host(want), x), 1e-4);
}

TEST(CudaSmallOps, RopeNormalNeoxAndYarn) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    RopeSpec yarn;
    yarn.type = RopeType::neox;
    yarn.freq_base = 1000000.0f;
    yarn.scaling = RopeScaling::yarn;
    yarn.scaling_factor = 4.0f;
    yarn.original_context = 32768;
    RopeSpec normal;
    normal.freq_base = 500000.0f;
    RopeSpec neox_partial;  // rotates only half of each head
    neox_partial.type = RopeType::neox;
    neox_partial.n_dims = 64;
    for (RopeSpec spec : {normal, yarn, neox_partial}) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE("rope type " + std::to_string((int)spec.type) + " scaling " + std::to_string((int)spec.scaling) +
                     " seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        const uint32_t head_dim = 128, n_heads = 12;
        if (spec.n_dims == 0) spec.n_dims = head_dim;
        const RopeTables tables = make_rope_tables(spec, head_dim);
        const std::vector<int32_t> positions = {0, 1, 17, 4095, 65535, 131071};
        const uint32_t n_tokens = positions.size();
        auto x = random_floats(rng, (size_t)n_tokens * n_heads * head_dim);
        auto d_x = to_device(x);
        auto d_pos = to_device(positions);
        auto d_inv = to_device(tables.inv_freq);
        auto d_mix = to_device(tables.ramp_mix);
        RopeDeviceTables dt;
        dt.neox = tables.type == RopeType::neox;
        dt.n_dims = tables.n_dims;
        dt.inv_freq = d_inv.data();
        dt.ramp_mix = d_mix.data();
        dt.freq_scale = tables.freq_scale;
        dt.mscale = tables.mscale;
        rope_cuda(dt, d_x.data(), n_tokens, n_heads, head_dim, d_pos.data(), nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        for (uint32_t t = 0; t < n_tokens; ++t) rope_cpu(tables, x.data() + (size_t)t * n_heads * head_dim, n_heads, head_dim, positions[t]);
        EXPECT_LT(rel_error(to_host(d_x), x), 1e-5);
    }
}

TEST(CudaSmallOps, SwiGlu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const size_t n = 3 * 13824 + 5;
    const auto gate = random_floats(rng, n, 4.0f), up = random_floats(rng, n);
    auto d_gate = to_device(gate), d_up = to_device(up);
    DeviceBuffer<float> d_out(n);
    poison(d_out);
    swiglu_cuda(d_gate.data(), d_up.data(), d_out.data(), n, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> ref(n);
    swiglu_cpu(gate.data(), up.data(), ref.data(), n);
    EXPECT_LT(rel_error(to_host(d_out), ref), 1e-6);
}

// SwiGLU written only quantized (the down projection's input): dequantized it is the CPU's
// swiglu to x's 16-bit rounding (~2e-5 relative) plus expf ulps; bound 1e-4.
TEST(CudaSmallOps, SwiGluQuantized) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n = 13824;
    const auto gate = random_floats(rng, n, 4.0f), up = random_floats(rng, n);
    auto d_gate = to_device(gate), d_up = to_device(up);
    DeviceBuffer<int16_t> d_q(n);
    DeviceBuffer<float> d_d(n / 32);
    poison(d_q);
    poison(d_d);
    swiglu_q16_cuda(d_gate.data(), d_up.data(), n, ActQ16{d_q.data(), d_d.data()}, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> ref(n);
    swiglu_cpu(gate.data(), up.data(), ref.data(), n);
    const HostActQ16 got{to_host(d_q), to_host(d_d)};
    EXPECT_EQ(count_nan(got.d), 0u);
    EXPECT_LT(rel_error(dequantize_act_q16_host(got), ref), 1e-4);
    EXPECT_THROW(swiglu_q16_cuda(d_gate.data(), d_up.data(), 100, ActQ16{d_q.data(), d_d.data()}, nullptr), Error);

    // The stamped launch (lab timeline) writes the same bytes, and each block's four stamps are
    // set and in order (entry <= wait <= formed <= stored).
    DeviceBuffer<int16_t> s_q(n);
    DeviceBuffer<float> s_d(n / 32);
    DeviceBuffer<uint64_t> stamps(4 * 64);
    poison(s_q);
    poison(s_d);
    SPILLWAY_CUDA_CHECK(cudaMemset(stamps.data(), 0, stamps.bytes()));
    const uint32_t blocks =
        swiglu_q16_stamped_cuda(d_gate.data(), d_up.data(), n, ActQ16{s_q.data(), s_d.data()}, nullptr, stamps.data());
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(to_host(s_q), got.q);
    EXPECT_EQ(to_host(s_d), got.d);
    ASSERT_GT(blocks, 0u);
    ASSERT_LE(blocks, 64u);
    const std::vector<uint64_t> t = to_host(stamps);
    size_t out_of_order = 0;
    for (uint32_t blk = 0; blk < blocks; ++blk)
        for (int k = 0; k < 4; ++k) out_of_order += t[blk * 4 + k] == 0 || (k > 0 && t[blk * 4 + k] < t[blk * 4 + k - 1]);
    EXPECT_EQ(out_of_order, 0u);
    EXPECT_THROW(swiglu_q16_stamped_cuda(d_gate.data(), d_up.data(), n, ActQ16{s_q.data(), s_d.data()}, nullptr,
                                         nullptr), Error);
}

TEST(CudaSmallOps, KvWriteEqualsTheCpuCodecBytes) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (KvType type : {KvType::f16, KvType::q8_0, KvType::q4_0}) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE(std::string(kv_type_name(type)) + " seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        const uint32_t n_values = 8 * 128, n_cells = 10, first = 3, n_tokens = 5;
        const uint64_t row = kv_row_bytes(type, n_values);
        auto src = random_floats(rng, (size_t)n_tokens * n_values);
        src[7] = 0.0f;  // an all-zero block exercises the d == 0 branch
        for (int i = 32; i < 64; ++i) src[i] = 0.0f;
        auto d_src = to_device(src);
        DeviceBuffer<uint8_t> d_cache(row * n_cells);
        poison(d_cache);
        kv_write_cuda(type, d_src.data(), d_cache.data(), first, n_tokens, n_values, nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const auto cache = to_host(d_cache);
        std::vector<uint8_t> ref(row);
        size_t mismatches = 0;
        for (uint32_t t = 0; t < n_tokens; ++t) {
            kv_store_row(type, src.data() + (size_t)t * n_values, ref.data(), n_values);
            for (uint64_t i = 0; i < row; ++i) mismatches += cache[(first + t) * row + i] != ref[i];
        }
        EXPECT_EQ(mismatches, 0u);
        // Cells outside [first, first + n_tokens) are untouched.
        for (uint64_t i = 0; i < first * row; ++i) ASSERT_EQ(cache[i], 0xFF);
        for (uint64_t i = (first + n_tokens) * row; i < n_cells * row; ++i) ASSERT_EQ(cache[i], 0xFF);
    }
}

}  // namespace
}  // namespace spillway
