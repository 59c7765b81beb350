// The Hopper chunk GEMM on split-layout Q8_0 weights (prefill_gemm_q8s.cuh) against a CPU
// reference: each weight d * q rounded once to f16, x rounded to f16, products summed in
// double. Shapes with partial row and token blocks, odd and even stage counts, both block
// widths, and the y += W x form. Skips where the kernel is not available (not an sm_90 GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "cuda_test_util.h"
#include "engine/cpu/rope.h"
#include "engine/cuda/matvec_q8s.cuh"
#include "engine/cuda/prefill_gemm_q8s.cuh"
#include "engine/cuda/qkv_post.cuh"
#include "engine/cuda/rope.cuh"
#include "engine/cuda/swiglu.cuh"
#include "gguf/quants.h"

namespace spillway {
namespace {

struct SplitMatrix {
    DeviceBuffer<int8_t> codes;
    DeviceBuffer<uint16_t> scales;
    std::vector<float> values;  // each d * q rounded to f16, as the kernel converts it
    uint32_t n_in = 0, n_rows = 0;
    // Rows [r0, r0 + n) as the engine's split-layout matrix.
    CudaMatrix rows(uint32_t r0, uint32_t n) const {
        CudaMatrix w{GgmlType::Q8_0, reinterpret_cast<const uint8_t*>(codes.data()) + (uint64_t)r0 * n_in, n_in, n,
                     *ggml_row_bytes(GgmlType::Q8_0, n_in)};
        w.q8_scales = scales.data() + (uint64_t)r0 * (n_in / 32);
        return w;
    }
    CudaMatrix view() const { return rows(0, n_rows); }
};

SplitMatrix random_split_matrix(std::mt19937& rng, uint32_t n_in, uint32_t n_out) {
    const uint64_t row_bytes = *ggml_row_bytes(GgmlType::Q8_0, n_in);
    std::vector<uint8_t> gguf(row_bytes * n_out);
    SplitMatrix m;
    m.n_in = n_in;
    m.n_rows = n_out;
    m.values.resize((size_t)n_in * n_out);
    std::vector<float> row(n_in);
    for (uint32_t r = 0; r < n_out; ++r) {
        const auto x = cuda_test::random_floats(rng, n_in, 0.5f);
        quantize_row(GgmlType::Q8_0, x.data(), gguf.data() + r * row_bytes, n_in);
        dequantize_row(GgmlType::Q8_0, gguf.data() + r * row_bytes, row.data(), n_in);
        for (uint32_t i = 0; i < n_in; ++i) m.values[(size_t)r * n_in + i] = fp16_to_fp32(fp32_to_fp16(row[i]));
    }
    const auto gguf_dev = cuda_test::to_device(gguf);
    m.codes = DeviceBuffer<int8_t>((size_t)n_out * n_in);
    m.scales = DeviceBuffer<uint16_t>((size_t)n_out * (n_in / 32));
    q8_0_to_split_cuda(gguf_dev.data(), n_out, n_in, Q8Split{m.codes.data(), m.scales.data()}, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    return m;
}

// x [n_tokens][n_in] of random f16 values: their bits, and a copy on the device.
struct F16Input {
    std::vector<uint16_t> bits;
    DeviceBuffer<uint16_t> dev;
    const __half* data() const { return reinterpret_cast<const __half*>(dev.data()); }
};
F16Input random_f16_input(std::mt19937& rng, size_t n) {
    F16Input x;
    x.bits.resize(n);
    for (auto& b : x.bits) b = fp32_to_fp16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
    x.dev = cuda_test::to_device(x.bits);
    return x;
}

// Rows [r0, r0 + n_rows) of m times x, in double: ref [n_tokens][n_rows], and each element's sum
// of |terms| (what f32 accumulation's error scales with).
struct CpuProduct {
    std::vector<double> ref, mag;
};
CpuProduct cpu_product(const SplitMatrix& m, uint32_t r0, uint32_t n_rows, const F16Input& x, uint32_t n_tokens) {
    CpuProduct p;
    p.ref.resize((size_t)n_tokens * n_rows);
    p.mag.resize(p.ref.size());
    std::vector<float> xf(x.bits.size());
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = fp16_to_fp32(x.bits[i]);
    for (uint32_t t = 0; t < n_tokens; ++t)
        for (uint32_t r = 0; r < n_rows; ++r) {
            double sum = 0, abs_sum = 0;
            for (uint32_t k = 0; k < m.n_in; ++k) {
                const double term = (double)m.values[(size_t)(r0 + r) * m.n_in + k] * xf[(size_t)t * m.n_in + k];
                sum += term;
                abs_sum += std::fabs(term);
            }
            p.ref[(size_t)t * n_rows + r] = sum;
            p.mag[(size_t)t * n_rows + r] = abs_sum;
        }
    return p;
}

// f32 accumulation of exact f16 x f16 products (and at most one add of a y term counted in mag):
// a few f32 ulps of the magnitude summed.
bool within_f32_sum(double got, double want, double mag) { return std::fabs(got - want) <= 1e-5 * mag + 1e-6; }

// Room for stream-K partials of one block per SM (or at least 8), and zeroed flags.
struct StreamKSpace {
    DeviceBuffer<float> partials;
    DeviceBuffer<uint32_t> flags;
    StreamKSpace() {
        int dev = 0, sms = 0;
        SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        const uint32_t blocks = std::max(sms, 8);
        partials = DeviceBuffer<float>(prefill_gemm_q8s_partial_floats(blocks));
        flags = DeviceBuffer<uint32_t>(blocks);
        SPILLWAY_CUDA_CHECK(cudaMemset(flags.data(), 0, flags.bytes()));
    }
    GemmWorkspace view(uint32_t max_blocks) const {
        return GemmWorkspace{partials.data(), partials.size(), flags.data(), (uint32_t)flags.size(), max_blocks};
    }
    // Every launch hands the flags back as it found them.
    size_t flags_raised() const {
        size_t raised = 0;
        for (uint32_t f : cuda_test::to_host(flags)) raised += f != 0;
        return raised;
    }
};

TEST(CudaPrefillGemmQ8s, MatchesCpuOnEveryBlockShape) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!prefill_gemm_q8s_available()) GTEST_SKIP() << "needs an sm_90 GPU and an sm_90a build";
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    struct Shape {
        uint32_t n_in, n_out, n_tokens;
    };
    StreamKSpace space;
    // 64: one stage; 320: 5 (the odd tail); 512: 8. Rows and tokens past whole blocks.
    for (const Shape s : {Shape{64, 128, 5}, Shape{320, 300, 300}, Shape{512, 200, 257}, Shape{512, 384, 130}}) {
        SCOPED_TRACE("n_in " + std::to_string(s.n_in) + " n_out " + std::to_string(s.n_out) + " tokens " +
                     std::to_string(s.n_tokens));
        const SplitMatrix m = random_split_matrix(rng, s.n_in, s.n_out);
        const CudaMatrix w = m.view();
        const F16Input x = random_f16_input(rng, (size_t)s.n_tokens * s.n_in);
        const auto y0 = cuda_test::random_floats(rng, (size_t)s.n_tokens * s.n_out);
        const CpuProduct cpu = cpu_product(m, 0, s.n_out, x, s.n_tokens);
        // All rows in 128- or 256-token tiles, and the first 128 rows wide, the rest narrow; whole
        // tiles only, or some cut along k (blocks: one per SM, or 3-5 for the schedules that mix
        // whole and cut tiles on these few tiles).
        for (const Q8sGemmSplit split : {Q8sGemmSplit{0, s.n_out}, Q8sGemmSplit{s.n_out, 0}, Q8sGemmSplit{128, s.n_out - 128}})
            for (const int blocks : {-1, 0, 3, 4, 5})
            for (const bool add : {false, true}) {
                SCOPED_TRACE("rows " + std::to_string(split.rows_wide) + " wide + " + std::to_string(split.rows_narrow) +
                             " narrow" + (add ? ", y += W x" : ", y = W x") +
                             (blocks < 0 ? ", whole tiles" : ", stream-K on " + std::to_string(blocks) + " blocks"));
                auto y = cuda_test::to_device(y0);
                if (!add) cuda_test::poison(y);
                cuda_test::poison(space.partials);
                ASSERT_TRUE(prefill_gemm_q8s_cuda(w, x.data(), s.n_tokens, y.data(), add, nullptr, split,
                                                  blocks < 0 ? GemmWorkspace{} : space.view((uint32_t)blocks)));
                SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                EXPECT_EQ(space.flags_raised(), 0u);
                const auto got = cuda_test::to_host(y);
                size_t bad = 0;
                double worst = 0;
                for (size_t i = 0; i < got.size(); ++i) {
                    const double y_in = add ? y0[i] : 0.0;
                    bad += !within_f32_sum(got[i], cpu.ref[i] + y_in, cpu.mag[i] + std::fabs(y_in));
                    worst = std::max(worst, std::fabs(got[i] - cpu.ref[i] - y_in) / (cpu.mag[i] + 1e-30));
                }
                EXPECT_EQ(bad, 0u) << "of " << got.size() << "; worst error / magnitude " << worst;
            }
    }
}

// Rows split over several outputs (q | k | v in one launch): each output equals, bit for bit,
// the same rows multiplied on their own (every element sums the same products in the same
// order), with y row strides wider than the rows and both block widths; and the CPU agrees.
TEST(CudaPrefillGemmQ8s, OutputsOfOneLaunchEqualSeparateLaunches) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!prefill_gemm_q8s_available()) GTEST_SKIP() << "needs an sm_90 GPU and an sm_90a build";
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n_in = 192, T = 300;
    const uint32_t rows[3] = {256, 128, 100}, strides[3] = {256, 132, 104};
    const uint32_t n_out = rows[0] + rows[1] + rows[2];
    const SplitMatrix m = random_split_matrix(rng, n_in, n_out);
    const CudaMatrix all = m.view();
    const F16Input input = random_f16_input(rng, (size_t)T * n_in);
    const __half* x = input.data();
    const CpuProduct cpu = cpu_product(m, 0, n_out, input, T);
    for (const Q8sGemmSplit split : {Q8sGemmSplit{}, Q8sGemmSplit{0, n_out}, Q8sGemmSplit{256, n_out - 256}}) {
        SCOPED_TRACE("split " + std::to_string(split.rows_wide) + " + " + std::to_string(split.rows_narrow));
        std::vector<DeviceBuffer<float>> merged, alone;
        std::vector<GemmOutput> outs;
        for (int i = 0; i < 3; ++i) {
            merged.emplace_back((size_t)T * strides[i]);
            alone.emplace_back((size_t)T * rows[i]);
            cuda_test::poison(merged.back());
            cuda_test::poison(alone.back());
            outs.push_back(GemmOutput{merged.back().data(), rows[i], strides[i]});
        }
        ASSERT_TRUE(prefill_gemm_q8s_cuda(all, x, T, std::span<const GemmOutput>(outs), false, nullptr, split));
        uint32_t row0 = 0;
        for (int i = 0; i < 3; ++i) {
            ASSERT_TRUE(prefill_gemm_q8s_cuda(m.rows(row0, rows[i]), x, T, alone[i].data(), false, nullptr));
            row0 += rows[i];
        }
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        row0 = 0;
        for (int i = 0; i < 3; ++i) {
            const auto got = cuda_test::to_host(merged[i]), want = cuda_test::to_host(alone[i]);
            size_t differ = 0, cpu_bad = 0;
            for (uint32_t t = 0; t < T; ++t)
                for (uint32_t r = 0; r < rows[i]; ++r) {
                    const float g = got[(size_t)t * strides[i] + r];
                    differ += std::memcmp(&g, &want[(size_t)t * rows[i] + r], 4) != 0;
                    const size_t at = (size_t)t * n_out + row0 + r;
                    cpu_bad += !within_f32_sum(g, cpu.ref[at], cpu.mag[at]);
                }
            EXPECT_EQ(differ, 0u) << "output " << i;
            EXPECT_EQ(cpu_bad, 0u) << "output " << i;
            // The padding columns between rows and stride stay untouched (still the poison).
            size_t padding_written = 0;
            for (uint32_t t = 0; t < T; ++t)
                for (uint32_t r = rows[i]; r < strides[i]; ++r) padding_written += !std::isnan(got[(size_t)t * strides[i] + r]);
            EXPECT_EQ(padding_written, 0u) << "output " << i;
            row0 += rows[i];
        }
    }
    // Outputs that do not start at whole 128-row blocks, or do not cover the matrix.
    DeviceBuffer<float> y((size_t)T * n_out);
    const GemmOutput ragged[2] = {{y.data(), 100, 100}, {y.data(), n_out - 100, n_out}};
    EXPECT_THROW(prefill_gemm_q8s_cuda(all, x, T, std::span<const GemmOutput>(ragged), false, nullptr), Error);
    const GemmOutput short_of_rows[1] = {{y.data(), n_out - 4, n_out}};
    EXPECT_THROW(prefill_gemm_q8s_cuda(all, x, T, std::span<const GemmOutput>(short_of_rows), false, nullptr), Error);
}

