// matvec_cuda vs the CPU: weights quantized by gguf/quants.h, reference = dequantized
// weights times x in double. The GPU uses the same dequantized values and accumulates in
// f32, so the tolerance is f32 summation error, measured against each sum's terms
// (sum_error): 1e-6 for every weight type.
#include "engine/cuda/matvec.cuh"
#include "engine/cuda/matvec_q8s.cuh"
#include "engine/cuda/qkv_post.cuh"
#include "engine/cuda/rmsnorm.cuh"
#include "engine/cuda/swiglu.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>

#include "act_q16_ref.h"
#include "cuda_test_util.h"
#include "gguf/quants.h"
#include "rope_test_util.h"

namespace spillway {
namespace {

using namespace cuda_test;

struct MatvecCase {
    GgmlType type;
    uint32_t rows, cols, n_tokens;
    // Q8_0 only: force this kernel variant (default: whatever matvec_cuda picks).
    std::optional<MatvecQ8Kernel> q8_kernel = std::nullopt;
};

// A random rows x cols matrix of `type`: its bytes and its values as the kernels see them.
struct HostWeights {
    std::vector<uint8_t> bytes;
    std::vector<float> values;
};
HostWeights random_weights(std::mt19937& rng, GgmlType type, uint32_t rows, uint32_t cols) {
    const std::vector<float> w = random_floats(rng, (size_t)rows * cols, 0.05f);
    const uint64_t row_bytes = *ggml_row_bytes(type, cols);
    HostWeights m{std::vector<uint8_t>(row_bytes * rows), std::vector<float>((size_t)rows * cols)};
    for (uint32_t r = 0; r < rows; ++r) {
        quantize_row(type, w.data() + (size_t)r * cols, m.bytes.data() + r * row_bytes, cols);
        dequantize_row(type, m.bytes.data() + r * row_bytes, m.values.data() + (size_t)r * cols, cols);
    }
    return m;
}

void check_matvec(const MatvecCase& c) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE(std::string(ggml_type_name(c.type)) +
                 (c.q8_kernel ? " kernel=" + std::to_string((int)*c.q8_kernel) : std::string()) + " rows=" + std::to_string(c.rows) + " cols=" +
                 std::to_string(c.cols) + " tokens=" + std::to_string(c.n_tokens) + " seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    const auto [w_q, w_deq] = random_weights(rng, c.type, c.rows, c.cols);
    std::vector<float> x = random_floats(rng, (size_t)c.n_tokens * c.cols);
    const std::vector<float> x_exact = x;
    // The int8 variant rounds x per 32 values exactly as the kernel does (d = amax / 127 in f32,
    // q = round-half-even(x / d)); the reference then uses those dequantized x, so the GPU-CPU
    // difference is again f32 summation error only. Its distance to the exact-x product
    // (x_exact) is checked separately, against the rounding's own size.
    const bool quantized_x = c.q8_kernel == MatvecQ8Kernel::stream2_i8;
    if (quantized_x) {
        for (size_t b = 0; b < x.size(); b += 32) {
            float amax = 0.0f;
            for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
            const float d = amax / 127.0f;
            for (size_t i = b; i < b + 32; ++i) x[i] = d > 0.0f ? std::nearbyint(x[i] / d) * d : 0.0f;
        }
    }

    std::vector<float> ref((size_t)c.n_tokens * c.rows), mag(ref.size());
    for (uint32_t t = 0; t < c.n_tokens; ++t) {
        for (uint32_t r = 0; r < c.rows; ++r) {
            double sum = 0.0, abs_sum = 0.0;
            for (uint32_t k = 0; k < c.cols; ++k) {
                const double term = (double)w_deq[(size_t)r * c.cols + k] * x[(size_t)t * c.cols + k];
                sum += term;
                abs_sum += std::fabs(term);
            }
            ref[(size_t)t * c.rows + r] = (float)sum;
            mag[(size_t)t * c.rows + r] = (float)abs_sum;
        }
    }

    auto d_w = to_device(w_q);
    auto d_x = to_device(x_exact);
    DeviceBuffer<float> d_y(ref.size());
    poison(d_y);
    if (c.q8_kernel)
        matvec_q8_0_cuda(*c.q8_kernel, d_w.data(), d_x.data(), d_y.data(), c.rows, c.cols, c.n_tokens, nullptr);
    else
        matvec_cuda(c.type, d_w.data(), d_x.data(), d_y.data(), c.rows, c.cols, c.n_tokens, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> y = to_host(d_y);
    EXPECT_EQ(count_nan(y), 0u);
    const double err = sum_error(y, ref, mag);
    EXPECT_LT(err, 1e-6) << "error relative to the sums' terms " << err << " (to the result " << rel_error(y, ref) << ")";
    if (quantized_x) {
        // Rounding x to 8 bits per 32 values: error per x value uniform in +-d/2 with
        // d = amax/127, i.e. RMS ~ amax/440 ~ 0.4% of x's RMS for uniform x; the product's
        // relative error is about the same (~4e-3). Bound it at 1e-2 and print it.
        std::vector<float> ref_exact(ref.size());
        for (uint32_t t = 0; t < c.n_tokens; ++t)
            for (uint32_t r = 0; r < c.rows; ++r) {
                double sum = 0.0;
                for (uint32_t k = 0; k < c.cols; ++k)
                    sum += (double)w_deq[(size_t)r * c.cols + k] * x_exact[(size_t)t * c.cols + k];
                ref_exact[(size_t)t * c.rows + r] = (float)sum;
            }
        const double err_x = rel_error(y, ref_exact);
        std::printf("  int8-x variant rows=%u cols=%u: rel. error vs exact-x product %.2e\n", c.rows, c.cols, err_x);
        // Only over many rows: for few rows the ratio |error| / |y| is that of two random
        // sums and has a heavy tail (seen on the H200: 2.2e-2 for 1 row of 256 columns and
        // 1.05e-2 for 7 rows of 256, while 33..20001 rows gave 3.4e-3..5.5e-3). The kernel's
        // own exactness is the 1e-5 check above, against the product with x rounded the same way.
        if (c.rows * c.n_tokens >= 32) EXPECT_LT(err_x, 1e-2);
    }
}

TEST(CudaMatvec, MatchesCpuForEveryTypeShapeAndBatch) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (GgmlType type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
        // 896 columns: Q8_0 rows are not 16-byte aligned (the 2-byte-load path); odd row
        // counts leave half-filled warps; 5120 / 13824 are Qwen2.5-14B's shapes.
        for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
                 {257, 896}, {1000, 5120}, {33, 13824}, {5, 64}}) {
            for (uint32_t n_tokens : {1u, 2u, 3u, 8u}) check_matvec({type, rows, cols, n_tokens});
        }
    }
}

// The Q8_0 variants on their own: the streaming kernels (one token, cols % 256 == 0) on row
// lengths whose last chunk is partial (5120: 80 block pairs = 32+32+16; 13824: 216), a single
// 4-pair chunk (256), a row count that leaves the last warp a half row pair (odd) and a grid
// where row pairs per warp > 1 (20001 rows), plus the staged kernel forced on the same shapes.
TEST(CudaMatvec, Q8KernelVariantsMatchCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (MatvecQ8Kernel k : {MatvecQ8Kernel::staged, MatvecQ8Kernel::stream2, MatvecQ8Kernel::stream3,
                             MatvecQ8Kernel::stream2_i8}) {
        for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
                 {257, 5120}, {33, 13824}, {1, 256}, {7, 256}, {20001, 512}, {130, 2304}}) {
            check_matvec({GgmlType::Q8_0, rows, cols, 1, k});
        }
    }
    // The choice is a pure function of the shape.
    EXPECT_EQ(matvec_q8_0_kernel_for(5120, 1), MatvecQ8Kernel::stream2);
    EXPECT_EQ(matvec_q8_0_kernel_for(13824, 1), MatvecQ8Kernel::staged);
    EXPECT_EQ(matvec_q8_0_kernel_for(896, 1), MatvecQ8Kernel::staged);
    EXPECT_EQ(matvec_q8_0_kernel_for(5120, 2), MatvecQ8Kernel::staged);
    EXPECT_FALSE(matvec_q8_0_kernel_fits(MatvecQ8Kernel::stream2, 896, 1));
}

