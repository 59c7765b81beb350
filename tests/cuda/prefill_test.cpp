// The engine's own prefill ops against CPU references, op by op: weight-tile dequantization
// to f16, the cuBLAS matrix product with bounded weight tiles, and the causal attention of a
// chunk over every KV tier. (The whole-model comparison is forward_test.cpp.)
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/fp16.h"
#include "cuda_test_util.h"
#include "engine/cpu/attention.h"
#include "engine/cuda/cuda_prefill.cuh"
#include "gguf/quants.h"
#include "kv/kv_codec.h"

namespace spillway {
namespace {

using cuda_test::rel_error;

// n_out random rows of n_in values in `type`'s GGUF layout, and their exact f32 values.
struct HostMatrix {
    std::vector<uint8_t> bytes;
    std::vector<float> values;  // dequantized: what the GPU must reproduce
    uint64_t row_bytes = 0;
};

HostMatrix random_matrix(std::mt19937& rng, GgmlType type, uint32_t n_in, uint32_t n_out) {
    HostMatrix m;
    m.row_bytes = *ggml_row_bytes(type, n_in);
    m.bytes.resize(m.row_bytes * n_out);
    m.values.resize((size_t)n_in * n_out);
    for (uint32_t r = 0; r < n_out; ++r) {
        const auto x = cuda_test::random_floats(rng, n_in, 0.5f);
        quantize_row(type, x.data(), m.bytes.data() + r * m.row_bytes, n_in);
        dequantize_row(type, m.bytes.data() + r * m.row_bytes, m.values.data() + (size_t)r * n_in, n_in);
    }
    return m;
}

TEST(CudaPrefill, DequantizeRowsToF16MatchesCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n_in = 256, n_out = 70, r0 = 5, n_rows = 60;
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16}) {
        const HostMatrix h = random_matrix(rng, type, n_in, n_out);
        const auto w_dev = cuda_test::to_device(h.bytes);
        CudaMatrix w{type, w_dev.data(), n_in, n_out, h.row_bytes};
        DeviceBuffer<__half> out((size_t)n_rows * n_in);
        cuda_test::poison(out);
        dequantize_rows_f16_cuda(w, r0, n_rows, out.data(), nullptr);
        std::vector<uint16_t> got(out.size());
        SPILLWAY_CUDA_CHECK(cudaMemcpy(got.data(), out.data(), out.bytes(), cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const float ref = h.values[(size_t)r0 * n_in + i];
            // One rounding to f16 (round to nearest): within half an f16 ulp of the f32 value.
            if (!(std::fabs(fp16_to_fp32(got[i]) - ref) <= std::fabs(ref) * 0x1p-11f + 1e-7f)) ++bad;
        }
        EXPECT_EQ(bad, 0u) << ggml_type_name(type);
    }
}

TEST(CudaPrefill, MatmulWithWeightTilesMatchesCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n_in = 512, n_out = 300, T = 17;
    cublasHandle_t cublas = nullptr;
    SPILLWAY_CUDA_CHECK(cublasCreate(&cublas));
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16}) {
        const HostMatrix h = random_matrix(rng, type, n_in, n_out);
        const auto x = cuda_test::random_floats(rng, (size_t)T * n_in);
        std::vector<float> ref((size_t)T * n_out);
        for (uint32_t t = 0; t < T; ++t)
            for (uint32_t r = 0; r < n_out; ++r) {
                double s = 0;
                for (uint32_t i = 0; i < n_in; ++i) s += (double)h.values[(size_t)r * n_in + i] * x[(size_t)t * n_in + i];
                ref[(size_t)t * n_out + r] = (float)s;
            }
        const auto w_dev = cuda_test::to_device(h.bytes);
        const auto x_dev = cuda_test::to_device(x);
        CudaMatrix w{type, w_dev.data(), n_in, n_out, h.row_bytes};
        DeviceBuffer<float> y((size_t)T * n_out);
        cuda_test::poison(y);
        DeviceBuffer<__half> act((size_t)T * n_in);
        DeviceBuffer<__half> tile(64 * n_in);  // 64 rows fit: 5 balanced tiles of 60 rows
        matmul_prefill_cuda(cublas, w, x_dev.data(), T, y.data(), act.data(), tile.data(), tile.size(), nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = cuda_test::to_host(y);
        // f16 operands (x rounded to f16; weights exact or rounded once), f32 accumulation.
        EXPECT_LE(rel_error(got, ref), 3e-3) << ggml_type_name(type);
    }
    cublasDestroy(cublas);
}

