// Prefill attention over a range of cells (the partial + LSE contract of engine/cpu/attention.h)
// for every kernel, every K/V tier pair and head dims 64 / 128, against the CPU reference;
// and two ranges merged on the GPU == one pass over their union (what the KV spill does).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "engine/cpu/attention.h"
#include "engine/cuda/attention.cuh"
#include "engine/cuda/cuda_prefill.cuh"
#include "engine/cuda/prefill_attention_m32.cuh"
#include "engine/cuda/prefill_attention_wgmma.cuh"
#include "engine/cuda/prefill_attention_ws.cuh"
#include "kv/kv_codec.h"

namespace spillway {
namespace {

using cuda_test::rel_error;

constexpr PrefillAttentionKernel kKernels[] = {PrefillAttentionKernel::simt, PrefillAttentionKernel::tensor_core,
                                               PrefillAttentionKernel::tensor_core_wide,
                                               PrefillAttentionKernel::tensor_core_m32,
                                               PrefillAttentionKernel::tensor_core_m32_wide,
                                               PrefillAttentionKernel::tensor_core_m32_unsplit,
                                               PrefillAttentionKernel::tensor_core_wgmma};

// simt: f32 throughout (~1e-6). tensor_core: q and p rounded to f16 (2^-11 relative each),
// quantized K/V dequantized to f16 (one more rounding): ~1e-3 relative, ~1e-3 absolute in lse.
double out_tolerance(PrefillAttentionKernel k) { return k == PrefillAttentionKernel::simt ? 1e-4 : 4e-3; }
double lse_tolerance(PrefillAttentionKernel k) { return k == PrefillAttentionKernel::simt ? 1e-4 : 1e-2; }

struct Layer {
    std::vector<uint8_t> k, v;
    uint64_t k_row = 0, v_row = 0;
};

Layer random_layer(std::mt19937& rng, const AttentionShape& s, KvType kt, KvType vt, uint32_t n_cells) {
    Layer L;
    const uint32_t kv_values = s.n_head_kv * s.head_dim_k;
    L.k_row = kv_row_bytes(kt, kv_values);
    L.v_row = kv_row_bytes(vt, kv_values);
    L.k.resize(L.k_row * n_cells);
    L.v.resize(L.v_row * n_cells);
    for (uint32_t c = 0; c < n_cells; ++c) {
        const auto kx = cuda_test::random_floats(rng, kv_values);
        const auto vx = cuda_test::random_floats(rng, kv_values);
        kv_store_row(kt, kx.data(), L.k.data() + c * L.k_row, kv_values);
        kv_store_row(vt, vx.data(), L.v.data() + c * L.v_row, kv_values);
    }
    return L;
}

// CPU partial of each token over cells [begin, min(end, pos0 + t + 1)).
void reference_partial(const AttentionShape& s, const std::vector<float>& q, KvType kt, KvType vt, const Layer& L,
                       uint32_t begin, uint32_t end, uint32_t pos0, uint32_t T, std::vector<float>& out,
                       std::vector<float>& lse) {
    const uint32_t qv = s.n_head * s.head_dim_k;
    out.assign((size_t)T * qv, 0.0f);
    lse.assign((size_t)T * s.n_head, 0.0f);
    for (uint32_t t = 0; t < T; ++t) {
        const uint32_t stop = std::min(end, pos0 + t + 1);
        const uint32_t n = stop > begin ? stop - begin : 0;
        attention_partial_cpu(s, q.data() + (size_t)t * qv, kt, L.k.data() + begin * L.k_row, vt,
                              L.v.data() + begin * L.v_row, n, out.data() + (size_t)t * qv,
                              lse.data() + (size_t)t * s.n_head);
    }
}

// Largest |got - ref| over finite ref values; a ref of -inf must be matched exactly.
double lse_error(const std::vector<float>& got, const std::vector<float>& ref) {
    double worst = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (std::isinf(ref[i])) {
            if (!(std::isinf(got[i]) && got[i] < 0)) return INFINITY;
        } else {
            const double d = std::fabs((double)got[i] - ref[i]);
            if (!(d <= worst)) worst = d;  // NaN propagates as a failure
        }
    }
    return worst;
}

struct Case {
    uint32_t n_head, n_head_kv, D;
    uint32_t pos0, T, begin, end;  // the range [begin, end) of cells
};

// One case's random layer and queries (scale: their amplitude), the CPU partial over its range,
// and device copies; k / v point at the range's first cell.
struct RangeData {
    AttentionShape shape;
    std::vector<float> ref, ref_lse;
    DeviceBuffer<uint8_t> k_dev, v_dev;
    DeviceBuffer<float> q_dev;
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;
};
RangeData make_range_data(std::mt19937& rng, const Case& c, KvType kt, KvType vt, float scale = 1.0f) {
    RangeData d;
    d.shape = AttentionShape{c.n_head, c.n_head_kv, c.D, c.D, 1.0f / std::sqrt((float)c.D)};
    const Layer L = random_layer(rng, d.shape, kt, vt, std::max(c.end, c.pos0 + c.T));
    const auto q = cuda_test::random_floats(rng, (size_t)c.T * c.n_head * c.D, scale);
    reference_partial(d.shape, q, kt, vt, L, c.begin, c.end, c.pos0, c.T, d.ref, d.ref_lse);
    d.k_dev = cuda_test::to_device(L.k);
    d.v_dev = cuda_test::to_device(L.v);
    d.q_dev = cuda_test::to_device(q);
    d.k = d.k_dev.data() + c.begin * L.k_row;
    d.v = d.v_dev.data() + c.begin * L.v_row;
    return d;
}

TEST(CudaPrefillAttention, RangePartialMatchesCpuForEveryTierAndKernel) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    // G = 4 and 5 (rows of one block span several tokens, blocks cross token boundaries);
    // ranges that start inside the chunk (early tokens see nothing), end inside it (late
    // tokens are cut by the range, not by causality), and cross 64-cell tiles.
    const Case cases[] = {
        {8, 2, 64, 40, 25, 0, 65},      // the whole prefix
        {10, 2, 128, 70, 37, 50, 90},   // starts before the chunk, ends inside it
        {10, 2, 64, 16, 60, 30, 200},   // starts inside the chunk: tokens 0..13 see no cell
        {4, 4, 128, 130, 20, 3, 140},   // G = 1, starts mid-tile
    };
    for (const Case& c : cases) {
        for (KvType kt : {KvType::f16, KvType::q8_0, KvType::q4_0})
            for (KvType vt : {KvType::f16, KvType::q8_0, KvType::q4_0}) {
                const RangeData d = make_range_data(rng, c, kt, vt);
                const std::vector<float>& ref = d.ref;
                const std::vector<float>& ref_lse = d.ref_lse;
                DeviceBuffer<float> out(ref.size()), lse(ref_lse.size());
                for (PrefillAttentionKernel kernel : kKernels) {
                    cuda_test::poison(out);
                    cuda_test::poison(lse);
                    prefill_attention_partial_cuda_with(kernel, d.shape, d.q_dev.data(), kt, d.k, vt, d.v, c.begin,
                                                        c.end - c.begin, c.pos0, c.T, out.data(), lse.data(), nullptr);
                    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                    const std::string what = std::string(prefill_attention_kernel_name(kernel)) + " D " +
                                             std::to_string(c.D) + " G " + std::to_string(c.n_head / c.n_head_kv) +
                                             " cells [" + std::to_string(c.begin) + ", " + std::to_string(c.end) +
                                             ") " + kv_type_name(kt) + "/" + kv_type_name(vt);
                    EXPECT_LE(rel_error(cuda_test::to_host(out), ref), out_tolerance(kernel)) << what;
                    EXPECT_LE(lse_error(cuda_test::to_host(lse), ref_lse), lse_tolerance(kernel)) << what;
                }
            }
    }
}