// The decode path: Q8_0 weights times x already quantized to int16 blocks. The reference uses
// the very x values the kernel sees (dequantized on the host), so GPU vs reference is f32
// summation error (sum_error < 1e-6, as above). Against the exact-x product the error is x's rounding:
// per value uniform in +-d/2 with d = amax/32767, RMS amax/113500; amax of 32 normal values
// is ~2.0-2.5 sigma, so ~2e-5 relative; bounded at 2e-4 over >= 7 rows (one row's ratio of
// two random sums has a heavy tail).
// A random Q8_0 matrix, x quantized to int16 blocks, and the references: W times the x the
// kernel sees (x_seen) and W times the exact x, in double. The kernel checks build one case
// per shape and run every kernel variant on it: the host side (random matrix, double
// references) was most of test_cuda's time when each variant drew its own (session 37).
struct Q16xCase {
    uint32_t seed = 0, rows = 0, cols = 0;
    HostWeights w;
    HostActQ16 xq;
    std::vector<float> ref, ref_exact, mag;  // mag: each row's sum of |terms| (sum_error)
};
Q16xCase make_q16x_case(uint32_t seed, uint32_t rows, uint32_t cols) {
    std::mt19937 rng(seed);
    Q16xCase c;
    c.seed = seed, c.rows = rows, c.cols = cols;
    c.w = random_weights(rng, GgmlType::Q8_0, rows, cols);
    const std::vector<float> x = random_floats(rng, cols);
    c.xq = quantize_act_q16_host(x);
    const std::vector<float> x_seen = dequantize_act_q16_host(c.xq);
    c.ref.resize(rows);
    c.ref_exact.resize(rows);
    c.mag.resize(rows);
    for (uint32_t r = 0; r < rows; ++r) {
        double sum = 0.0, sum_exact = 0.0, abs_sum = 0.0;
        for (uint32_t k = 0; k < cols; ++k) {
            const double term = (double)c.w.values[(size_t)r * cols + k] * x_seen[k];
            sum += term;
            abs_sum += std::fabs(term);
            sum_exact += (double)c.w.values[(size_t)r * cols + k] * x[k];
        }
        c.ref[r] = (float)sum;
        c.ref_exact[r] = (float)sum_exact;
        c.mag[r] = (float)abs_sum;
    }
    return c;
}

void check_matvec_q16x(MatvecQ16xKernel kernel, const Q16xCase& c) {
    const uint32_t rows = c.rows, cols = c.cols;
    SCOPED_TRACE("q16x kernel=" + std::to_string((int)kernel) + " rows=" + std::to_string(rows) + " cols=" +
                 std::to_string(cols) + " seed=" + std::to_string(c.seed));
    const HostActQ16& xq = c.xq;
    const std::vector<float>& ref = c.ref;
    const std::vector<float>& ref_exact = c.ref_exact;
    auto d_w = to_device(c.w.bytes);
    auto d_q = to_device(xq.q);
    auto d_d = to_device(xq.d);
    DeviceBuffer<float> d_y(rows);
    poison(d_y);
    matvec_q8_0_q16x_cuda_with(kernel, d_w.data(), ActQ16{d_q.data(), d_d.data()}, d_y.data(), rows, cols, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> y = to_host(d_y);
    EXPECT_EQ(count_nan(y), 0u);
    const double err = sum_error(y, ref, c.mag);
    EXPECT_LT(err, 1e-6) << "error relative to the sums' terms " << err << " (to the result " << rel_error(y, ref) << ")";
    const double err_x = rel_error(y, ref_exact);
    if (rows >= 7) EXPECT_LT(err_x, 2e-4) << "vs exact-x product";
    std::printf("  q16x kernel %d rows=%u cols=%u: error vs terms %.2e, vs exact-x product %.2e\n", (int)kernel, rows, cols,
                err, err_x);
}

TEST(CudaMatvec, Q16xKernelsMatchCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    // Partial last chunks (5120, 13824), one 4-pair chunk (256), a half row pair (odd rows),
    // several row pairs per warp (20001 rows), more warps than rows (1, 7).
    for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
             {257, 5120}, {33, 13824}, {1, 256}, {7, 256}, {20001, 512}, {130, 2304}, {3000, 27648}}) {
        const Q16xCase c = make_q16x_case(fresh_seed(), rows, cols);
        for (MatvecQ16xKernel k : {MatvecQ16xKernel::smem4, MatvecQ16xKernel::smem8, MatvecQ16xKernel::global4,
                                   MatvecQ16xKernel::smem4_r1, MatvecQ16xKernel::smem8_r1, MatvecQ16xKernel::smem4_s3,
                                   MatvecQ16xKernel::smem4_s4})
            check_matvec_q16x(k, c);
    }
    // Work split by chunks, pairs cut between warps (the 14B wo, qkv and down shapes, and an
    // odd row count): each shape twice, so the second launch finds the cut-pair slots the
    // first one left (they must be cleared, or stale partial sums would be added).
    uint32_t cut_shapes = 0;
    for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
             {5120, 5120}, {7168, 5120}, {5120, 13824}, {5121, 5120}}) {
        const Q16xCase c = make_q16x_case(fresh_seed(), rows, cols);
        for (MatvecQ16xKernel k : {MatvecQ16xKernel::smem4, MatvecQ16xKernel::smem4_r1, MatvecQ16xKernel::smem4_s3,
                                   MatvecQ16xKernel::smem4_s4}) {
            cut_shapes += matvec_q8_0_q16x_splits_by_chunks(k, rows, cols);
            check_matvec_q16x(k, c);
            check_matvec_q16x(k, c);
        }
    }
    EXPECT_GT(cut_shapes, 0u) << "no shape took the chunk split on this GPU: the cut-pair path went untested";
    EXPECT_EQ(matvec_q8_0_q16x_kernel_for(13824, 5120), MatvecQ16xKernel::smem4);
    EXPECT_EQ(matvec_q8_0_q16x_kernel_for(5120, 13824), MatvecQ16xKernel::smem4);
    EXPECT_EQ(matvec_q8_0_q16x_kernel_for(152064, 5120), MatvecQ16xKernel::smem4_s3);  // the output head
    EXPECT_TRUE(matvec_q8_0_q16x_fits(5120));
    EXPECT_FALSE(matvec_q8_0_q16x_fits(896));
    EXPECT_FALSE(matvec_q8_0_q16x_fits(65536));
}

// Chunk-split GEMVs on two streams at once, many launches deep: each stream has its own
// cut-pair slots (a shared set would let one launch take the other's partial sums, or wait
// forever for one the other consumed). Both results must equal the single-launch result
// bit for bit (the split and the summation order are fixed).
TEST(CudaMatvec, ChunkSplitOnTwoStreamsAtOnce) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    constexpr uint32_t rows = 5120, cols = 5120;
    if (!matvec_q8_0_q16x_splits_by_chunks(MatvecQ16xKernel::smem4, rows, cols))
        GTEST_SKIP() << "this GPU's warp count divides the shape evenly: no chunk split to test";
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const auto [w_q, w_deq] = random_weights(rng, GgmlType::Q8_0, rows, cols);
    const HostActQ16 xq = quantize_act_q16_host(random_floats(rng, cols));
    const std::vector<float> x_seen = dequantize_act_q16_host(xq);
    std::vector<float> want(rows);
    for (uint32_t r = 0; r < rows; ++r) {
        double sum = 0.0;
        for (uint32_t k = 0; k < cols; ++k) sum += (double)w_deq[(size_t)r * cols + k] * x_seen[k];
        want[r] = (float)sum;
    }
    auto d_w = to_device(w_q);
    auto d_q = to_device(xq.q);
    auto d_d = to_device(xq.d);
    const ActQ16 x{d_q.data(), d_d.data()};
    DeviceBuffer<float> d_ref(rows), d_a(rows), d_b(rows);
    matvec_q8_0_q16x_cuda(d_w.data(), x, d_ref.data(), rows, cols, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    cudaStream_t sa = nullptr, sb = nullptr;
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    for (int i = 0; i < 64; ++i) {
        matvec_q8_0_q16x_cuda(d_w.data(), x, d_a.data(), rows, cols, sa);
        matvec_q8_0_q16x_cuda(d_w.data(), x, d_b.data(), rows, cols, sb);
    }
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(sa));
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(sb));
    SPILLWAY_CUDA_CHECK(cudaStreamDestroy(sa));
    SPILLWAY_CUDA_CHECK(cudaStreamDestroy(sb));
    const std::vector<float> ref = to_host(d_ref), a = to_host(d_a), b = to_host(d_b);
    EXPECT_LT(rel_error(ref, want), 1e-5) << "the single launch vs the CPU reference";
    EXPECT_TRUE(std::equal(ref.begin(), ref.end(), a.begin())) << "stream a differs from the single launch";
    EXPECT_TRUE(std::equal(ref.begin(), ref.end(), b.begin())) << "stream b differs from the single launch";
}