// Tiles cut along k (stream-K): six tiles on a GPU's worth of blocks and on 7, 12 and 40 (shares
// of 27, 16 and 4-5 steps: a tile in 2, 3 or 7 shares), and whole tiles on 4, against the
// CPU, y = and y +=; the same bits on a second run; the flags left zero. And the workspace's
// own errors: partials overlapping the output, unaligned partials.
TEST(CudaPrefillGemmQ8s, StreamKMatchesCpuAndRepeats) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!prefill_gemm_q8s_available()) GTEST_SKIP() << "needs an sm_90 GPU and an sm_90a build";
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n_in = 2048, n_out = 300, T = 260;  // 32 stage steps; 3 x 2 wide tiles
    const SplitMatrix m = random_split_matrix(rng, n_in, n_out);
    const CudaMatrix w = m.view();
    const F16Input input = random_f16_input(rng, (size_t)T * n_in);
    const __half* x = input.data();
    const auto y0 = cuda_test::random_floats(rng, (size_t)T * n_out);
    const CpuProduct cpu = cpu_product(m, 0, n_out, input, T);
    StreamKSpace space;
    const Q8sGemmSplit all_wide{n_out, 0};
    for (const uint32_t blocks : {0u, 4u, 7u, 12u, 40u})
        for (const bool add : {false, true}) {
            SCOPED_TRACE(std::to_string(blocks) + " blocks" + (add ? ", y += W x" : ", y = W x"));
            std::vector<float> runs[2];
            for (auto& run : runs) {
                auto y = cuda_test::to_device(y0);
                if (!add) cuda_test::poison(y);
                cuda_test::poison(space.partials);
                ASSERT_TRUE(prefill_gemm_q8s_cuda(w, x, T, y.data(), add, nullptr, all_wide, space.view(blocks)));
                SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                run = cuda_test::to_host(y);
            }
            EXPECT_EQ(space.flags_raised(), 0u);
            EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4), 0) << "two runs differ";
            size_t bad = 0;
            for (size_t i = 0; i < runs[0].size(); ++i) {
                const double y_in = add ? y0[i] : 0.0;
                bad += !within_f32_sum(runs[0][i], cpu.ref[i] + y_in, cpu.mag[i] + std::fabs(y_in));
            }
            EXPECT_EQ(bad, 0u) << "of " << (size_t)T * n_out;
        }
    // The SwiGLU epilogue on cut tiles: within an f16 rounding of the separate path's values,
    // plus what the f32 gate and up summed in another order move it (a few f32 ulps of ~400 in
    // |terms| each, times the other factor, ~10: 0.05).
    {
        const uint32_t n_ff = 128;
        const SplitMatrix gu = random_split_matrix(rng, n_in, 2 * n_ff);
        DeviceBuffer<float> gate((size_t)T * n_ff), up((size_t)T * n_ff);
        ASSERT_TRUE(prefill_gemm_q8s_cuda(gu.rows(0, n_ff), x, T, gate.data(), false, nullptr));
        ASSERT_TRUE(prefill_gemm_q8s_cuda(gu.rows(n_ff, n_ff), x, T, up.data(), false, nullptr));
        DeviceBuffer<__half> want_dev((size_t)T * n_ff), act((size_t)T * n_ff);
        swiglu_f16_cuda(gate.data(), up.data(), want_dev.data(), (size_t)T * n_ff, nullptr);
        cuda_test::poison(act);
        ASSERT_TRUE(prefill_gemm_q8s_swiglu_cuda(gu.view(), x, T, act.data(), nullptr, Q8sGemmSplit{2 * n_ff, 0},
                                                 space.view(5)));
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(space.flags_raised(), 0u);
        const auto got = cuda_test::to_host(act), want = cuda_test::to_host(want_dev);
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const float g = fp16_to_fp32(reinterpret_cast<const uint16_t&>(got[i]));
            const float v = fp16_to_fp32(reinterpret_cast<const uint16_t&>(want[i]));
            bad += !(std::fabs(g - v) <= std::fabs(v) * (1.0f / 512) + 0.05f);
        }
        EXPECT_EQ(bad, 0u) << "of " << got.size();
    }
    DeviceBuffer<float> y((size_t)T * n_out + 64);
    const GemmWorkspace overlapping{y.data(), y.size(), space.flags.data(), (uint32_t)space.flags.size(), 0};
    EXPECT_THROW(prefill_gemm_q8s_cuda(w, x, T, y.data(), false, nullptr, all_wide, overlapping), Error);
    GemmWorkspace unaligned = space.view(0);
    unaligned.partials += 1;
    EXPECT_THROW(prefill_gemm_q8s_cuda(w, x, T, y.data(), false, nullptr, all_wide, unaligned), Error);
}