TEST(CudaPrefillAttention, TwoMergedRangesEqualOnePass) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    // Qwen2.5-14B's head layout scaled down: G = 5, D = 128; a 300-token chunk after 200 cells,
    // split at cell 333 (inside the chunk: its first 134 tokens see nothing of the second range).
    const AttentionShape shape{10, 2, 128, 128, 1.0f / std::sqrt(128.0f)};
    const uint32_t pos0 = 200, T = 300, split = 333, n_cells = pos0 + T;
    for (const auto& [kt, vt] : {std::pair{KvType::f16, KvType::f16}, std::pair{KvType::q8_0, KvType::q4_0},
                                 std::pair{KvType::q4_0, KvType::q8_0}}) {
        const Layer L = random_layer(rng, shape, kt, vt, n_cells);
        const auto q = cuda_test::random_floats(rng, (size_t)T * shape.n_head * 128, 2.0f);  // peaked softmax
        std::vector<float> ref, ref_lse;
        reference_partial(shape, q, kt, vt, L, 0, n_cells, pos0, T, ref, ref_lse);
        const auto k_dev = cuda_test::to_device(L.k);
        const auto v_dev = cuda_test::to_device(L.v);
        const auto q_dev = cuda_test::to_device(q);
        DeviceBuffer<float> out_a(ref.size()), lse_a(ref_lse.size()), out_b(ref.size()), lse_b(ref_lse.size());
        for (PrefillAttentionKernel kernel : kKernels) {
            for (auto* b : {&out_a, &lse_a, &out_b, &lse_b}) cuda_test::poison(*b);
            prefill_attention_partial_cuda_with(kernel, shape, q_dev.data(), kt, k_dev.data(), vt, v_dev.data(), 0, split,
                                                pos0, T, out_a.data(), lse_a.data(), nullptr);
            prefill_attention_partial_cuda_with(kernel, shape, q_dev.data(), kt, k_dev.data() + split * L.k_row, vt,
                                                v_dev.data() + split * L.v_row, split, n_cells - split, pos0, T,
                                                out_b.data(), lse_b.data(), nullptr);
            attention_merge_cuda(T * shape.n_head, 128, out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), nullptr);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const std::string what = std::string(prefill_attention_kernel_name(kernel)) + " " + kv_type_name(kt) + "/" +
                                     kv_type_name(vt);
            EXPECT_LE(rel_error(cuda_test::to_host(out_a), ref), out_tolerance(kernel)) << what;
            EXPECT_LE(lse_error(cuda_test::to_host(lse_a), ref_lse), lse_tolerance(kernel)) << what;
        }
    }
}