// The split layout (matvec_q8s.cuh): GGUF Q8_0 bytes repacked on the GPU (checked byte for
// byte against the host), then the register-streaming GEMV against the same reference as
// the q16x check above (1e-5: f32 summation). Two launches per shape, so the second finds
// the cut-pair slots the first one cleared.
void check_matvec_q8s(MatvecQ8sKernel kernel, const Q16xCase& c) {
    const uint32_t rows = c.rows, cols = c.cols;
    SCOPED_TRACE("q8s kernel=" + std::to_string((int)kernel) + " rows=" + std::to_string(rows) + " cols=" +
                 std::to_string(cols) + " seed=" + std::to_string(c.seed));
    const std::vector<uint8_t>& w_q = c.w.bytes;
    const HostActQ16& xq = c.xq;
    const std::vector<float>& ref = c.ref;
    auto d_w = to_device(w_q);
    DeviceBuffer<int8_t> codes((size_t)rows * cols);
    DeviceBuffer<uint16_t> scales((size_t)rows * cols / 32);
    poison(codes);
    poison(scales);
    q8_0_to_split_cuda(d_w.data(), rows, cols, Q8Split{codes.data(), scales.data()}, nullptr);
    const std::vector<int8_t> h_codes = to_host(codes);
    const std::vector<uint16_t> h_scales = to_host(scales);
    size_t layout_mismatches = 0;
    for (size_t b = 0; b < h_scales.size(); ++b) {
        uint16_t scale;
        std::memcpy(&scale, w_q.data() + b * 34, 2);
        layout_mismatches += scale != h_scales[b];
        layout_mismatches += std::memcmp(w_q.data() + b * 34 + 2, h_codes.data() + b * 32, 32) != 0;
    }
    EXPECT_EQ(layout_mismatches, 0u) << "repacked blocks differ from the GGUF blocks";
    auto d_q = to_device(xq.q);
    auto d_d = to_device(xq.d);
    double worst = 0.0;
    for (int launch = 0; launch < 2; ++launch) {
        DeviceBuffer<float> d_y(rows);
        poison(d_y);
        matvec_q8s_cuda_with(kernel, Q8SplitConst{codes.data(), scales.data()}, ActQ16{d_q.data(), d_d.data()},
                             d_y.data(), rows, cols, nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> y = to_host(d_y);
        EXPECT_EQ(count_nan(y), 0u);
        const double err = sum_error(y, ref, c.mag);
        EXPECT_LT(err, 1e-6) << "error relative to the sums' terms " << err << " (to the result " << rel_error(y, ref)
                             << ", launch " << launch << ")";
        worst = std::max(worst, err);
    }
    std::printf("  q8s kernel %d rows=%u cols=%u: error vs terms %.2e\n", (int)kernel, rows, cols, worst);
}

TEST(CudaMatvec, Q8SplitKernelsMatchCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    // One unit (1 x 512), a half row pair (odd rows), pairs cut between two and more warps
    // (the 14B wo / down shapes have fewer units than twice the warps), many pairs per warp.
    for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
             {1, 512}, {7, 512}, {257, 5120}, {33, 13824}, {5120, 5120}, {5121, 5120}, {5120, 13824},
             {20001, 512}, {3000, 27648}}) {
        const Q16xCase c = make_q16x_case(fresh_seed(), rows, cols);
        for (int ki = 0; ki <= (int)MatvecQ8sKernel::sweep1r8; ++ki) check_matvec_q8s((MatvecQ8sKernel)ki, c);
    }
    EXPECT_EQ(matvec_q8s_kernel_for(5120, 5120), MatvecQ8sKernel::sweep1r2);
    DeviceBuffer<int8_t> codes(1 << 16);
    DeviceBuffer<uint16_t> scales(1 << 12);
    DeviceBuffer<int16_t> xq(1024);
    DeviceBuffer<float> xd(32), y(16);
    EXPECT_THROW(matvec_q8s_cuda(Q8SplitConst{codes.data(), scales.data()}, ActQ16{xq.data(), xd.data()}, y.data(), 4,
                                 256, nullptr), Error);  // 256 columns: not whole units
    EXPECT_THROW(matvec_q8s_cuda(Q8SplitConst{codes.data(), scales.data()}, ActQ16{}, y.data(), 4, 512, nullptr),
                 Error);
    EXPECT_THROW(matvec_q8s_cuda(Q8SplitConst{codes.data(), nullptr}, ActQ16{xq.data(), xd.data()}, y.data(), 4, 512,
                                 nullptr), Error);
    EXPECT_THROW(q8_0_to_split_cuda(codes.data(), 4, 48, Q8Split{codes.data(), scales.data()}, nullptr), Error);
    EXPECT_FALSE(matvec_q8s_fits(65536));
    EXPECT_FALSE(matvec_q8s_fits(896));
    EXPECT_TRUE(matvec_q8s_fits(13824));
}

// The stamped sweep (lab timeline, matvec_q8s_stamped_cuda) computes exactly sweep1r2's bits,
// and each block's five stamps are set and in order (entry <= wait <= x <= swept <= end).
TEST(CudaMatvec, Q8SplitStampedEqualsSweep) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{{7, 512}, {5121, 5120}, {5120, 13824}}) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " seed=" + std::to_string(seed));
        const Q16xCase c = make_q16x_case(seed, rows, cols);
        auto d_w = to_device(c.w.bytes);
        DeviceBuffer<int8_t> codes((size_t)rows * cols);
        DeviceBuffer<uint16_t> scales((size_t)rows * cols / 32);
        q8_0_to_split_cuda(d_w.data(), rows, cols, Q8Split{codes.data(), scales.data()}, nullptr);
        auto d_q = to_device(c.xq.q);
        auto d_d = to_device(c.xq.d);
        const ActQ16 x{d_q.data(), d_d.data()};
        const Q8SplitConst split{codes.data(), scales.data()};
        DeviceBuffer<float> y_plain(rows), y_stamped(rows);
        DeviceBuffer<uint64_t> stamps(5 * 1024);
        poison(y_plain);
        poison(y_stamped);
        SPILLWAY_CUDA_CHECK(cudaMemset(stamps.data(), 0, stamps.bytes()));
        matvec_q8s_cuda_with(MatvecQ8sKernel::sweep1r2, split, x, y_plain.data(), rows, cols, nullptr);
        const uint32_t blocks = matvec_q8s_stamped_cuda(split, x, y_stamped.data(), rows, cols, nullptr, false,
                                                        stamps.data());
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> a = to_host(y_plain), b = to_host(y_stamped);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "rel. " << rel_error(b, a);
        ASSERT_GT(blocks, 0u);
        ASSERT_LE(blocks, 1024u);
        const std::vector<uint64_t> t = to_host(stamps);
        size_t out_of_order = 0;
        for (uint32_t blk = 0; blk < blocks; ++blk)
            for (int k = 0; k < 5; ++k)
                out_of_order += t[blk * 5 + k] == 0 || (k > 0 && t[blk * 5 + k] < t[blk * 5 + k - 1]);
        EXPECT_EQ(out_of_order, 0u);
    }
    DeviceBuffer<float> y(4);
    EXPECT_THROW(matvec_q8s_stamped_cuda(Q8SplitConst{}, ActQ16{}, y.data(), 4, 512, nullptr, false, nullptr), Error);
}