// Pure: a wave or more stays whole tiles; under a wave every tile is cut so that every block
// does the same work to within a stage step (or a share of a few, where there are too few steps
// for every block).
TEST(CudaPrefillGemmQ8s, ScheduleCutsOnlyUnderAWave) {
    auto expect = [](uint32_t tiles, uint32_t n_k, uint32_t blocks, Q8sGemmSchedule want) {
        const Q8sGemmSchedule s = prefill_gemm_q8s_schedule(tiles, n_k, blocks, true);
        EXPECT_EQ(std::tuple(s.grid, s.sk_tiles, s.sk_blocks), std::tuple(want.grid, want.sk_tiles, want.sk_blocks))
            << tiles << " tiles, " << n_k << " steps, " << blocks << " blocks";
    };
    expect(1728, 80, 132, {132, 0, 0});     // the 14B's gate|up at 2048 tokens: 13 waves + 12 tiles, whole
    expect(320, 216, 132, {132, 0, 0});     // down at 2048 tokens: 2 waves + 56, whole
    expect(80, 216, 132, {132, 80, 132});   // down at 512 tokens: 0.6 of a wave, all cut
    expect(10, 8, 132, {20, 10, 20});       // 80 steps: 20 shares of 4
    expect(4, 2, 132, {4, 0, 0});           // too few steps to share: whole tiles
    expect(6, 32, 7, {7, 6, 7});
    EXPECT_EQ(prefill_gemm_q8s_schedule(1728, 80, 132, false).sk_tiles, 0u);
    EXPECT_EQ(prefill_gemm_q8s_schedule(5, 80, 132, false).grid, 5u);
    // Every block's work: its whole tiles' steps and its share of the cut tiles' steps.
    std::mt19937 rng(cuda_test::fresh_seed());
    for (int trial = 0; trial < 2000; ++trial) {
        const uint32_t tiles = 1 + rng() % 3000, n_k = 1 + rng() % 300, blocks = 1 + rng() % 200;
        const Q8sGemmSchedule s = prefill_gemm_q8s_schedule(tiles, n_k, blocks, true);
        const std::string what = std::to_string(tiles) + " tiles, " + std::to_string(n_k) + " steps, " +
                                 std::to_string(blocks) + " blocks";
        ASSERT_GE(s.grid, 1u) << what;
        ASSERT_LE(s.grid, blocks) << what;
        ASSERT_LE(s.sk_tiles, tiles) << what;
        ASSERT_LE(s.sk_blocks, s.grid) << what;
        const uint32_t dp = tiles - s.sk_tiles;
        if (s.sk_tiles > 0) {
            ASSERT_EQ(dp % s.grid, 0u) << what;
            ASSERT_GT(s.sk_blocks, s.sk_tiles) << what;  // else cutting buys nothing
        }
        const uint64_t units = (uint64_t)s.sk_tiles * n_k;
        uint64_t least = UINT64_MAX, most = 0;
        for (uint32_t b = 0; b < s.grid; ++b) {
            const uint64_t share = b < s.sk_blocks ? units * (b + 1) / s.sk_blocks - units * b / s.sk_blocks : 0;
            const uint64_t whole = dp > b ? (dp - b + s.grid - 1) / s.grid : 0;
            const uint64_t work = share + whole * n_k;
            if (b < s.sk_blocks && s.sk_tiles > 0) ASSERT_GE(share, 4u) << what;
            least = std::min(least, work);
            most = std::max(most, work);
        }
        // Cut: shares over every block differ by a step; over fewer (too few steps for all),
        // by a share of at most 8. Whole tiles left unbalanced only where a share would be
        // under 4 steps.
        if (s.sk_tiles > 0) ASSERT_LE(most - least, s.sk_blocks == s.grid ? 1u : 8u) << what;
        else if (most - least > n_k) ADD_FAILURE() << what;
        if (tiles >= blocks) ASSERT_EQ(s.sk_tiles, 0u) << what;
        else if (s.sk_tiles == 0) ASSERT_LT((uint64_t)tiles * n_k / 4, (uint64_t)tiles + 1) << what;
    }
}

