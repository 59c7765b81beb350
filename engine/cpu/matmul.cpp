#include "engine/cpu/matmul.h"

#include <string>

#include "common/error.h"

namespace spillway {

WeightMatrix make_weight_matrix(GgmlType type, const uint8_t* data, uint32_t n_in, uint32_t n_out) {
    WeightMatrix w;
    w.type = type;
    w.data = data;
    w.n_in = n_in;
    w.n_out = n_out;
    w.kernels = &weight_kernels(type);
    auto row = ggml_row_bytes(type, n_in);
    if (!row) fail(std::string("weight rows of ") + std::to_string(n_in) + " values are not whole " +
                   ggml_type_name(type) + " blocks");
    w.row_bytes = *row;
    return w;
}

void matmul_cpu(ThreadPool& pool, const WeightMatrix& w, const float* x, uint32_t n_tokens,
                const float* bias, float* y, float* scratch) {
    const size_t n_in = w.n_in, n_out = w.n_out;
    if (n_tokens == 1) {
        // Decode: fused dot straight from the stored blocks; every weight byte read once.
        pool.parallel_for(n_out, [&](size_t begin, size_t end, unsigned) {
            for (size_t r = begin; r < end; ++r)
                y[r] = w.kernels->dot(w.row((uint32_t)r), x, n_in) + (bias ? bias[r] : 0.0f);
        });
        return;
    }
    // Prefill: expand each row once, reuse it for all tokens of the chunk.
    pool.parallel_for(n_out, [&](size_t begin, size_t end, unsigned thread) {
        float* row = scratch + (size_t)thread * n_in;
        for (size_t r = begin; r < end; ++r) {
            w.kernels->dequantize(w.row((uint32_t)r), row, n_in);
            const float b = bias ? bias[r] : 0.0f;
            for (size_t t = 0; t < n_tokens; ++t) y[t * n_out + r] = dot_f32(row, x + t * n_in, n_in) + b;
        }
    });
}

void weight_row_f32(const WeightMatrix& w, uint32_t r, float* out) {
    w.kernels->dequantize(w.row(r), out, w.n_in);
}

}  // namespace spillway