// The fused sweep (matvec_q8s_fused_cuda): x formed in the GEMV from the f32 stream and the
// norm's weight, or from gate and up, must give exactly the bits of rmsnorm_cuda or
// swiglu_q16_cuda followed by the q16 GEMV, and y += W x exactly y0 + (W x); and against the
// CPU (double sums over x quantized on the host: 1e-5, f32 summation and an inv_rms that may
// sit an ulp apart).
void check_fused_sweep(uint32_t rows, uint32_t cols) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("fused sweep rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " seed=" +
                 std::to_string(seed));
    std::mt19937 rng(seed);
    const HostWeights w = random_weights(rng, GgmlType::Q8_0, rows, cols);
    const std::vector<float> stream = random_floats(rng, cols, 3.0f), norm_w = random_floats(rng, cols);
    const std::vector<float> gate = random_floats(rng, cols, 2.0f), up = random_floats(rng, cols);
    const std::vector<float> y0 = random_floats(rng, rows);
    auto d_w = to_device(w.bytes);
    DeviceBuffer<int8_t> codes((size_t)rows * cols);
    DeviceBuffer<uint16_t> scales((size_t)rows * cols / 32);
    q8_0_to_split_cuda(d_w.data(), rows, cols, Q8Split{codes.data(), scales.data()}, nullptr);
    const Q8SplitConst split{codes.data(), scales.data()};
    auto d_stream = to_device(stream), d_norm_w = to_device(norm_w), d_gate = to_device(gate), d_up = to_device(up);
    DeviceBuffer<float> xn(cols), y_sep(rows), y_fused(rows);
    DeviceBuffer<int16_t> q(cols);
    DeviceBuffer<float> d(cols / 32);
    const float eps = 1e-5f;
    const auto host_ref = [&](const std::vector<float>& x) {  // W x over x quantized as the GPU does
        const std::vector<float> x_seen = dequantize_act_q16_host(quantize_act_q16_host(x));
        std::vector<float> ref(rows);
        for (uint32_t r = 0; r < rows; ++r) {
            double sum = 0.0;
            for (uint32_t k = 0; k < cols; ++k) sum += (double)w.values[(size_t)r * cols + k] * x_seen[k];
            ref[r] = (float)sum;
        }
        return ref;
    };
    const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };

    if (cols <= 16384) {  // rmsnorm_cuda's one-row kernel
        rmsnorm_cuda(d_stream.data(), nullptr, d_norm_w.data(), xn.data(), 1, cols, eps, nullptr, ActQ16{q.data(), d.data()});
        poison(y_sep);
        poison(y_fused);
        matvec_q8s_cuda_with(MatvecQ8sKernel::sweep1r2, split, ActQ16{q.data(), d.data()}, y_sep.data(), rows, cols,
                             nullptr);
        matvec_q8s_fused_cuda(split, GemvX{GemvXFrom::rmsnorm, {}, d_stream.data(), d_norm_w.data(), eps},
                              y_fused.data(), false, rows, cols, nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> a = to_host(y_sep), b = to_host(y_fused);
        EXPECT_EQ(count_nan(b), 0u);
        EXPECT_TRUE(bits_equal(a, b)) << "RMSNorm: fused differs from separate, rel. " << rel_error(b, a);
        double ss = 0.0;
        for (float v : stream) ss += (double)v * v;
        const float inv_rms = (float)(1.0 / std::sqrt(ss / cols + eps));
        std::vector<float> x(cols);
        for (uint32_t k = 0; k < cols; ++k) x[k] = stream[k] * inv_rms * norm_w[k];
        EXPECT_LT(rel_error(b, host_ref(x)), 1e-5) << "RMSNorm: fused vs CPU";
        EXPECT_TRUE(bits_equal(to_host(d_stream), stream)) << "the stream was written";
    }
    {
        swiglu_q16_cuda(d_gate.data(), d_up.data(), cols, ActQ16{q.data(), d.data()}, nullptr);
        poison(y_sep);
        poison(y_fused);
        matvec_q8s_cuda_with(MatvecQ8sKernel::sweep1r2, split, ActQ16{q.data(), d.data()}, y_sep.data(), rows, cols,
                             nullptr);
        matvec_q8s_fused_cuda(split, GemvX{GemvXFrom::swiglu, {}, d_gate.data(), d_up.data()}, y_fused.data(), false,
                              rows, cols, nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> a = to_host(y_sep), b = to_host(y_fused);
        EXPECT_EQ(count_nan(b), 0u);
        EXPECT_TRUE(bits_equal(a, b)) << "SwiGLU: fused differs from separate, rel. " << rel_error(b, a);
        std::vector<float> x(cols);
        for (uint32_t k = 0; k < cols; ++k) x[k] = gate[k] / (1.0f + std::exp(-gate[k])) * up[k];
        EXPECT_LT(rel_error(b, host_ref(x)), 1e-5) << "SwiGLU: fused vs CPU";
    }
    {  // accumulate, x given quantized (what the attention leaves for wo): y_sep holds W x from above
        auto d_y = to_device(y0);
        matvec_q8s_fused_cuda(split, GemvX{GemvXFrom::q16, ActQ16{q.data(), d.data()}}, d_y.data(), true, rows, cols,
                              nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> wx = to_host(y_sep), got = to_host(d_y);
        std::vector<float> want(rows);
        for (uint32_t r = 0; r < rows; ++r) want[r] = y0[r] + wx[r];
        EXPECT_TRUE(bits_equal(got, want)) << "y += W x differs from y0 + (W x), rel. " << rel_error(got, want);
    }
}

TEST(CudaMatvec, FusedSweepEqualsSeparateLaunches) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    // One unit; one block's rows; 14B's down and gate|up; 7B's down (cols past the one-row
    // RMSNorm's 16384: SwiGLU and accumulate only); the widest fused RMSNorm.
    for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
             {1, 512}, {7, 512}, {257, 5120}, {5120, 13824}, {27648, 5120}, {3584, 18944}, {100, 16384}, {33, 20480}})
        check_fused_sweep(rows, cols);
    DeviceBuffer<int8_t> codes(1 << 20);
    DeviceBuffer<uint16_t> scales(1 << 16);
    DeviceBuffer<float> a(20992), b(20992), y(16);
    const Q8SplitConst split{codes.data(), scales.data()};
    EXPECT_FALSE(matvec_q8s_fused_fits(20992));  // past the staging room
    EXPECT_TRUE(matvec_q8s_fused_fits(20480));
    EXPECT_THROW(matvec_q8s_fused_cuda(split, GemvX{GemvXFrom::swiglu, {}, a.data(), b.data()}, y.data(), false, 4,
                                       20992, nullptr), Error);
    EXPECT_THROW(matvec_q8s_fused_cuda(split, GemvX{GemvXFrom::rmsnorm, {}, a.data() + 1, b.data(), 1e-5f}, y.data(),
                                       false, 4, 512, nullptr), Error);  // not 16-byte aligned
    EXPECT_THROW(matvec_q8s_fused_cuda(split, GemvX{GemvXFrom::q16}, y.data(), false, 4, 512, nullptr), Error);
    EXPECT_THROW(matvec_q8s_fused_cuda(split, GemvX{GemvXFrom::swiglu, {}, a.data(), b.data()}, nullptr, false, 4, 512,
                                       nullptr), Error);
}

// A random Q8_0 matrix uploaded and converted to the split layout (the chained sweeps' tests).
// A random x (values in +-2) quantized on the device as act_q16, for the chained sweeps.
struct RandomQ16 {
    DeviceBuffer<int16_t> q;
    DeviceBuffer<float> d;
    RandomQ16(std::mt19937& rng, uint32_t n) : q(n), d(n / 32) {
        auto f = to_device(random_floats(rng, n, 2.0f));
        quantize_act_q16_cuda(f.data(), n, 1, act(), nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());  // before f goes
    }
    ActQ16 act() const { return ActQ16{q.data(), d.data()}; }
};

struct DeviceSplitMatrix {
    HostWeights host;
    DeviceBuffer<int8_t> codes;
    DeviceBuffer<uint16_t> scales;
    DeviceSplitMatrix(std::mt19937& rng, uint32_t rows, uint32_t cols)
        : host(random_weights(rng, GgmlType::Q8_0, rows, cols)), codes((size_t)rows * cols),
          scales((size_t)rows * cols / 32) {
        auto gguf = to_device(host.bytes);
        q8_0_to_split_cuda(gguf.data(), rows, cols, Q8Split{codes.data(), scales.data()}, nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());  // before the GGUF copy goes
    }
    Q8SplitConst view() const { return Q8SplitConst{codes.data(), scales.data()}; }
};