// gate | up with the SwiGLU in the epilogue: the f16 output has the bits of the separate path
// (the two products as f32, then swiglu_f16_cuda), for each way of splitting the rows.
TEST(CudaPrefillGemmQ8s, SwigluEpilogueEqualsSeparateSwiglu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!prefill_gemm_q8s_available()) GTEST_SKIP() << "needs an sm_90 GPU and an sm_90a build";
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n_in = 320, n_ff = 192, T = 300;
    const SplitMatrix m = random_split_matrix(rng, n_in, 2 * n_ff);
    const CudaMatrix gate_up = m.view();
    const F16Input input = random_f16_input(rng, (size_t)T * n_in);
    const __half* x = input.data();
    // gate and up on their own (192 rows are not whole 128-row outputs of one launch).
    DeviceBuffer<float> gate((size_t)T * n_ff), up((size_t)T * n_ff);
    ASSERT_TRUE(prefill_gemm_q8s_cuda(m.rows(0, n_ff), x, T, gate.data(), false, nullptr));
    ASSERT_TRUE(prefill_gemm_q8s_cuda(m.rows(n_ff, n_ff), x, T, up.data(), false, nullptr));
    DeviceBuffer<__half> want_dev((size_t)T * n_ff);
    swiglu_f16_cuda(gate.data(), up.data(), want_dev.data(), (size_t)T * n_ff, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    const auto want = cuda_test::to_host(want_dev);
    for (const Q8sGemmSplit split : {Q8sGemmSplit{}, Q8sGemmSplit{0, 2 * n_ff}, Q8sGemmSplit{128, 2 * n_ff - 128},
                                     Q8sGemmSplit{2 * n_ff, 0}}) {
        SCOPED_TRACE("split " + std::to_string(split.rows_wide) + " + " + std::to_string(split.rows_narrow));
        DeviceBuffer<__half> act((size_t)T * n_ff);
        cuda_test::poison(act);
        ASSERT_TRUE(prefill_gemm_q8s_swiglu_cuda(gate_up, x, T, act.data(), nullptr, split));
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = cuda_test::to_host(act);
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 2) != 0;
        EXPECT_EQ(differ, 0u) << "of " << got.size();
    }
    // Features not in whole blocks of 64: declined, nothing written.
    const SplitMatrix odd = random_split_matrix(rng, n_in, 2 * 96);
    DeviceBuffer<__half> act((size_t)T * 96);
    EXPECT_FALSE(prefill_gemm_q8s_swiglu_cuda(odd.view(), x, T, act.data(), nullptr));
}