// The quantized cache's rows as f16: every value is the CPU codec's d * q rounded once to
// f16, bit for bit (an odd row count and a row of 3 x 32 values: blocks cross 16-byte lines).
TEST(CudaPrefillAttention, KvRowsToF16EqualTheRoundedCodec) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    for (KvType t : {KvType::q8_0, KvType::q4_0})
        for (const auto& [n_rows, values] : {std::pair{37u, 96u}, std::pair{300u, 1024u}}) {
            const uint64_t row = kv_row_bytes(t, values);
            std::vector<uint8_t> rows(row * n_rows);
            std::vector<float> want((size_t)n_rows * values);
            for (uint32_t r = 0; r < n_rows; ++r) {
                const auto x = cuda_test::random_floats(rng, values, 3.0f);
                kv_store_row(t, x.data(), rows.data() + r * row, values);
                kv_load_row(t, rows.data() + r * row, want.data() + (size_t)r * values, values);
            }
            const auto rows_dev = cuda_test::to_device(rows);
            DeviceBuffer<__half> out((size_t)n_rows * values);
            cuda_test::poison(out);
            kv_rows_to_f16_cuda(t, rows_dev.data(), row, n_rows, values, out.data(), nullptr);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = cuda_test::to_host(out);
            size_t wrong = 0;
            for (size_t i = 0; i < want.size(); ++i)
                wrong += __half2float(got[i]) != __half2float(__float2half_rn(want[i]));
            EXPECT_EQ(wrong, 0u) << kv_type_name(t) << " " << n_rows << " x " << values;
        }
    std::vector<uint8_t> bad(64);
    const auto bad_dev = cuda_test::to_device(bad);
    DeviceBuffer<__half> out(64);
    EXPECT_THROW(kv_rows_to_f16_cuda(KvType::f16, bad_dev.data(), 64, 1, 32, out.data(), nullptr), Error);
    EXPECT_THROW(kv_rows_to_f16_cuda(KvType::q8_0, bad_dev.data(), 34, 1, 48, out.data(), nullptr), Error);
}