// gate|up with SwiGLU in its epilogue (matvec_q8s_swiglu_cuda) must write exactly the bits of
// the plain GEMV over the 2 ff rows followed by swiglu_q16_cuda, on shapes whose 32-value
// blocks are cut between 2 grid blocks (14B, 7B), between up to 32 (ff = 32: one pair per
// block) and never (4224 = 132 x 32); a second launch on the same scratch must too (the
// arrival counts are left zero), and the dequantized output is checked against the CPU
// (double sums; 1e-4: the int16 rounding of h).
void check_swiglu_epilogue(uint32_t ff, uint32_t cols) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("swiglu epilogue ff=" + std::to_string(ff) + " cols=" + std::to_string(cols) + " seed=" +
                 std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t rows = 2 * ff;
    const DeviceSplitMatrix m(rng, rows, cols);
    const HostWeights& w = m.host;
    const std::vector<float> x = random_floats(rng, cols, 2.0f);
    const Q8SplitConst split = m.view();
    auto d_x = to_device(x);
    DeviceBuffer<int16_t> xq(cols), want_q(ff), got_q(ff);
    DeviceBuffer<float> xd(cols / 32), want_d(ff / 32), got_d(ff / 32), gate_up(rows), stage(ff);
    DeviceBuffer<uint32_t> arrivals(ff / 32);
    SPILLWAY_CUDA_CHECK(cudaMemset(arrivals.data(), 0, arrivals.bytes()));
    quantize_act_q16_cuda(d_x.data(), cols, 1, ActQ16{xq.data(), xd.data()}, nullptr);
    matvec_q8s_cuda_with(MatvecQ8sKernel::sweep1r2, split, ActQ16{xq.data(), xd.data()}, gate_up.data(), rows, cols,
                         nullptr);
    swiglu_q16_cuda(gate_up.data(), gate_up.data() + ff, ff, ActQ16{want_q.data(), want_d.data()}, nullptr);
    const std::vector<int16_t> q_sep = to_host(want_q);
    const std::vector<float> d_sep = to_host(want_d);
    for (int launch = 0; launch < 2; ++launch) {
        SCOPED_TRACE("launch " + std::to_string(launch));
        poison(got_q);
        poison(got_d);
        poison(stage);
        matvec_q8s_swiglu_cuda(split, ActQ16{xq.data(), xd.data()}, ff, cols, ActQ16{got_q.data(), got_d.data()},
                               GluScratch{stage.data(), arrivals.data()}, nullptr, launch == 1);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<int16_t> q = to_host(got_q);
        const std::vector<float> d = to_host(got_d);
        EXPECT_EQ(std::memcmp(q.data(), q_sep.data(), q.size() * 2), 0) << "codes differ from the separate launches";
        EXPECT_EQ(std::memcmp(d.data(), d_sep.data(), d.size() * 4), 0) << "scales differ from the separate launches";
        const std::vector<uint32_t> left = to_host(arrivals);
        EXPECT_EQ(std::count(left.begin(), left.end(), 0u), (long)left.size()) << "arrival counts not left zero";
        if (launch == 0) {
            // CPU: gate / up rows times x as the GPU sees it, in double; h = silu(gate) * up.
            const std::vector<float> x_seen = dequantize_act_q16_host(quantize_act_q16_host(x));
            std::vector<float> h(ff), got(ff);
            for (uint32_t p = 0; p < ff; ++p) {
                double g = 0.0, u = 0.0;
                for (uint32_t k = 0; k < cols; ++k) {
                    g += (double)w.values[(size_t)p * cols + k] * x_seen[k];
                    u += (double)w.values[(size_t)(ff + p) * cols + k] * x_seen[k];
                }
                h[p] = (float)(g / (1.0 + std::exp(-g)) * u);
                got[p] = (float)q[p] * d[p / 32];
            }
            EXPECT_LT(rel_error(got, h), 1e-4) << "vs CPU";
        }
    }
}

TEST(CudaMatvec, SwiGluEpilogueEqualsSeparateLaunches) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (const auto& [ff, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
             {32, 512}, {96, 1024}, {4224, 512}, {1312, 13824}, {13824, 5120}, {18944, 3584}})
        check_swiglu_epilogue(ff, cols);
    DeviceBuffer<int8_t> codes(1 << 16);
    DeviceBuffer<uint16_t> scales(1 << 12);
    DeviceBuffer<int16_t> xq(1024), q(1024);
    DeviceBuffer<float> xd(32), d(32), stage(1024);
    DeviceBuffer<uint32_t> arrivals(32);
    const Q8SplitConst split{codes.data(), scales.data()};
    const ActQ16 x{xq.data(), xd.data()}, out{q.data(), d.data()};
    const GluScratch scratch{stage.data(), arrivals.data()};
    EXPECT_FALSE(matvec_q8s_swiglu_fits(48, 512));   // ff: not whole 32-value blocks
    EXPECT_FALSE(matvec_q8s_swiglu_fits(64, 256));   // cols: not whole units
    EXPECT_TRUE(matvec_q8s_swiglu_fits(13824, 5120));
    EXPECT_THROW(matvec_q8s_swiglu_cuda(split, x, 48, 512, out, scratch, nullptr), Error);
    EXPECT_THROW(matvec_q8s_swiglu_cuda(split, x, 64, 512, x, scratch, nullptr), Error);  // output over x
    EXPECT_THROW(matvec_q8s_swiglu_cuda(split, x, 64, 512, out, GluScratch{stage.data(), nullptr}, nullptr), Error);
    EXPECT_THROW(matvec_q8s_swiglu_cuda(split, ActQ16{}, 64, 512, out, scratch, nullptr), Error);
}