// Pure: tile rows for the chunk GEMMs' weight scratch.
TEST(CudaPrefill, WeightTileRowsAreBalanced) {
    const size_t tile = 32ull << 20;  // the engine's 64 MiB of halves
    EXPECT_EQ(prefill_tile_rows(5120, 5120, tile), 5120u);        // fits whole
    EXPECT_EQ(prefill_tile_rows(13824, 5120, tile), 4608u);       // 3 x 4608, not 6528 + 6528 + 768
    EXPECT_EQ(prefill_tile_rows(13824, 5120, tile, true), 6528u);  // the old greedy split
    EXPECT_EQ(prefill_tile_rows(5120, 13824, tile), 1792u);       // 1792 + 1792 + 1536 (fit: 2427)
    EXPECT_EQ(prefill_tile_rows(152064, 5120, tile), 6400u);      // the head: 24 tiles (6336 rounded up to 128)
    EXPECT_EQ(prefill_tile_rows(300, 512, 64 * 512), 60u);        // rounding up to 128 would not fit: even split
    EXPECT_EQ(prefill_tile_rows(300, 512, 64 * 512, true), 64u);
    EXPECT_EQ(prefill_tile_rows(10, 1u << 20, 1u << 19), 0u);     // not one row
    EXPECT_EQ(prefill_tile_rows(0, 512, 1024), 0u);
    for (uint32_t n_out : {1u, 127u, 128u, 129u, 1000u, 13824u, 27648u, 152064u})
        for (uint32_t n_in : {64u, 896u, 5120u, 13824u}) {
            const uint32_t rows = prefill_tile_rows(n_out, n_in, tile);
            ASSERT_GT(rows, 0u);
            EXPECT_LE((uint64_t)rows * n_in, tile) << n_out << "x" << n_in;  // fits the scratch
            EXPECT_LE(rows, n_out);
            // No more tiles than the greedy split needs.
            const uint32_t greedy = prefill_tile_rows(n_out, n_in, tile, true);
            EXPECT_LE((n_out + rows - 1) / rows, (n_out + greedy - 1) / greedy) << n_out << "x" << n_in;
        }
}

// Pure: the tile is the largest any matrix takes under the cap, and every matrix keeps the
// cap's tiling in it.
TEST(CudaPrefill, WeightTileFitsTheLargestTile) {
    const size_t cap = 32ull << 20;
    const std::vector<std::pair<uint32_t, uint32_t>> qwen14b{
        {5120, 5120}, {1024, 5120}, {1024, 5120}, {5120, 5120}, {13824, 5120}, {13824, 5120}, {5120, 13824}};
    EXPECT_EQ(prefill_tile_elems(qwen14b, cap), 5120u * 5120u);  // q and o whole: 50 MiB, not 64
    auto with_head = qwen14b;
    with_head.emplace_back(152064, 5120);
    EXPECT_EQ(prefill_tile_elems(with_head, cap), 6400u * 5120u);
    EXPECT_EQ(prefill_tile_elems({}, cap), 0u);
    EXPECT_EQ(prefill_tile_elems({{10, 1u << 20}}, cap / 64), 0u);  // not one row: matmul fails as before
    for (bool greedy : {false, true}) {
        std::vector<std::pair<uint32_t, uint32_t>> shapes;
        for (uint32_t n_out : {1u, 127u, 1000u, 13824u, 27648u, 152064u})
            for (uint32_t n_in : {64u, 896u, 5120u, 13824u}) shapes.emplace_back(n_out, n_in);
        for (size_t n = 1; n <= shapes.size(); n += 5) {
            const std::vector<std::pair<uint32_t, uint32_t>> some(shapes.begin(), shapes.begin() + n);
            const size_t elems = prefill_tile_elems(some, cap, greedy);
            EXPECT_LE(elems, cap);
            for (const auto& [n_out, n_in] : some)
                EXPECT_EQ(prefill_tile_rows(n_out, n_in, elems, greedy), prefill_tile_rows(n_out, n_in, cap, greedy))
                    << n_out << "x" << n_in << " among " << n << (greedy ? " greedy" : "");
        }
    }
}

// y += W x through the tiles equals y0 + (W x) added afterwards, bit for bit: the residual
// add of a chunk's wo and down projections (cuBLAS's beta = 1).
TEST(CudaPrefill, MatmulAddingIntoYEqualsASeparateAdd) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n_in = 512, n_out = 300, T = 37;
    cublasHandle_t cublas = nullptr;
    SPILLWAY_CUDA_CHECK(cublasCreate(&cublas));
    const HostMatrix host = random_matrix(rng, GgmlType::Q8_0, n_in, n_out);
    const auto w_dev = cuda_test::to_device(host.bytes);
    const auto x = cuda_test::random_floats(rng, (size_t)T * n_in);
    const auto y0 = cuda_test::random_floats(rng, (size_t)T * n_out);
    const auto x_dev = cuda_test::to_device(x);
    auto plain = cuda_test::to_device(y0), added = cuda_test::to_device(y0);
    cuda_test::poison(plain);
    DeviceBuffer<__half> act((size_t)T * n_in), tile(128 * n_in);  // tiles of 128, 128 and 44 rows
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    PrefillGemmScratch sc;
    sc.act_f16 = act.data();
    sc.tiles[0] = tile.data();
    sc.tile_elems = tile.size();
    prefill_act_to_f16_cuda(x_dev.data(), (size_t)T * n_in, act.data(), nullptr);
    const CudaMatrix w{GgmlType::Q8_0, w_dev.data(), n_in, n_out, host.row_bytes};
    matmul_prefill_f16act_cuda(cublas, w, T, plain.data(), sc, nullptr);
    matmul_prefill_f16act_cuda(cublas, w, T, added.data(), sc, nullptr, "gemm", true);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    const auto p = cuda_test::to_host(plain), a = cuda_test::to_host(added);
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += a[i] != y0[i] + p[i];
    EXPECT_EQ(differ, 0u) << "of " << a.size();
    cublasDestroy(cublas);
}