// prefill_attention_cuda's f16 piece scratch for T tokens of `shape` in pieces of `piece`
// cells, poisoned.
struct PieceScratch {
    PieceScratch(const AttentionShape& shape, uint32_t piece, uint32_t T)
        : k((size_t)std::max(piece, 1u) * shape.n_head_kv * shape.head_dim_k),
          v((size_t)std::max(piece, 1u) * shape.n_head_kv * shape.head_dim_v),
          piece_out((size_t)T * shape.n_head * shape.head_dim_v),
          piece_lse((size_t)T * shape.n_head),
          lse((size_t)T * shape.n_head),
          scratch{k.data(), v.data(), piece, piece_out.data(), piece_lse.data(), lse.data()} {
        for (auto* b : {&piece_out, &piece_lse, &lse}) cuda_test::poison(*b);
    }
    DeviceBuffer<__half> k, v;
    DeviceBuffer<float> piece_out, piece_lse, lse;
    PrefillKvF16Scratch scratch;
};

// A chunk's attention over a quantized cache through f16 pieces (what the engine's prefill
// does) against the CPU reference: pieces smaller than the chunk, a piece boundary inside the
// chunk (its early tokens see nothing of the later pieces), f16 K with quantized V, and one
// piece covering everything.
TEST(CudaPrefillAttention, DequantizedPiecesMatchCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t pos0 = 230, T = 150, n_cells = pos0 + T;
    // Head dim 128 (the wgmma / m32 kernels) and 64 (G = 4: the 16-row kernels).
    for (const AttentionShape& shape : {AttentionShape{10, 2, 128, 128, 1.0f / std::sqrt(128.0f)},
                                        AttentionShape{8, 2, 64, 64, 1.0f / std::sqrt(64.0f)}}) {
        for (const auto& [kt, vt] : {std::pair{KvType::q8_0, KvType::q8_0}, std::pair{KvType::q4_0, KvType::q4_0},
                                     std::pair{KvType::f16, KvType::q4_0}, std::pair{KvType::q8_0, KvType::f16}})
            for (uint32_t piece : {64u, 100u, 1024u}) {
                const uint32_t D = shape.head_dim_k;
                const Layer L = random_layer(rng, shape, kt, vt, n_cells);
                const auto q = cuda_test::random_floats(rng, (size_t)T * shape.n_head * D, 2.0f);
                std::vector<float> ref, ref_lse;
                reference_partial(shape, q, kt, vt, L, 0, n_cells, pos0, T, ref, ref_lse);
                const auto k_dev = cuda_test::to_device(L.k);
                const auto v_dev = cuda_test::to_device(L.v);
                const auto q_dev = cuda_test::to_device(q);
                PieceScratch pieces(shape, piece, T);
                DeviceBuffer<float> out(ref.size());
                cuda_test::poison(out);
                prefill_attention_cuda(shape, q_dev.data(), kt, k_dev.data(), vt, v_dev.data(), pos0, T, out.data(),
                                       nullptr, &pieces.scratch);
                SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                const std::string what = std::string(kv_type_name(kt)) + "/" + kv_type_name(vt) + " D " +
                                         std::to_string(D) + " pieces of " + std::to_string(piece);
                EXPECT_LE(rel_error(cuda_test::to_host(out), ref), 4e-3) << what;
                EXPECT_LE(lse_error(cuda_test::to_host(pieces.lse), ref_lse), 1e-2) << what;
            }
    }
}