// The norm chain (matvec_q8s_norm_out_cuda, then NormedX consumers): the producer's stream
// must be exactly stream + (W x) as the plain GEMV sums it, its x exactly act_q16 of stream *
// weight (host quantization, same operations), its partial sums the stream's sum of squares
// (1e-5); a second launch must do the same and leave the counts zero. The consumers: the plain
// one gives its plain sums times inv_rms (1e-6: inv_rms from the partials in another order),
// the SwiGLU one h of those (1e-4: int16 rounding of h); and both against the CPU's separate
// RMSNorm (1e-4: x quantized after the scale instead of before).
void check_norm_chain(uint32_t rows, uint32_t cols, uint32_t ff) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("norm chain rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " ff=" +
                 std::to_string(ff) + " seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    const DeviceSplitMatrix m(rng, rows, cols), m2(rng, 2 * ff, rows);  // m2: the consumer, gate|up's shape
    const HostWeights& w2 = m2.host;
    const std::vector<float> x = random_floats(rng, cols, 2.0f), stream0 = random_floats(rng, rows, 3.0f);
    const std::vector<float> norm_w = random_floats(rng, rows);
    const float eps = 1e-5f;
    const Q8SplitConst split = m.view(), split2 = m2.view();
    auto d_x = to_device(x), d_norm_w = to_device(norm_w);
    DeviceBuffer<int16_t> xq(cols), nq(rows), hq(ff);
    DeviceBuffer<float> xd(cols / 32), nd(rows / 32), hd(ff / 32), y_plain(rows), stage(rows), partials(kNormOutMaxBlocks);
    DeviceBuffer<float> y2_plain(2 * ff), y2(2 * ff), stage2(ff);
    DeviceBuffer<uint32_t> arrivals(rows / 32), arrivals2(ff / 32);
    SPILLWAY_CUDA_CHECK(cudaMemset(arrivals.data(), 0, arrivals.bytes()));
    SPILLWAY_CUDA_CHECK(cudaMemset(arrivals2.data(), 0, arrivals2.bytes()));
    quantize_act_q16_cuda(d_x.data(), cols, 1, ActQ16{xq.data(), xd.data()}, nullptr);
    const ActQ16 x_act{xq.data(), xd.data()}, n_act{nq.data(), nd.data()};
    matvec_q8s_cuda_with(MatvecQ8sKernel::sweep1r2, split, x_act, y_plain.data(), rows, cols, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> wx = to_host(y_plain);
    std::vector<float> want_stream(rows), t(rows);
    double sum_sq = 0.0;
    for (uint32_t r = 0; r < rows; ++r) {
        want_stream[r] = stream0[r] + wx[r];
        t[r] = want_stream[r] * norm_w[r];
        sum_sq += (double)want_stream[r] * want_stream[r];
    }
    const HostActQ16 want_x = quantize_act_q16_host(t);
    for (int launch = 0; launch < 2; ++launch) {
        SCOPED_TRACE("launch " + std::to_string(launch));
        auto d_stream = to_device(stream0);
        poison(nq);
        poison(nd);
        poison(partials);
        poison(stage);
        const uint32_t n = matvec_q8s_norm_out_cuda(
            split, x_act, rows, cols,
            NormOut{d_stream.data(), d_norm_w.data(), partials.data(), n_act, GluScratch{stage.data(), arrivals.data()}},
            nullptr, launch == 1);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_GT(n, 0u);
        ASSERT_LE(n, kNormOutMaxBlocks);
        const std::vector<float> got_stream = to_host(d_stream);
        EXPECT_EQ(std::memcmp(got_stream.data(), want_stream.data(), rows * 4), 0) << "stream != stream + W x";
        const std::vector<int16_t> q = to_host(nq);
        const std::vector<float> d = to_host(nd), p = to_host(partials);
        EXPECT_EQ(std::memcmp(q.data(), want_x.q.data(), rows * 2), 0) << "codes differ from the host's";
        EXPECT_EQ(std::memcmp(d.data(), want_x.d.data(), rows / 32 * 4), 0) << "scales differ from the host's";
        double got_sq = 0.0;
        for (uint32_t i = 0; i < n; ++i) got_sq += p[i];
        EXPECT_LT(std::fabs(got_sq - sum_sq) / sum_sq, 1e-5) << "sum of squares";
        const std::vector<uint32_t> left = to_host(arrivals);
        EXPECT_EQ(std::count(left.begin(), left.end(), 0u), (long)left.size()) << "arrival counts not left zero";
        if (launch == 1) break;

        // The consumers, on the producer's x and partial sums.
        const NormedX normed{partials.data(), n, eps};
        const float inv_rms = (float)(1.0 / std::sqrt(sum_sq / rows + eps));
        matvec_q8s_cuda_with(MatvecQ8sKernel::sweep1r2, split2, n_act, y2_plain.data(), 2 * ff, rows, nullptr);
        poison(y2);
        matvec_q8s_normed_cuda(split2, n_act, normed, y2.data(), 2 * ff, rows, nullptr);
        poison(hq);
        poison(hd);
        matvec_q8s_swiglu_cuda(split2, n_act, ff, rows, ActQ16{hq.data(), hd.data()},
                               GluScratch{stage2.data(), arrivals2.data()}, nullptr, false, normed);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> plain2 = to_host(y2_plain), got2 = to_host(y2);
        std::vector<float> want2(2 * ff), want_h(ff), got_h(ff);
        for (uint32_t r = 0; r < 2 * ff; ++r) want2[r] = plain2[r] * inv_rms;
        EXPECT_EQ(count_nan(got2), 0u);
        EXPECT_LT(rel_error(got2, want2), 1e-6) << "normed consumer vs its plain sums times inv_rms";
        const std::vector<int16_t> h_q = to_host(hq);
        const std::vector<float> h_d = to_host(hd);
        for (uint32_t k = 0; k < ff; ++k) {
            const float g = want2[k], u = want2[ff + k];
            want_h[k] = g / (1.0f + std::exp(-g)) * u;
            got_h[k] = (float)h_q[k] * h_d[k / 32];
        }
        EXPECT_LT(rel_error(got_h, want_h), 1e-4) << "SwiGLU consumer";
        // CPU: RMSNorm of the new stream, quantized, times W2.
        std::vector<float> xn(rows);
        for (uint32_t r = 0; r < rows; ++r) xn[r] = want_stream[r] * inv_rms * norm_w[r];
        const std::vector<float> xn_seen = dequantize_act_q16_host(quantize_act_q16_host(xn));
        std::vector<float> cpu2(2 * ff);
        for (uint32_t r = 0; r < 2 * ff; ++r) {
            double sum = 0.0;
            for (uint32_t k = 0; k < rows; ++k) sum += (double)w2.values[(size_t)r * rows + k] * xn_seen[k];
            cpu2[r] = (float)sum;
        }
        EXPECT_LT(rel_error(got2, cpu2), 1e-4) << "normed consumer vs the CPU's separate RMSNorm";
    }
}

TEST(CudaMatvec, NormChainMatchesSeparateNorm) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    // 14B (5120 rows: 40 per block, 32-value blocks cut between 2), a short stream (4 rows per
    // block: 8 holders per 32-value block), 7B (3584 rows). The consumer reads the stream as
    // its x: rows % 512 == 0.
    for (const auto& [rows, cols, ff] : std::vector<std::tuple<uint32_t, uint32_t, uint32_t>>{
             {5120, 5120, 1024}, {512, 512, 32}, {3584, 18944, 512}, {1024, 1024, 96}})
        check_norm_chain(rows, cols, ff);
    DeviceBuffer<int8_t> codes(1 << 16);
    DeviceBuffer<uint16_t> scales(1 << 12);
    DeviceBuffer<int16_t> xq(1024), q(1024);
    DeviceBuffer<float> xd(32), d(32), stage(1024), stream(1024), weight(1024), partials(kNormOutMaxBlocks), y(64);
    DeviceBuffer<uint32_t> arrivals(32);
    const Q8SplitConst split{codes.data(), scales.data()};
    const ActQ16 x{xq.data(), xd.data()}, out{q.data(), d.data()};
    const NormOut norm{stream.data(), weight.data(), partials.data(), out, GluScratch{stage.data(), arrivals.data()}};
    EXPECT_FALSE(matvec_q8s_norm_out_fits(48, 512));  // not whole 32-value blocks
    EXPECT_TRUE(matvec_q8s_norm_out_fits(5120, 13824));
    EXPECT_THROW(matvec_q8s_norm_out_cuda(split, x, 48, 512, norm, nullptr), Error);
    NormOut over_x = norm;
    over_x.out = x;
    EXPECT_THROW(matvec_q8s_norm_out_cuda(split, x, 64, 512, over_x, nullptr), Error);
    NormOut no_partials = norm;
    no_partials.partials = nullptr;
    EXPECT_THROW(matvec_q8s_norm_out_cuda(split, x, 64, 512, no_partials, nullptr), Error);
    EXPECT_THROW(matvec_q8s_normed_cuda(split, x, NormedX{}, y.data(), 64, 512, nullptr), Error);
    EXPECT_THROW(matvec_q8s_normed_cuda(split, x, NormedX{partials.data(), 0, 1e-5f}, y.data(), 64, 512, nullptr),
                 Error);
}