// q|k|v with bias, NeoX RoPE and the f16 K/V write in the epilogue against the GEMM into f32 q |
// k | v followed by qkv_post_cuda (the path it replaces): the same bits in q and in the cache
// rows, every split, with and without bias, whole tiles and tiles cut along k; the cells before
// and after the chunk untouched. And what it declines.
TEST(CudaPrefillGemmQ8s, QkvRopeEpilogueEqualsGemmThenPost) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!prefill_gemm_q8s_available()) GTEST_SKIP() << "needs an sm_90 GPU and an sm_90a build";
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n_head = 3, n_head_kv = 2, hd = 128, n_in = 640, T = 300, first_cell = 41;
    const uint32_t qd = n_head * hd, kd = n_head_kv * hd, n_out = qd + 2 * kd, n_cells = first_cell + T + 7;
    const SplitMatrix m = random_split_matrix(rng, n_in, n_out);
    const CudaMatrix wqkv = m.view();
    const F16Input input = random_f16_input(rng, (size_t)T * n_in);
    const __half* x = input.data();
    const auto bias = cuda_test::to_device(cuda_test::random_floats(rng, n_out, 0.5f));
    // Qwen2's RoPE (NeoX over the whole head), positions of a chunk deep into a long prompt.
    RopeSpec spec;
    spec.type = RopeType::neox;
    spec.freq_base = 1000000.0f;
    spec.n_dims = hd;
    const RopeTables tables = make_rope_tables(spec, hd);
    const auto inv_freq = cuda_test::to_device(tables.inv_freq);
    const auto ramp_mix = cuda_test::to_device(tables.ramp_mix);
    RopeDeviceTables rope;
    rope.neox = true;
    rope.n_dims = hd;
    rope.inv_freq = inv_freq.data();
    rope.ramp_mix = ramp_mix.data();
    rope.freq_scale = tables.freq_scale;
    rope.mscale = tables.mscale;
    std::vector<int32_t> positions(T);
    for (uint32_t t = 0; t < T; ++t) positions[t] = (int32_t)(70000 + first_cell + t);
    const auto d_positions = cuda_test::to_device(positions);
    DeviceBuffer<float2> table((size_t)T * hd / 2);
    rope_table_cuda(rope, d_positions.data(), T, table.data(), nullptr);
    const StreamKSpace stream_k;

    struct Run {
        Q8sGemmSplit split;
        uint32_t max_blocks;  // 0: whole tiles only (no workspace)
    };
    for (const bool with_bias : {true, false})
        for (const Run run : {Run{{}, 0}, Run{{0, n_out}, 0}, Run{{256, n_out - 256}, 0}, Run{{n_out, 0}, 0},
                              Run{{n_out, 0}, 40}, Run{{0, n_out}, 60}}) {
            SCOPED_TRACE("bias " + std::to_string(with_bias) + " split " + std::to_string(run.split.rows_wide) + " + " +
                         std::to_string(run.split.rows_narrow) + " blocks " + std::to_string(run.max_blocks));
            const GemmWorkspace workspace = run.max_blocks ? stream_k.view(run.max_blocks) : GemmWorkspace{};
            // The path it replaces: f32 q | k | v, then bias + RoPE + the K/V write. With the same
            // split and workspace: tiles cut along k add their shares in another order than whole
            // tiles do, the same order in both kernels.
            DeviceBuffer<float> q_want((size_t)T * qd), k_f32((size_t)T * kd), v_f32((size_t)T * kd);
            DeviceBuffer<uint16_t> k_want((size_t)n_cells * kd), v_want((size_t)n_cells * kd);
            cuda_test::poison(k_want);
            cuda_test::poison(v_want);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const GemmOutput outs[3] = {{q_want.data(), qd, qd}, {k_f32.data(), kd, kd}, {v_f32.data(), kd, kd}};
            ASSERT_TRUE(prefill_gemm_q8s_cuda(wqkv, x, T, std::span<const GemmOutput>(outs), false, nullptr, run.split,
                                              workspace));
            qkv_post_cuda(QkvPostShape{n_head, n_head_kv, hd}, rope, q_want.data(), k_f32.data(), v_f32.data(),
                          with_bias ? bias.data() : nullptr, T, d_positions.data(), KvType::f16,
                          reinterpret_cast<uint8_t*>(k_want.data()), KvType::f16,
                          reinterpret_cast<uint8_t*>(v_want.data()), first_cell, nullptr, table.data());
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const auto q_ref = cuda_test::to_host(q_want);
            const auto k_ref = cuda_test::to_host(k_want), v_ref = cuda_test::to_host(v_want);

            DeviceBuffer<float> q((size_t)T * qd);
            DeviceBuffer<uint16_t> kc((size_t)n_cells * kd), vc((size_t)n_cells * kd);
            cuda_test::poison(q);
            cuda_test::poison(kc);
            cuda_test::poison(vc);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const QkvRopeChunk out{q.data(), reinterpret_cast<__half*>(kc.data() + (size_t)first_cell * kd),
                                   reinterpret_cast<__half*>(vc.data() + (size_t)first_cell * kd),
                                   with_bias ? bias.data() : nullptr, table.data(), n_head, n_head_kv};
            ASSERT_TRUE(prefill_gemm_q8s_qkv_rope_cuda(wqkv, x, T, out, nullptr, run.split, workspace));
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const auto q_got = cuda_test::to_host(q);
            const auto k_got = cuda_test::to_host(kc), v_got = cuda_test::to_host(vc);
            size_t q_differ = 0, k_differ = 0, v_differ = 0;
            for (size_t i = 0; i < q_got.size(); ++i) q_differ += std::memcmp(&q_got[i], &q_ref[i], 4) != 0;
            // Every cell, the ones outside the chunk included (still the same poison).
            for (size_t i = 0; i < k_got.size(); ++i) k_differ += k_got[i] != k_ref[i];
            for (size_t i = 0; i < v_got.size(); ++i) v_differ += v_got[i] != v_ref[i];
            EXPECT_EQ(q_differ, 0u) << "of " << q_got.size();
            EXPECT_EQ(k_differ, 0u) << "of " << k_got.size();
            EXPECT_EQ(v_differ, 0u) << "of " << v_got.size();
            EXPECT_EQ(stream_k.flags_raised(), 0u);
        }

    // Declined, nothing launched: heads of 64 dims, rows that are not q | k | v of the heads given.
    DeviceBuffer<float> q((size_t)T * qd);
    DeviceBuffer<uint16_t> kc((size_t)T * kd), vc((size_t)T * kd);
    const QkvRopeChunk out{q.data(), reinterpret_cast<__half*>(kc.data()), reinterpret_cast<__half*>(vc.data()), nullptr,
                           table.data(), n_head, n_head_kv};
    EXPECT_FALSE(prefill_gemm_q8s_qkv_rope_takes(wqkv, 2 * n_head, 2 * n_head_kv, 64));
    EXPECT_FALSE(prefill_gemm_q8s_qkv_rope_takes(wqkv, n_head + 1, n_head_kv, hd));
    QkvRopeChunk other_heads = out;
    other_heads.n_head_kv = 1;
    EXPECT_FALSE(prefill_gemm_q8s_qkv_rope_cuda(wqkv, x, T, other_heads, nullptr));
    // Missing or unaligned outputs are errors, not a silent fallback.
    QkvRopeChunk no_table = out;
    no_table.rope_table = nullptr;
    EXPECT_THROW(prefill_gemm_q8s_qkv_rope_cuda(wqkv, x, T, no_table, nullptr), Error);
    QkvRopeChunk unaligned = out;
    unaligned.k = reinterpret_cast<__half*>(kc.data() + 1);
    EXPECT_THROW(prefill_gemm_q8s_qkv_rope_cuda(wqkv, x, T, unaligned, nullptr), Error);
    EXPECT_THROW(prefill_gemm_q8s_qkv_rope_cuda(wqkv, x, T, out, nullptr, Q8sGemmSplit{64, n_out - 64}), Error);
}