// The chunk attention's f16 output (the wo GEMM's input, written by the wgmma kernels when the
// cells are one partial): the f32 output rounded to f16 bit for bit, and `out` left alone.
// Several pieces (partials to merge) and head dim 64 keep the f32 output and say so.
TEST(CudaPrefillAttention, F16OutputIsTheF32OutputRounded) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t pos0 = 300, T = 250, n_cells = pos0 + T;
    for (const AttentionShape& shape : {AttentionShape{10, 2, 128, 128, 1.0f / std::sqrt(128.0f)},
                                        AttentionShape{8, 2, 64, 64, 1.0f / std::sqrt(64.0f)}})
        for (const auto& [kt, vt, piece] : {std::tuple{KvType::f16, KvType::f16, 0u},
                                            std::tuple{KvType::q8_0, KvType::q8_0, 1024u},
                                            std::tuple{KvType::q4_0, KvType::f16, 128u}}) {
            const uint32_t D = shape.head_dim_k;
            const Layer L = random_layer(rng, shape, kt, vt, n_cells);
            const auto q = cuda_test::random_floats(rng, (size_t)T * shape.n_head * D, 2.0f);
            const auto k_dev = cuda_test::to_device(L.k);
            const auto v_dev = cuda_test::to_device(L.v);
            const auto q_dev = cuda_test::to_device(q);
            const size_t n_out = (size_t)T * shape.n_head * D;
            DeviceBuffer<float> ref_out(n_out), out(n_out);
            DeviceBuffer<__half> out16(n_out);
            PieceScratch piece_scratch(shape, piece, T);
            const PrefillKvF16Scratch* pieces = piece > 0 ? &piece_scratch.scratch : nullptr;
            const std::string what = std::string(kv_type_name(kt)) + "/" + kv_type_name(vt) + " D " +
                                     std::to_string(D) + " pieces of " + std::to_string(piece);
            EXPECT_FALSE(prefill_attention_cuda(shape, q_dev.data(), kt, k_dev.data(), vt, v_dev.data(), pos0, T,
                                                ref_out.data(), nullptr, pieces))
                << what;
            cuda_test::poison(out);
            cuda_test::poison(out16);
            const bool wrote_f16 = prefill_attention_cuda(shape, q_dev.data(), kt, k_dev.data(), vt, v_dev.data(), pos0,
                                                          T, out.data(), nullptr, pieces, out16.data());
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            const bool one_partial = piece == 0 || n_cells <= piece;
#if defined(SPILLWAY_EXPECT_WGMMA)
            if (prefill_attention_wgmma_available()) EXPECT_EQ(wrote_f16, D == 128 && one_partial) << what;
#endif
            if (!one_partial || D != 128) EXPECT_FALSE(wrote_f16) << what;
            const auto ref = cuda_test::to_host(ref_out);
            const auto got32 = cuda_test::to_host(out);
            if (wrote_f16) {
                const auto got16 = cuda_test::to_host(out16);
                size_t differ = 0, out_written = 0;
                for (size_t i = 0; i < n_out; ++i) {
                    const __half r = __float2half_rn(ref[i]);
                    differ += std::memcmp(&r, &got16[i], sizeof r) != 0;
                    out_written += !std::isnan(got32[i]);  // poison is NaN
                }
                EXPECT_EQ(differ, 0u) << what;
                EXPECT_EQ(out_written, 0u) << what;
            } else {
                EXPECT_EQ(std::memcmp(got32.data(), ref.data(), n_out * sizeof(float)), 0) << what;
            }
        }
}

TEST(CudaPrefillAttention, LongDepthChunkMatchesCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    // G = 5, D = 128, chunks deep into the cache: many unmasked tiles per row block (the
    // two-stage pipelines and the separate K and V waits), partial last row blocks; the third
    // chunk's range starts inside the chunk, so that its first 100 tokens see nothing.
    const AttentionShape shape{10, 2, 128, 128, 1.0f / std::sqrt(128.0f)};
    struct Chunk {
        uint32_t pos0, T, begin;
    };
    for (const Chunk& c : {Chunk{1900, 200, 0}, Chunk{1000, 400, 1100}})
        for (const auto& [kt, vt] : {std::pair{KvType::f16, KvType::f16}, std::pair{KvType::q8_0, KvType::q8_0},
                                     std::pair{KvType::q4_0, KvType::f16}}) {
            const uint32_t n_cells = c.pos0 + c.T;
            const Layer L = random_layer(rng, shape, kt, vt, n_cells);
            const auto q = cuda_test::random_floats(rng, (size_t)c.T * shape.n_head * 128, 2.0f);  // peaked softmax
            std::vector<float> ref, ref_lse;
            reference_partial(shape, q, kt, vt, L, c.begin, n_cells, c.pos0, c.T, ref, ref_lse);
            const auto k_dev = cuda_test::to_device(L.k);
            const auto v_dev = cuda_test::to_device(L.v);
            const auto q_dev = cuda_test::to_device(q);
            DeviceBuffer<float> out(ref.size()), lse(ref_lse.size());
            for (PrefillAttentionKernel kernel : kKernels) {
                if (kernel == PrefillAttentionKernel::simt) continue;  // covered above; slow at this depth
                cuda_test::poison(out);
                cuda_test::poison(lse);
                prefill_attention_partial_cuda_with(kernel, shape, q_dev.data(), kt, k_dev.data() + c.begin * L.k_row, vt,
                                                    v_dev.data() + c.begin * L.v_row, c.begin, n_cells - c.begin, c.pos0,
                                                    c.T, out.data(), lse.data(), nullptr);
                SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                const std::string what = std::string(prefill_attention_kernel_name(kernel)) + " pos0 " +
                                         std::to_string(c.pos0) + " T " + std::to_string(c.T) + " from cell " +
                                         std::to_string(c.begin) + " " + kv_type_name(kt) + "/" + kv_type_name(vt);
                EXPECT_LE(rel_error(cuda_test::to_host(out), ref), out_tolerance(kernel)) << what;
                EXPECT_LE(lse_error(cuda_test::to_host(lse), ref_lse), lse_tolerance(kernel)) << what;
            }
        }
}