// The chained sweeps' stamped twins (lab timeline) and both hand-overs (the default
// HandOver::lean and the lab's fence) compute exactly the same bits, and every block's five
// stamps are set and in order.
TEST(CudaMatvec, ChainedStampedEqualsUnstamped) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t E = 1024, cols = 2048, ff = 512;
    const DeviceSplitMatrix m(rng, E, cols), m2(rng, 2 * ff, E);
    const Q8SplitConst split = m.view(), split2 = m2.view();
    const RandomQ16 xr(rng, cols);
    const ActQ16 x = xr.act();
    const std::vector<float> stream0 = random_floats(rng, E, 3.0f);
    auto d_norm_w = to_device(random_floats(rng, E));
    DeviceBuffer<uint64_t> stamps(5 * 1024);
    struct Outputs {
        std::vector<float> stream, partials, y;
        std::vector<int16_t> nq, hq;
        std::vector<float> nd, hd;
    };
    const auto run = [&](bool stamped, bool lean, std::vector<uint32_t>& blocks) {
        auto d_stream = to_device(stream0);
        DeviceBuffer<int16_t> nq(E), hq(ff);
        DeviceBuffer<float> nd(E / 32), hd(ff / 32), partials(kNormOutMaxBlocks), stage(E), stage2(ff), y(2 * ff);
        DeviceBuffer<uint32_t> arrivals(E / 32), arrivals2(ff / 32);
        SPILLWAY_CUDA_CHECK(cudaMemset(arrivals.data(), 0, arrivals.bytes()));
        SPILLWAY_CUDA_CHECK(cudaMemset(arrivals2.data(), 0, arrivals2.bytes()));
        poison(nq), poison(nd), poison(hq), poison(hd), poison(y), poison(partials);
        SPILLWAY_CUDA_CHECK(cudaMemset(stamps.data(), 0, stamps.bytes()));
        const ActQ16 n_act{nq.data(), nd.data()};
        uint64_t* s = stamped ? stamps.data() : nullptr;
        const uint32_t n = matvec_q8s_norm_out_cuda(
            split, x, E, cols,
            NormOut{d_stream.data(), d_norm_w.data(), partials.data(), n_act,
                    GluScratch{stage.data(), arrivals.data(), lean ? HandOver::lean : HandOver::fence}},
            nullptr, false, s);
        const NormedX normed{partials.data(), n, 1e-5f};
        const uint32_t n2 = matvec_q8s_normed_cuda(split2, n_act, normed, y.data(), 2 * ff, E, nullptr, false,
                                                   s ? s + 5 * 256 : nullptr);
        const uint32_t n3 = matvec_q8s_swiglu_cuda(split2, n_act, ff, E, ActQ16{hq.data(), hd.data()},
                                                   GluScratch{stage2.data(), arrivals2.data(), lean ? HandOver::lean : HandOver::fence}, nullptr, false,
                                                   normed, s ? s + 5 * 512 : nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint32_t> left = to_host(arrivals), left2 = to_host(arrivals2);
        EXPECT_EQ(std::count(left.begin(), left.end(), 0u) + std::count(left2.begin(), left2.end(), 0u),
                  (long)(left.size() + left2.size()))
            << "arrival counts not left zero";
        blocks = {n, n2, n3};
        return Outputs{to_host(d_stream), to_host(partials), to_host(y), to_host(nq), to_host(hq), to_host(nd),
                       to_host(hd)};
    };
    std::vector<uint32_t> plain_blocks, lean_blocks, stamped_blocks;
    const Outputs a = run(false, false, plain_blocks);
    const Outputs lean = run(false, true, lean_blocks);
    const Outputs b = run(true, true, stamped_blocks);  // last: its stamps are read below
    EXPECT_EQ(plain_blocks, stamped_blocks);
    EXPECT_EQ(plain_blocks, lean_blocks);
    const auto same = [](const auto& u, const auto& v) {
        return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(u[0])) == 0;
    };
    for (const Outputs* o : {&b, &lean}) {
        SCOPED_TRACE(o == &b ? "stamped, lean hand-over" : "lean hand-over");
        EXPECT_TRUE(same(a.stream, o->stream) && same(a.nq, o->nq) && same(a.nd, o->nd)) << "norm out";
        EXPECT_TRUE(same(std::vector<float>(a.partials.begin(), a.partials.begin() + plain_blocks[0]),
                         std::vector<float>(o->partials.begin(), o->partials.begin() + plain_blocks[0])))
            << "sums of squares";
        EXPECT_TRUE(same(a.y, o->y)) << "normed";
        EXPECT_TRUE(same(a.hq, o->hq) && same(a.hd, o->hd)) << "SwiGLU";
    }
    const std::vector<uint64_t> t = to_host(stamps);
    size_t out_of_order = 0;
    for (uint32_t k = 0; k < 3; ++k) {
        ASSERT_LE(stamped_blocks[k], 256u);
        for (uint32_t blk = 0; blk < stamped_blocks[k]; ++blk)
            for (int j = 0; j < 5; ++j) {
                const uint64_t* p = t.data() + 5 * (256 * k + blk);
                out_of_order += p[j] == 0 || (j > 0 && p[j] < p[j - 1]);
            }
    }
    EXPECT_EQ(out_of_order, 0u);
}

// The default hand-over HandOver::lean gives the lab's fence bits launch after launch on
// one scratch: the norm-out and SwiGLU producers of a chain, three launches in a row (the
// stream accumulates), at a shape with many holders per cut block (8 rows per grid block on
// 132 SMs), at the 14B and the 7B shapes; so does the norm-out releasing its successor after
// its wait (NormOut::release_after_wait, its own instance, which hands over with fence when
// asked for lean). Every variant leaves the counts zero.
TEST(CudaMatvec, HandOverVariantsEqualFenceOverLaunches) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    for (const auto& [E, cols, ff] : std::vector<std::tuple<uint32_t, uint32_t, uint32_t>>{
             {1024, 2048, 512}, {5120, 13824, 13824}, {3584, 18944, 18944}}) {
        SCOPED_TRACE("E=" + std::to_string(E) + " cols=" + std::to_string(cols) + " ff=" + std::to_string(ff));
        const DeviceSplitMatrix m(rng, E, cols), m2(rng, 2 * ff, E);
        const RandomQ16 xr(rng, cols);
        const ActQ16 x = xr.act();
        const std::vector<float> stream0 = random_floats(rng, E, 3.0f);
        auto d_norm_w = to_device(random_floats(rng, E));
        struct Chain {
            DeviceBuffer<float> stream, nd, hd, partials, stage, stage2;
            DeviceBuffer<int16_t> nq, hq;
            DeviceBuffer<uint32_t> arrivals, arrivals2;
            Chain(uint32_t E, uint32_t ff)
                : stream(E), nd(E / 32), hd(ff / 32), partials(kNormOutMaxBlocks), stage(E), stage2(ff), nq(E), hq(ff),
                  arrivals(E / 32), arrivals2(ff / 32) {
                SPILLWAY_CUDA_CHECK(cudaMemset(arrivals.data(), 0, arrivals.bytes()));
                SPILLWAY_CUDA_CHECK(cudaMemset(arrivals2.data(), 0, arrivals2.bytes()));
            }
        };
        // The last: lean asked for, with the norm-out releasing after its wait (its own instance).
        constexpr int kModes = 3;
        const HandOver modes[kModes] = {HandOver::fence, HandOver::lean, HandOver::lean};
        std::vector<std::unique_ptr<Chain>> chains;
        for (int k = 0; k < kModes; ++k) {
            chains.push_back(std::make_unique<Chain>(E, ff));
            SPILLWAY_CUDA_CHECK(cudaMemcpy(chains.back()->stream.data(), stream0.data(), E * sizeof(float),
                                           cudaMemcpyHostToDevice));
        }
        for (uint32_t launch = 1; launch <= 3; ++launch) {
            SCOPED_TRACE("launch " + std::to_string(launch));
            std::vector<std::vector<int16_t>> nq(kModes), hq(kModes);
            std::vector<std::vector<float>> nd(kModes), hd(kModes), stream(kModes);
            for (int k = 0; k < kModes; ++k) {
                Chain& c = *chains[k];
                poison(c.nq), poison(c.nd), poison(c.hq), poison(c.hd);
                const ActQ16 n_act{c.nq.data(), c.nd.data()};
                NormOut out{c.stream.data(), d_norm_w.data(), c.partials.data(), n_act,
                            GluScratch{c.stage.data(), c.arrivals.data(), modes[k]}};
                out.release_after_wait = k == 2;
                if (k == 2) EXPECT_THROW(matvec_q8s_norm_out_cuda(m.view(), x, E, cols, out, nullptr, true), Error);
                const uint32_t n = matvec_q8s_norm_out_cuda(m.view(), x, E, cols, out, nullptr, false);
                matvec_q8s_swiglu_cuda(m2.view(), n_act, ff, E, ActQ16{c.hq.data(), c.hd.data()},
                                       GluScratch{c.stage2.data(), c.arrivals2.data(), modes[k]},
                                       nullptr, false, NormedX{c.partials.data(), n, 1e-5f});
                SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                nq[k] = to_host(c.nq), nd[k] = to_host(c.nd), hq[k] = to_host(c.hq), hd[k] = to_host(c.hd);
                stream[k] = to_host(c.stream);
                for (const auto* counts : {&c.arrivals, &c.arrivals2}) {
                    const std::vector<uint32_t> left = to_host(*counts);
                    EXPECT_EQ(std::count(left.begin(), left.end(), 0u), (long)left.size()) << "counts after variant " << k;
                }
            }
            const auto same = [](const auto& u, const auto& v) {
                return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(u[0])) == 0;
            };
            for (int k = 1; k < kModes; ++k) {
                SCOPED_TRACE(k == 1 ? "lean" : "lean asked for, released after the wait");
                EXPECT_TRUE(same(stream[k], stream[0])) << "stream";
                EXPECT_TRUE(same(nq[k], nq[0]) && same(nd[k], nd[0])) << "norm out";
                EXPECT_TRUE(same(hq[k], hq[0]) && same(hd[k], hd[0])) << "SwiGLU";
            }
            // Poisoned scales are NaN: every block of both outputs written.
            EXPECT_EQ(std::count_if(nd[0].begin(), nd[0].end(), [](float d) { return std::isnan(d); }) +
                          std::count_if(hd[0].begin(), hd[0].end(), [](float d) { return std::isnan(d); }),
                      0);
        }
    }
}

