// matvec_cuda vs the CPU: weights quantized by gguf/quants.h, reference = dequantized
// weights times x in double. The GPU uses the same dequantized values and accumulates in
// f32, so the tolerance is f32 summation error: 1e-5 for every weight type.
#include "engine/cuda/matvec.cuh"

#include "cuda_test_util.h"
#include "gguf/quants.h"

namespace spillway {
namespace {

using namespace cuda_test;

struct MatvecCase {
    GgmlType type;
    uint32_t rows, cols, n_tokens;
};

void check_matvec(const MatvecCase& c) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE(std::string(ggml_type_name(c.type)) + " rows=" + std::to_string(c.rows) + " cols=" +
                 std::to_string(c.cols) + " tokens=" + std::to_string(c.n_tokens) + " seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::vector<float> w = random_floats(rng, (size_t)c.rows * c.cols, 0.05f);
    const std::vector<float> x = random_floats(rng, (size_t)c.n_tokens * c.cols);

    const uint64_t row_bytes = *ggml_row_bytes(c.type, c.cols);
    std::vector<uint8_t> w_q(row_bytes * c.rows);
    std::vector<float> w_deq((size_t)c.rows * c.cols);
    for (uint32_t r = 0; r < c.rows; ++r) {
        quantize_row(c.type, w.data() + (size_t)r * c.cols, w_q.data() + r * row_bytes, c.cols);
        dequantize_row(c.type, w_q.data() + r * row_bytes, w_deq.data() + (size_t)r * c.cols, c.cols);
    }
    std::vector<float> ref((size_t)c.n_tokens * c.rows);
    for (uint32_t t = 0; t < c.n_tokens; ++t) {
        for (uint32_t r = 0; r < c.rows; ++r) {
            double sum = 0.0;
            for (uint32_t k = 0; k < c.cols; ++k) sum += (double)w_deq[(size_t)r * c.cols + k] * x[(size_t)t * c.cols + k];
            ref[(size_t)t * c.rows + r] = (float)sum;
        }
    }

    auto d_w = to_device(w_q);
    auto d_x = to_device(x);
    DeviceBuffer<float> d_y(ref.size());
    poison(d_y);
    matvec_cuda(c.type, d_w.data(), d_x.data(), d_y.data(), c.rows, c.cols, c.n_tokens, nullptr);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> y = to_host(d_y);
    EXPECT_EQ(count_nan(y), 0u);
    const double err = rel_error(y, ref);
    EXPECT_LT(err, 1e-5) << "relative error " << err;
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

TEST(CudaMatvec, RejectsUnsupportedInputs) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    DeviceBuffer<uint8_t> w(1 << 16);
    DeviceBuffer<float> x(1024), y(1024);
    EXPECT_THROW(matvec_cuda(GgmlType::Q4_K, w.data(), x.data(), y.data(), 4, 256, 1, nullptr), Error);
    EXPECT_THROW(matvec_cuda(GgmlType::Q8_0, w.data(), x.data(), y.data(), 4, 48, 1, nullptr), Error);
    EXPECT_THROW(matvec_cuda(GgmlType::F16, w.data(), x.data(), y.data(), 4, 256, 9, nullptr), Error);
}

}  // namespace
}  // namespace spillway