// The cluster split's merge through distributed shared memory, forced to 2, 4 and 8 CTAs per
// row block (the automatic choice depends on the GPU's size; on smaller grids it splits rarely).
TEST(CudaPrefillAttention, ClusterSplitMatchesCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    int dev = 0, major = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9) GTEST_SKIP() << "thread-block clusters need sm_90";
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    // G = 5, D = 128, a 100-token chunk at depth 1000: the range [200, 1100) gives each row
    // block 13-15 tiles (8 CTAs: 1-2 each); the range [1050, 1100) starts inside the chunk:
    // the first 50 tokens see nothing in any rank and merge to (0, -inf), the others see one
    // tile, held by one rank while the other ranks' ranges are empty.
    const AttentionShape shape{10, 2, 128, 128, 1.0f / std::sqrt(128.0f)};
    const uint32_t pos0 = 1000, T = 100, n_cells = pos0 + T;
    for (const auto& [kt, vt] : {std::pair{KvType::f16, KvType::f16}, std::pair{KvType::q8_0, KvType::q4_0}}) {
        const Layer L = random_layer(rng, shape, kt, vt, n_cells);
        const auto q = cuda_test::random_floats(rng, (size_t)T * shape.n_head * 128, 2.0f);
        const auto k_dev = cuda_test::to_device(L.k);
        const auto v_dev = cuda_test::to_device(L.v);
        const auto q_dev = cuda_test::to_device(q);
        for (uint32_t begin : {200u, 1050u}) {
            std::vector<float> ref, ref_lse;
            reference_partial(shape, q, kt, vt, L, begin, n_cells, pos0, T, ref, ref_lse);
            DeviceBuffer<float> out(ref.size()), lse(ref_lse.size());
            for (bool wide : {false, true})
                for (uint32_t split : {2u, 4u, 8u}) {
                    cuda_test::poison(out);
                    cuda_test::poison(lse);
                    ASSERT_TRUE(prefill_attention_m32_cuda(shape, q_dev.data(), kt, k_dev.data() + begin * L.k_row, vt,
                                                           v_dev.data() + begin * L.v_row, begin, n_cells - begin, pos0,
                                                           T, out.data(), lse.data(), wide, split, nullptr));
                    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                    const std::string what = std::string(wide ? "8 warps" : "4 warps") + ", split " +
                                             std::to_string(split) + ", from cell " + std::to_string(begin) + " " +
                                             kv_type_name(kt) + "/" + kv_type_name(vt);
                    EXPECT_LE(rel_error(cuda_test::to_host(out), ref), 4e-3) << what;
                    EXPECT_LE(lse_error(cuda_test::to_host(lse), ref_lse), 1e-2) << what;
                }
        }
    }
}