// The q|k|v GEMV with the post-QKV work in its epilogue (matvec_q8s_qkv_rope_cuda, lab) writes
// exactly the bits of matvec_q8s_normed_cuda followed by qkv_post_cuda with the rope table: q,
// and the new cell's K and V rows in every tier pair; the cache's other rows stay as they were
// (poisoned). 14B and 7B head shapes (blocks cut inside heads and inside 32-unit groups,
// crossing a head boundary), 64-dim heads, with and without bias, at a random cell; each case
// launched twice on one hand-over scratch (the counts are left zero).
TEST(CudaMatvec, QkvRopeEpilogueEqualsNormedThenPost) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    struct Case {
        uint32_t n_head, n_head_kv, head_dim, cols;
        bool bias;
        KvType k_type, v_type;
    };
    const std::vector<Case> cases{
        {40, 8, 128, 5120, true, KvType::f16, KvType::f16},   {28, 4, 128, 3584, true, KvType::f16, KvType::f16},
        {4, 2, 64, 1024, false, KvType::f16, KvType::f16},    {40, 8, 128, 5120, false, KvType::q8_0, KvType::q8_0},
        {40, 8, 128, 5120, true, KvType::q4_0, KvType::q4_0}, {28, 4, 128, 3584, true, KvType::q8_0, KvType::q4_0},
        {4, 2, 64, 1024, true, KvType::f16, KvType::q8_0},    {40, 8, 128, 5120, true, KvType::q4_0, KvType::f16}};
    for (const Case& c : cases) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE("heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " dim " +
                     std::to_string(c.head_dim) + (c.bias ? " bias" : "") + " K " + kv_type_name(c.k_type) + " V " +
                     kv_type_name(c.v_type) + " seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        const uint32_t D = c.head_dim, qd = c.n_head * D, kd = c.n_head_kv * D, rows = qd + 2 * kd;
        ASSERT_TRUE(matvec_q8s_qkv_rope_fits(c.n_head, c.n_head_kv, D, c.cols));
        const DeviceSplitMatrix m(rng, rows, c.cols);
        const RandomQ16 xr(rng, c.cols);
        const ActQ16 x = xr.act();
        std::vector<float> partials(7);
        for (float& p : partials) p = std::uniform_real_distribution<float>(100.0f, 900.0f)(rng);
        auto d_partials = to_device(partials);
        const NormedX normed{d_partials.data(), (uint32_t)partials.size(), 1e-6f};
        auto d_bias = to_device(random_floats(rng, rows, 0.5f));
        const TestDeviceRope rope(D);
        const uint32_t n_cells = 16, cell = std::uniform_int_distribution<uint32_t>(0, n_cells - 1)(rng);
        auto d_pos = to_device(std::vector<int32_t>{(int32_t)(1000 + 37 * cell)});
        DeviceBuffer<float2> table(D / 2);
        rope_table_cuda(rope.tables, d_pos.data(), 1, table.data(), nullptr);
        const float* bias = c.bias ? d_bias.data() : nullptr;
        const size_t k_row = kv_row_bytes(c.k_type, kd), v_row = kv_row_bytes(c.v_type, kd);
        // Reference: the plain normed GEMV, then the post-QKV launch.
        DeviceBuffer<float> y(rows);
        DeviceBuffer<uint8_t> k_ref(n_cells * k_row), v_ref(n_cells * v_row);
        poison(k_ref), poison(v_ref);
        matvec_q8s_normed_cuda(m.view(), x, normed, y.data(), rows, c.cols, nullptr);
        qkv_post_cuda(QkvPostShape{c.n_head, c.n_head_kv, D}, rope.tables, y.data(), y.data() + qd, y.data() + qd + kd,
                      bias, 1, d_pos.data(), c.k_type, k_ref.data(), c.v_type, v_ref.data(), cell, nullptr,
                      table.data());
        // The epilogue, twice on one scratch.
        DeviceBuffer<float> stage(2 * kd);
        DeviceBuffer<uint32_t> arrivals(kd / 32);
        SPILLWAY_CUDA_CHECK(cudaMemset(arrivals.data(), 0, arrivals.bytes()));
        for (int launch = 0; launch < 2; ++launch) {
            SCOPED_TRACE("launch " + std::to_string(launch));
            DeviceBuffer<float> q(qd);
            DeviceBuffer<uint8_t> k_c(n_cells * k_row), v_c(n_cells * v_row);
            poison(q), poison(k_c), poison(v_c);
            matvec_q8s_qkv_rope_cuda(m.view(), x, normed, c.cols,
                                     QkvRope{q.data(), k_c.data() + cell * k_row, v_c.data() + cell * v_row, bias,
                                             table.data(), c.n_head, c.n_head_kv, D, c.k_type, c.v_type,
                                             GluScratch{stage.data(), arrivals.data()}},
                                     nullptr);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<float> y_h = to_host(y), q_h = to_host(q);
            const auto same = [](const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; };
            EXPECT_TRUE(same(q_h.data(), y_h.data(), (size_t)qd * sizeof(float))) << "q";
            EXPECT_FALSE(std::isnan(q_h[0]) || std::isnan(q_h[qd - 1])) << "q not written";
            const std::vector<uint8_t> kc = to_host(k_c), kr = to_host(k_ref), vc = to_host(v_c), vr = to_host(v_ref);
            EXPECT_TRUE(same(kc.data(), kr.data(), kc.size())) << "K cache";
            EXPECT_TRUE(same(vc.data(), vr.data(), vc.size())) << "V cache";
            const std::vector<uint32_t> left = to_host(arrivals);
            EXPECT_EQ(std::count(left.begin(), left.end(), 0u), (long)left.size()) << "counts not left zero";
        }
    }
    // Heads too narrow for the SMs (more than head_dim / 2 pairs per block), or not whole
    // 32-value blocks per half head, are not taken.
    EXPECT_FALSE(matvec_q8s_qkv_rope_fits(8192, 8192, 64, 512));
    EXPECT_FALSE(matvec_q8s_qkv_rope_fits(40, 8, 96, 5120));
}

TEST(CudaMatvec, RejectsUnsupportedInputs) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    DeviceBuffer<uint8_t> w(1 << 16);
    DeviceBuffer<float> x(1024), y(1024);
    EXPECT_THROW(matvec_cuda(GgmlType::Q4_K, w.data(), x.data(), y.data(), 4, 256, 1, nullptr), Error);
    EXPECT_THROW(matvec_cuda(GgmlType::Q8_0, w.data(), x.data(), y.data(), 4, 48, 1, nullptr), Error);
    EXPECT_THROW(matvec_cuda(GgmlType::F16, w.data(), x.data(), y.data(), 4, 256, 9, nullptr), Error);
    EXPECT_THROW(matvec_q8_0_cuda(MatvecQ8Kernel::stream3, w.data(), x.data(), y.data(), 4, 96, 1, nullptr), Error);
    EXPECT_THROW(matvec_q8_0_cuda(MatvecQ8Kernel::stream2, w.data(), x.data(), y.data(), 4, 256, 2, nullptr), Error);
    DeviceBuffer<int16_t> xq(1024);
    DeviceBuffer<float> xd(32);
    EXPECT_THROW(matvec_q8_0_q16x_cuda(w.data(), ActQ16{xq.data(), xd.data()}, y.data(), 4, 96, nullptr), Error);
    EXPECT_THROW(matvec_q8_0_q16x_cuda(w.data(), ActQ16{}, y.data(), 4, 256, nullptr), Error);
}

}  // namespace
}  // namespace spillway