// Where it does not apply, it launches nothing and says so: the GGUF layout, rows that are not
// whole 64-value stages, an unaligned x.
TEST(CudaPrefillGemmQ8s, DeclinesWhatItDoesNotTake) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!prefill_gemm_q8s_available()) GTEST_SKIP() << "needs an sm_90 GPU and an sm_90a build";
    std::mt19937 rng(cuda_test::fresh_seed());
    const SplitMatrix m = random_split_matrix(rng, 96, 128);
    DeviceBuffer<__half> x(4 * 96 + 8);
    DeviceBuffer<float> y(4 * 128);
    cuda_test::poison(y);
    CudaMatrix w = m.view();
    EXPECT_FALSE(prefill_gemm_q8s_cuda(w, x.data(), 4, y.data(), false, nullptr));  // 96 % 64 != 0
    w.n_in = 64;
    w.q8_scales = nullptr;
    EXPECT_FALSE(prefill_gemm_q8s_cuda(w, x.data(), 4, y.data(), false, nullptr));  // GGUF layout
    w.q8_scales = m.scales.data();
    EXPECT_FALSE(prefill_gemm_q8s_cuda(w, x.data() + 1, 4, y.data(), false, nullptr));  // x 2-byte aligned
    EXPECT_THROW(prefill_gemm_q8s_cuda(w, x.data(), 4, y.data(), false, nullptr, Q8sGemmSplit{64, 64}), Error);
    EXPECT_THROW(prefill_gemm_q8s_cuda(w, x.data(), 4, y.data(), false, nullptr, Q8sGemmSplit{128, 64}), Error);
    // y rows must be 16-byte strided (TMA stores): rows that are not a multiple of 4 are
    // declined, an output stride that is not is an error.
    CudaMatrix ragged = w;
    ragged.n_out = 126;
    EXPECT_FALSE(prefill_gemm_q8s_cuda(ragged, x.data(), 4, y.data(), false, nullptr));
    const GemmOutput odd_stride[1] = {{y.data(), 64, 126}};
    CudaMatrix half_rows = w;
    half_rows.n_out = 64;
    EXPECT_THROW(prefill_gemm_q8s_cuda(half_rows, x.data(), 2, std::span<const GemmOutput>(odd_stride), false, nullptr),
                 Error);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    const auto untouched = cuda_test::to_host(y);
    size_t written = 0;
    for (float v : untouched) written += !std::isnan(v);
    EXPECT_EQ(written, 0u);
}