// The wgmma kernels themselves (the kernel list above falls back to m32 where they do not
// apply): they must run on an sm_90 GPU in a build with sm_90a code, and match the CPU for f16
// (both kernels: skew128 and the warp-specialized one) and quantized tiers over 128-row blocks
// that cross token boundaries (G = 5, 3, 1), partial last tiles, ranges that start inside the
// chunk (rows that see nothing: out 0, lse -inf) and many tiles (the stages alternate). Other
// head dims are refused without a launch.
TEST(CudaPrefillAttention, WgmmaKernelMatchesCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    int dev = 0, major = 0, minor = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
#if defined(SPILLWAY_EXPECT_WGMMA)
    if (major == 9 && minor == 0) EXPECT_TRUE(prefill_attention_wgmma_available());
    // The specialized schedule needs the driver's tensor-map encoder: without it the test
    // below would check skew128 twice.
    if (major == 9 && minor == 0) EXPECT_TRUE(prefill_attention_ws_available());
#endif
    if (!prefill_attention_wgmma_available()) GTEST_SKIP() << "no sm_90a code for this GPU in this build";
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const Case cases[] = {
        {10, 2, 128, 0, 77, 0, 77},         // first chunk of a prompt, 385 rows
        {10, 2, 128, 1900, 200, 0, 2100},   // deep: 33 tiles, 1000 rows
        {10, 2, 128, 70, 37, 50, 90},       // range ends inside the chunk
        {6, 2, 128, 16, 60, 30, 200},       // starts inside the chunk: tokens 0..13 see no cell
        {8, 8, 128, 130, 20, 3, 140},       // G = 1, starts mid-tile
        {16, 2, 128, 300, 50, 0, 350},      // G = 8
        {10, 2, 128, 0, 100, 90, 100},      // the first blocks' rows see no cell of the range (no tile)
    };
    const std::pair<KvType, KvType> tiers[] = {
        {KvType::f16, KvType::f16},   {KvType::q8_0, KvType::q8_0}, {KvType::q4_0, KvType::q4_0},
        {KvType::q8_0, KvType::q4_0}, {KvType::f16, KvType::q8_0}, {KvType::q4_0, KvType::f16}};
    for (const Case& c : cases)
        for (const auto& [kt, vt] : tiers) {
            const RangeData d = make_range_data(rng, c, kt, vt, 2.0f);  // peaked softmax
            DeviceBuffer<float> out(d.ref.size()), lse(d.ref_lse.size());
            // Both kernels for f16 (the quantized tiers run skew128 whatever is asked).
            for (WgmmaSchedule schedule : {WgmmaSchedule::skew128, WgmmaSchedule::specialized}) {
                if (kt != KvType::f16 || vt != KvType::f16) schedule = WgmmaSchedule::automatic;
                cuda_test::poison(out);
                cuda_test::poison(lse);
                ASSERT_TRUE(prefill_attention_wgmma_cuda(d.shape, d.q_dev.data(), kt, d.k, vt, d.v, c.begin,
                                                         c.end - c.begin, c.pos0, c.T, out.data(), lse.data(), nullptr,
                                                         schedule));
                SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                const char* names[] = {"automatic", "skew128", "specialized"};
                const std::string what = std::string(names[(int)schedule]) + ", " + kv_type_name(kt) + "/" +
                                         kv_type_name(vt) + ", G " + std::to_string(c.n_head / c.n_head_kv) +
                                         ", pos0 " + std::to_string(c.pos0) + ", T " + std::to_string(c.T) +
                                         ", cells [" + std::to_string(c.begin) + ", " + std::to_string(c.end) + ")";
                EXPECT_LE(rel_error(cuda_test::to_host(out), d.ref), 4e-3) << what;
                EXPECT_LE(lse_error(cuda_test::to_host(lse), d.ref_lse), 1e-2) << what;
                if (schedule == WgmmaSchedule::automatic) break;
            }
        }
    // Not its head dim or group size: refused, nothing launched.
    const AttentionShape d64{8, 2, 64, 64, 0.125f}, g32{32, 1, 128, 128, 0.088f};
    EXPECT_FALSE(prefill_attention_wgmma_cuda(d64, nullptr, KvType::f16, nullptr, KvType::f16, nullptr, 0, 1, 0, 1,
                                              nullptr, nullptr, nullptr));
    EXPECT_FALSE(prefill_attention_wgmma_cuda(g32, nullptr, KvType::q8_0, nullptr, KvType::f16, nullptr, 0, 1, 0, 1,
                                              nullptr, nullptr, nullptr));
}