// Blocks a stream for a few milliseconds from the host side (cudaLaunchHostFunc): work queued
// behind it waits, so work on another stream that should wait for it and does not runs first.
void CUDART_CB hold_stream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

// The engine's path: x converted once, two weight tiles, the side stream dequantizing the
// next tile while cuBLAS multiplies the current one. Three matrices in a row (23 tiles: the
// alternation carries over from call to call and the second pass starts on the other
// tile), on a non-blocking stream, twice: once with the main stream held before the pass (a
// dequantization that does not wait for the GEMM last reading its tile overwrites it), once
// with the side stream held (a GEMM that does not wait for its tile's dequantization reads
// stale bytes). Each pass equals the one-tile path bit for bit (same tile rows), and that
// path matches the CPU within the GEMM tolerance.
TEST(CudaPrefill, OverlappedDequantizationMatchesOneTile) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t n_in = 512, T = 33;
    const std::vector<uint32_t> n_outs{300, 129, 950};  // 5 + 3 + 15 tiles of at most 64 rows
    cublasHandle_t cublas = nullptr;
    SPILLWAY_CUDA_CHECK(cublasCreate(&cublas));
    cudaStream_t stream = nullptr;
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::BF16}) {
        SCOPED_TRACE(ggml_type_name(type));
        const auto x = cuda_test::random_floats(rng, (size_t)T * n_in);
        const auto x_dev = cuda_test::to_device(x);
        DeviceBuffer<__half> act((size_t)T * n_in), tile_one(64 * n_in), tile_a(64 * n_in), tile_b(64 * n_in);
        std::vector<HostMatrix> hosts;
        std::vector<DeviceBuffer<uint8_t>> w_devs;
        std::vector<DeviceBuffer<float>> one_tile, pass[2];
        for (uint32_t n_out : n_outs) {
            hosts.push_back(random_matrix(rng, type, n_in, n_out));
            w_devs.push_back(cuda_test::to_device(hosts.back().bytes));
            one_tile.emplace_back((size_t)T * n_out);
            cuda_test::poison(one_tile.back());
            for (auto& p : pass) {
                p.emplace_back((size_t)T * n_out);
                cuda_test::poison(p.back());
            }
        }
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());  // the poisoning ran on the legacy stream
        PrefillGemmScratch single;
        single.act_f16 = act.data();
        single.tiles[0] = tile_one.data();
        single.tile_elems = tile_one.size();
        PrefillGemmScratch overlap = single;
        overlap.tiles[0] = tile_a.data();
        overlap.tiles[1] = tile_b.data();
        SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&overlap.side, cudaStreamNonBlocking));
        for (int i = 0; i < 2; ++i) {
            SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&overlap.dequant_done[i], cudaEventDisableTiming));
            SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&overlap.gemm_done[i], cudaEventDisableTiming));
        }
        prefill_act_to_f16_cuda(x_dev.data(), (size_t)T * n_in, act.data(), stream);
        for (size_t j = 0; j < n_outs.size(); ++j) {
            const CudaMatrix w{type, w_devs[j].data(), n_in, n_outs[j], hosts[j].row_bytes};
            matmul_prefill_f16act_cuda(cublas, w, T, one_tile[j].data(), single, stream);
        }
        for (int p = 0; p < 2; ++p) {
            SPILLWAY_CUDA_CHECK(cudaLaunchHostFunc(p == 0 ? stream : overlap.side, hold_stream, nullptr));
            const uint32_t first_tile = overlap.next_tile;
            for (size_t j = 0; j < n_outs.size(); ++j) {
                const CudaMatrix w{type, w_devs[j].data(), n_in, n_outs[j], hosts[j].row_bytes};
                matmul_prefill_f16act_cuda(cublas, w, T, pass[p][j].data(), overlap, stream);
            }
            EXPECT_NE(overlap.next_tile, first_tile) << "23 tiles: the next pass starts on the other tile";
        }
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
        for (size_t j = 0; j < n_outs.size(); ++j) {
            const uint32_t n_out = n_outs[j];
            std::vector<float> ref((size_t)T * n_out);
            for (uint32_t t = 0; t < T; ++t)
                for (uint32_t r = 0; r < n_out; ++r) {
                    double s = 0;
                    for (uint32_t i = 0; i < n_in; ++i)
                        s += (double)hosts[j].values[(size_t)r * n_in + i] * x[(size_t)t * n_in + i];
                    ref[(size_t)t * n_out + r] = (float)s;
                }
            const auto a = cuda_test::to_host(one_tile[j]);
            EXPECT_LE(rel_error(a, ref), 3e-3) << n_out << " rows";
            for (int p = 0; p < 2; ++p) {
                const auto b = cuda_test::to_host(pass[p][j]);
                EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()))
                    << n_out << " rows, pass " << p << (p == 0 ? " (main stream held)" : " (side stream held)");
            }
        }
        for (int i = 0; i < 2; ++i) {
            cudaEventDestroy(overlap.dequant_done[i]);
            cudaEventDestroy(overlap.gemm_done[i]);
        }
        cudaStreamDestroy(overlap.side);
    }
    cudaStreamDestroy(stream);
    cublasDestroy(cublas);
}