// Pure: the rows' split between 256- and 128-token blocks follows whole waves of blocks, a
// wave of 128-token blocks weighing 2/3 of one of 256.
TEST(CudaPrefillGemmQ8s, SplitFollowsWaves) {
    auto split = [](uint32_t tokens, uint32_t rows) {
        const Q8sGemmSplit s = prefill_gemm_q8s_split(tokens, rows, 132);
        EXPECT_EQ(s.rows_wide + s.rows_narrow, rows);
        EXPECT_EQ(s.rows_wide % 128, 0u);
        return std::pair{s.rows_wide, s.rows_narrow};
    };
    // 40 row blocks, 2048 tokens: 320 wide blocks take 3 waves (cost 9), 640 narrow 5 (10);
    // 33 row blocks wide (264 blocks, 2 waves: 6) + 7 narrow (112 blocks, 1 wave: 2) = 8.
    EXPECT_EQ(split(2048, 5120), std::pair(33u * 128, 7u * 128));
    // 512 tokens: 80 wide blocks, one wave (3); 160 narrow, 2 waves (4); no whole wave to split.
    EXPECT_EQ(split(512, 5120), std::pair(5120u, 0u));
    // 8 row blocks, 2048 tokens: 64 wide blocks (3) or 128 narrow (2), both one wave.
    EXPECT_EQ(split(2048, 1024), std::pair(0u, 1024u));
    // 108 row blocks, 2048 tokens: 864 wide blocks, 7 waves (21); 99 wide (6 waves) + 9 narrow
    // (144 blocks, 2 waves) = 22; narrow alone 14 waves (28).
    EXPECT_EQ(split(2048, 13824), std::pair(13824u, 0u));
    // Rows that end inside a block: 300 rows = 3 row blocks, one wave either way: narrow.
    EXPECT_EQ(split(300, 300), std::pair(0u, 300u));
    // Balanced launches (stream-K) under a wave of wide tiles: the width with less work.
    EXPECT_EQ(prefill_gemm_q8s_split(512, 5120, 132, true).rows_wide, 5120u);
    EXPECT_EQ(prefill_gemm_q8s_split(2048, 1024, 132, true).rows_wide, 1024u);  // 64 tiles: wide, not narrow
    EXPECT_EQ(split(2048, 1024), std::pair(0u, 1024u));
    EXPECT_EQ(prefill_gemm_q8s_split(2048, 5120, 132, true).rows_wide, 33u * 128);  // a wave or more: as above
    EXPECT_EQ(prefill_gemm_q8s_split(100, 5120, 132, true).rows_narrow, 5120u);
    EXPECT_EQ(prefill_gemm_q8s_split(300, 300, 132, true).rows_wide, 300u);  // 6 x 3 = 9 x 2: a tie, wide
}

}  // namespace
}  // namespace spillway