// A pure function: no GPU needed.
TEST(CudaPrefillAttention, KernelChoiceFollowsChunkDepthAndTiers) {
    const AttentionShape qwen14b{40, 8, 128, 128, 1.0f / std::sqrt(128.0f)};  // G = 5
    using K = PrefillAttentionKernel;
    // f16: 16-row 4-warp kernel for small chunks near the start of the cache, m32 otherwise.
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::f16, KvType::f16, 1, 1), K::tensor_core);
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::f16, KvType::f16, 512, 8191), K::tensor_core);
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::f16, KvType::f16, 512, 8192), K::tensor_core_m32);
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::f16, KvType::f16, 513, 513), K::tensor_core_m32);
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::f16, KvType::f16, 2048, 65536), K::tensor_core_m32);
    const AttentionShape g8{64, 8, 128, 128, 0.1f};  // G = 8: 320 tokens = 2560 rows
    EXPECT_EQ(prefill_attention_kernel_for(g8, KvType::f16, KvType::f16, 320, 4000), K::tensor_core);
    EXPECT_EQ(prefill_attention_kernel_for(g8, KvType::f16, KvType::f16, 321, 4000), K::tensor_core_m32);
    // Quantized K or V: the 8-warp m32 kernel at any size.
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::q8_0, KvType::q8_0, 64, 64), K::tensor_core_m32_wide);
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::f16, KvType::q4_0, 2048, 65536), K::tensor_core_m32_wide);
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::q4_0, KvType::f16, 512, 100), K::tensor_core_m32_wide);
    // Where the wgmma kernel is available: every tier pair of head dim 128; head dim 64 as before.
    for (KvType t : {KvType::f16, KvType::q8_0, KvType::q4_0})
        EXPECT_EQ(prefill_attention_kernel_for(qwen14b, t, KvType::f16, 512, 100, true), K::tensor_core_wgmma);
    EXPECT_EQ(prefill_attention_kernel_for(qwen14b, KvType::f16, KvType::q8_0, 2048, 65536, true),
              K::tensor_core_wgmma);
    const AttentionShape d64{8, 2, 64, 64, 0.125f};
    EXPECT_EQ(prefill_attention_kernel_for(d64, KvType::f16, KvType::f16, 512, 100, true), K::tensor_core);
    EXPECT_EQ(prefill_attention_kernel_for(d64, KvType::q8_0, KvType::q8_0, 512, 100, true), K::tensor_core_m32_wide);
}

// A pure function: no GPU needed. H200: 132 SMs x 2 blocks of the 4-warp m32 kernel = 264 slots.
TEST(CudaPrefillAttention, ClusterSplitFillsTheLastWave) {
    // 64k prompt, 2048-token chunk at depth 32k (G = 5, 128 rows per block): 80 row blocks x
    // 8 KV heads = 640 blocks of 512-544 tiles, 2.42 waves (81% of the slots busy); split 2:
    // 4.85 waves (97%); 4 is no fuller.
    EXPECT_EQ(prefill_attention_split_for(640, 264, 512, 544), 2u);
    // 4096-token chunks: 1280 blocks, 4.85 waves already: no split.
    EXPECT_EQ(prefill_attention_split_for(1280, 264, 512, 576), 1u);
    // 512-token chunks: 160 blocks (61%): split 8 fills 97% when every CTA keeps >= 32 tiles...
    EXPECT_EQ(prefill_attention_split_for(160, 264, 300, 308), 8u);
    // ... else the largest split that does (4: 81%), or none.
    EXPECT_EQ(prefill_attention_split_for(160, 264, 200, 208), 4u);
    EXPECT_EQ(prefill_attention_split_for(160, 264, 100, 108), 1u);
    // A shallow chunk: row blocks from 1 to 32 tiles fill the last wave themselves.
    EXPECT_EQ(prefill_attention_split_for(640, 264, 1, 32), 1u);
    EXPECT_EQ(prefill_attention_split_for(640, 264, 96, 128), 2u);  // 3/4: still split
    EXPECT_EQ(prefill_attention_split_for(640, 264, 95, 128), 1u);
    // Exactly full waves, and degenerate inputs.
    EXPECT_EQ(prefill_attention_split_for(264, 264, 1000, 1000), 1u);
    EXPECT_EQ(prefill_attention_split_for(0, 264, 1000, 1000), 1u);
    EXPECT_EQ(prefill_attention_split_for(16, 0, 1000, 1000), 1u);
}

}  // namespace
}  // namespace spillway