TEST(CudaPrefill, CausalAttentionMatchesCpuForEveryKvTier) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    for (uint32_t D : {64u, 128u}) {
        const AttentionShape shape{8, 2, D, D, 1.0f / std::sqrt((float)D)};
        const uint32_t pos0 = 40, T = 25, n_cells = pos0 + T;  // crosses 32-cell tiles mid-chunk
        const uint32_t kv_values = shape.n_head_kv * D, q_values = shape.n_head * D;
        for (KvType kt : {KvType::f16, KvType::q8_0, KvType::q4_0})
            for (KvType vt : {KvType::f16, KvType::q8_0, KvType::q4_0}) {
                const uint64_t k_row = kv_row_bytes(kt, kv_values), v_row = kv_row_bytes(vt, kv_values);
                std::vector<uint8_t> k(k_row * n_cells), v(v_row * n_cells);
                for (uint32_t c = 0; c < n_cells; ++c) {
                    const auto kx = cuda_test::random_floats(rng, kv_values);
                    const auto vx = cuda_test::random_floats(rng, kv_values);
                    kv_store_row(kt, kx.data(), k.data() + c * k_row, kv_values);
                    kv_store_row(vt, vx.data(), v.data() + c * v_row, kv_values);
                }
                const auto q = cuda_test::random_floats(rng, (size_t)T * q_values);
                std::vector<float> ref((size_t)T * q_values), lse(shape.n_head);
                for (uint32_t t = 0; t < T; ++t)
                    attention_partial_cpu(shape, q.data() + (size_t)t * q_values, kt, k.data(), vt, v.data(),
                                          pos0 + t + 1, ref.data() + (size_t)t * q_values, lse.data());
                const auto k_dev = cuda_test::to_device(k);
                const auto v_dev = cuda_test::to_device(v);
                const auto q_dev = cuda_test::to_device(q);
                DeviceBuffer<float> out((size_t)T * q_values);
                for (PrefillAttentionKernel kernel : {PrefillAttentionKernel::simt, PrefillAttentionKernel::tensor_core,
                                                      PrefillAttentionKernel::tensor_core_wide}) {
                    cuda_test::poison(out);
                    prefill_attention_partial_cuda_with(kernel, shape, q_dev.data(), kt, k_dev.data(), vt, v_dev.data(),
                                                        0, n_cells, pos0, T, out.data(), nullptr, nullptr);
                    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                    const auto got = cuda_test::to_host(out);
                    // simt: same dequantized values, f32 arithmetic in another order, __expf: ~1e-6.
                    // tensor_core: q and p rounded to f16 (2^-11 relative each), K/V dequantized
                    // to f16 (exact for f16, one rounding for q8_0/q4_0): ~1e-3.
                    const double tol = kernel == PrefillAttentionKernel::simt ? 1e-4 : 4e-3;
                    EXPECT_LE(rel_error(got, ref), tol) << prefill_attention_kernel_name(kernel) << " D " << D << " "
                                                        << kv_type_name(kt) << "/" << kv_type_name(vt);
                }
                // The whole-prefix entry point (the engine's) is the default kernel over [0, pos0 + T).
                cuda_test::poison(out);
                prefill_attention_cuda(shape, q_dev.data(), kt, k_dev.data(), vt, v_dev.data(), pos0, T, out.data(),
                                       nullptr);
                SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                EXPECT_LE(rel_error(cuda_test::to_host(out), ref), 4e-3) << "default, D " << D;
            }
    }
}

}  // namespace
}  // namespace spillway
