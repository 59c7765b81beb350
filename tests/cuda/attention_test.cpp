// attention_partial_cuda / attention_merge_cuda vs engine/cpu/attention.h on the same KV
// bytes. The GPU rounds q, the dequantized K/V values and the softmax weights to f16 for
// the tensor-core products (f32 accumulation), so outputs carry ~2^-11 relative rounding:
// tolerance 5e-3 on ||out - ref|| / ||ref|| and 5e-3 absolute on the log-sum-exp, for every
// K/V type pair (the reference reads the same quantized bytes, so quantization itself is
// not part of the error).
#include "engine/cuda/attention.cuh"
#include "engine/cuda/attention_mma.cuh"
#include "engine/cuda/attention_short.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "act_q16_ref.h"
#include "cuda_test_util.h"
#include "engine/cpu/rope.h"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/qkv_post.cuh"
#include "engine/cuda/rope.cuh"
#include "kv/kv_codec.h"
#include "late_producer.cuh"
#include "rope_test_util.h"

namespace spillway {
namespace {

using namespace cuda_test;

constexpr double kOutTolerance = 5e-3;
constexpr double kLseTolerance = 5e-3;

struct KvCells {
    std::vector<uint8_t> k, v;
};

const char* kernel_name(AttentionKernel k) {
    return k == AttentionKernel::int_dot ? "int_dot " : k == AttentionKernel::mma ? "mma " : "tensor_core ";
}

KvCells random_cells(std::mt19937& rng, const AttentionShape& s, KvType kt, KvType vt, uint32_t n_cells) {
    const uint32_t nk = s.n_head_kv * s.head_dim_k, nv = s.n_head_kv * s.head_dim_v;
    KvCells cells;
    cells.k.resize(kv_row_bytes(kt, nk) * n_cells + 16);
    cells.v.resize(kv_row_bytes(vt, nv) * n_cells + 16);
    for (uint32_t c = 0; c < n_cells; ++c) {
        const auto kr = random_floats(rng, nk), vr = random_floats(rng, nv);
        kv_store_row(kt, kr.data(), cells.k.data() + kv_row_bytes(kt, nk) * c, nk);
        kv_store_row(vt, vr.data(), cells.v.data() + kv_row_bytes(vt, nv) * c, nv);
    }
    return cells;
}

// One token's raw q|k|v projections and q|k|v biases (host, and the biases on the device),
// the cells of earlier steps, and the RoPE table at its position (n_cells - 1): the inputs of
// the post-QKV tests.
struct PostQkvInputs {
    std::vector<float> q, k, v;
    KvCells cells;
    DeviceBuffer<int32_t> position;
    DeviceBuffer<float> bias;
    DeviceBuffer<float2> table;
};
PostQkvInputs post_qkv_inputs(std::mt19937& rng, const AttentionShape& s, KvType kt, KvType vt, uint32_t n_cells,
                              const RopeDeviceTables& rope) {
    const uint32_t qd = s.n_head * s.head_dim_k, kd = s.n_head_kv * s.head_dim_k;
    PostQkvInputs in;
    in.q = random_floats(rng, qd, 2.5f);
    in.k = random_floats(rng, kd);
    in.v = random_floats(rng, kd);
    in.bias = to_device(random_floats(rng, qd + 2 * kd, 0.5f));
    in.cells = random_cells(rng, s, kt, vt, n_cells);
    in.position = to_device(std::vector<int32_t>{(int32_t)(n_cells - 1)});
    in.table = DeviceBuffer<float2>(s.head_dim_k / 2);
    rope_table_cuda(rope, in.position.data(), 1, in.table.data(), nullptr);
    return in;
}

int sm_count() {
    int n = 0;
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
}

struct GpuPartial {
    std::vector<float> out, lse;
};

// One attention call's outputs on the device: out and lse, and the int16 copy of out with its
// scales, all poisoned, so that a value the kernel does not write shows.
struct PoisonedOutputs {
    DeviceBuffer<float> out, lse, od;
    DeviceBuffer<int16_t> oq;
    PoisonedOutputs(size_t n_out, uint32_t n_head) : out(n_out), lse(n_head), od(n_out / 32), oq(n_out) {
        poison(out);
        poison(lse);
        poison(oq);
        poison(od);
    }
    ActQ16 q16() { return ActQ16{oq.data(), od.data()}; }
};

// kernel == nullptr: attention_partial_cuda's own choice (attention_default_kernel).
GpuPartial run_gpu(const AttentionShape& s, const std::vector<float>& q, KvType kt, const uint8_t* k,
                   KvType vt, const uint8_t* v, uint32_t n_cells, uint32_t n_k_bytes, uint32_t n_v_bytes,
                   const AttentionKernel* kernel = nullptr) {
    auto d_q = to_device(q);
    DeviceBuffer<uint8_t> d_k(std::max(1u, n_k_bytes)), d_v(std::max(1u, n_v_bytes));
    if (n_k_bytes) SPILLWAY_CUDA_CHECK(cudaMemcpy(d_k.data(), k, n_k_bytes, cudaMemcpyHostToDevice));
    if (n_v_bytes) SPILLWAY_CUDA_CHECK(cudaMemcpy(d_v.data(), v, n_v_bytes, cudaMemcpyHostToDevice));
    const size_t n_out = (size_t)s.n_head * s.head_dim_v;
    // The output quantized for the Q8_0 output projection, asked for in every run: written by
    // the split merge (several splits), the attention kernel itself (one split) or the
    // quantize kernel (no cells).
    PoisonedOutputs o(n_out, s.n_head);
    const uint32_t sms = sm_count();
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, attention_workspace_bytes(s, n_cells, sms)));
    if (kernel)
        attention_partial_cuda_with(*kernel, s, d_q.data(), kt, d_k.data(), vt, d_v.data(), n_cells, o.out.data(),
                                    o.lse.data(), ws.data(), ws.bytes(), sms, nullptr, o.q16());
    else
        attention_partial_cuda(s, d_q.data(), kt, d_k.data(), vt, d_v.data(), n_cells, o.out.data(), o.lse.data(),
                               ws.data(), ws.bytes(), sms, nullptr, o.q16());
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    GpuPartial result{to_host(o.out), to_host(o.lse)};
    // Bit for bit the host twin's quantization of the GPU's own f32 output.
    const HostActQ16 want = quantize_act_q16_host(result.out);
    const std::vector<int16_t> got_q = to_host(o.oq);
    const std::vector<float> got_d = to_host(o.od);
    size_t bad = 0;
    for (size_t i = 0; i < n_out; ++i) bad += got_q[i] != want.q[i];
    for (size_t b = 0; b < n_out / 32; ++b) bad += !(got_d[b] == want.d[b]);
    EXPECT_EQ(bad, 0u) << "quantized output differs from the host twin (" << n_cells << " cells)";
    return result;
}

void expect_close(const GpuPartial& gpu, const std::vector<float>& out, const std::vector<float>& lse) {
    EXPECT_EQ(count_nan(gpu.out), 0u);
    const double err = rel_error(gpu.out, out);
    EXPECT_LT(err, kOutTolerance) << "output relative error " << err;
    double worst = 0.0;
    for (size_t h = 0; h < lse.size(); ++h) worst = std::max(worst, std::fabs((double)gpu.lse[h] - lse[h]));
    EXPECT_LT(worst, kLseTolerance) << "worst lse error " << worst;
}

void check_attention(const AttentionShape& s, KvType kt, KvType vt, uint32_t n_cells,
                     const AttentionKernel* kernel = nullptr) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE(std::string(kernel ? kernel_name(*kernel) : "") +
                 "K " + kv_type_name(kt) + " V " + kv_type_name(vt) + " heads " +
                 std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " dim " + std::to_string(s.head_dim_k) +
                 " cells " + std::to_string(n_cells) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    // q scaled up so the softmax is peaked (scores of several units), not nearly uniform.
    const auto q = random_floats(rng, (size_t)s.n_head * s.head_dim_k, 2.5f);
    const KvCells cells = random_cells(rng, s, kt, vt, n_cells);
    std::vector<float> out((size_t)s.n_head * s.head_dim_v), lse(s.n_head);
    attention_partial_cpu(s, q.data(), kt, cells.k.data(), vt, cells.v.data(), n_cells, out.data(), lse.data());
    const uint32_t k_bytes = kv_row_bytes(kt, s.n_head_kv * s.head_dim_k) * n_cells;
    const uint32_t v_bytes = kv_row_bytes(vt, s.n_head_kv * s.head_dim_v) * n_cells;
    expect_close(run_gpu(s, q, kt, cells.k.data(), vt, cells.v.data(), n_cells, k_bytes, v_bytes, kernel), out, lse);
}

AttentionShape make_shape(uint32_t n_head, uint32_t n_head_kv, uint32_t dim) {
    return {n_head, n_head_kv, dim, dim, 1.0f / std::sqrt((float)dim)};
}

constexpr KvType kTypes[] = {KvType::f16, KvType::q8_0, KvType::q4_0};

TEST(CudaAttention, MatchesCpuForEveryKvTypePair) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const AttentionShape qwen14b = make_shape(40, 8, 128);
    for (KvType kt : kTypes)
        for (KvType vt : kTypes)
            for (uint32_t n_cells : {1u, 63u, 1000u, 4099u}) check_attention(qwen14b, kt, vt, n_cells);
}

TEST(CudaAttention, MatchesCpuForOtherGqaShapes) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    // Qwen2.5-0.5B (14/2, dim 64), Llama-3-8B (32/8), no GQA (8/8), 16 heads per KV head.
    for (const AttentionShape& s : {make_shape(14, 2, 64), make_shape(32, 8, 128), make_shape(8, 8, 64),
                                    make_shape(16, 1, 128)}) {
        for (uint32_t n_cells : {7u, 700u, 3000u}) {
            check_attention(s, KvType::f16, KvType::f16, n_cells);
            check_attention(s, KvType::q8_0, KvType::q4_0, n_cells);
        }
    }
}

// Both kernels explicitly for quantized K (the default row above covers only the chosen one),
// across group sizes (5 exact, 4 and 1 padded to 4, 7 padded to 8) and chunk boundaries.
TEST(CudaAttention, IntDotAndTensorCoreKernelsMatchCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    for (AttentionKernel kernel : {AttentionKernel::int_dot, AttentionKernel::tensor_core}) {
        for (KvType kt : {KvType::q8_0, KvType::q4_0})
            for (KvType vt : kTypes)
                for (uint32_t n_cells : {1u, 31u, 33u, 129u, 4099u, 20000u})
                    check_attention(make_shape(40, 8, 128), kt, vt, n_cells, &kernel);
        for (const AttentionShape& s : {make_shape(32, 8, 128), make_shape(28, 4, 128), make_shape(8, 8, 128)})
            for (uint32_t n_cells : {7u, 700u, 3000u}) {
                check_attention(s, KvType::q8_0, KvType::q8_0, n_cells, &kernel);
                check_attention(s, KvType::q4_0, KvType::f16, n_cells, &kernel);
            }
    }
}

// The mma kernel for every K/V pair (f16 included), the group sizes it takes (5 exact-ish,
// 8 full, 1 and 4 with dead rows) and step/split boundaries (16-cell steps, 64-cell minimum
// split, a partial last step). Odd KV-head counts give cells whose slices start 8 bytes into
// a 16-byte line (the copy window's other lead).
TEST(CudaAttention, MmaKernelMatchesCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const AttentionKernel kernel = AttentionKernel::mma;
    for (KvType kt : kTypes)
        for (KvType vt : kTypes)
            for (uint32_t n_cells : {1u, 15u, 17u, 65u, 4099u, 20000u})
                check_attention(make_shape(40, 8, 128), kt, vt, n_cells, &kernel);
    for (const AttentionShape& s : {make_shape(32, 8, 128), make_shape(28, 4, 128), make_shape(8, 8, 128),
                                    make_shape(8, 1, 128), make_shape(21, 3, 128)})
        for (uint32_t n_cells : {7u, 700u, 3001u})
            for (KvType kt : kTypes) check_attention(s, kt, kt == KvType::f16 ? KvType::q4_0 : kt, n_cells, &kernel);
    // One KV head over many cells: hundreds of splits, past the merge's first 64 partials.
    check_attention(make_shape(8, 1, 128), KvType::q8_0, KvType::q8_0, 20000, &kernel);
}

// Puts the warp-specialized kernel's lab switch back to the default when a test ends, also on a
// failed assertion.
struct WsModeReset {
    ~WsModeReset() { attention_mma::lab_warp_specialized(-1, -1); }
};

// One case of CudaAttention.WarpSpecializedKernelEqualsTheSingleWarpKernel: the single-warp kernel and the variants on the same cells.
void check_warp_specialized(const AttentionShape& s, KvType kt, KvType vt, uint32_t sms, uint32_t n_cells,
                            bool q_aligned) {
    const AttentionKernel kernel = AttentionKernel::mma;
    // single-warp; 4 and 8 streams per block; 4 streams with per-block K
    constexpr int kStreams[] = {0, 4, 8, 4};
    constexpr int kBlockK[] = {0, 0, 0, 1};
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE(std::string("K ") + kv_type_name(kt) + " V " + kv_type_name(vt) + " sm_count " +
                 std::to_string(sms) + " cells " + std::to_string(n_cells) + (q_aligned ? "" : " q unaligned") +
                 " seed " + std::to_string(seed));
    attention_mma::lab_warp_specialized(0, 0);
    const uint32_t splits = attention_split_count(kernel, s, kt, vt, n_cells, sms);
    attention_mma::lab_warp_specialized(4, 0);
    ASSERT_EQ(attention_split_count(kernel, s, kt, vt, n_cells, sms), splits) << "plans differ";
    std::mt19937 rng(seed);
    const auto q = random_floats(rng, (size_t)s.n_head * s.head_dim_k, 2.5f);
    const KvCells cells = random_cells(rng, s, kt, vt, n_cells);
    // q 4 bytes off a 16-byte boundary: both kernels take their scalar Q loads.
    std::vector<float> q_host(q.size() + 1, 0.0f);
    std::copy(q.begin(), q.end(), q_host.begin() + (q_aligned ? 0 : 1));
    auto d_q_buffer = to_device(q_host);
    const float* d_q = d_q_buffer.data() + (q_aligned ? 0 : 1);
    auto d_k = to_device(cells.k);
    auto d_v = to_device(cells.v);
    const size_t n_out = (size_t)s.n_head * s.head_dim_v;
    GpuPartial got[4];
    std::vector<int16_t> got_q16[2];
    for (int m = 0; m < 4; ++m) {
        attention_mma::lab_warp_specialized(kStreams[m], kBlockK[m]);
        PoisonedOutputs o(n_out, s.n_head);
        DeviceBuffer<uint8_t> ws(std::max<size_t>(1, attention_workspace_bytes(s, n_cells, sms)));
        const uint64_t launches = attention_mma::lab_warp_specialized_launches();
        attention_partial_cuda_with(kernel, s, d_q, kt, d_k.data(), vt, d_v.data(), n_cells, o.out.data(),
                                    o.lse.data(), ws.data(), ws.bytes(), sms, nullptr, o.q16());
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(attention_mma::lab_warp_specialized_launches() - launches, m == 0 ? 0u : 1u)
            << "streams " << kStreams[m] << " block K " << kBlockK[m];
        got[m] = GpuPartial{to_host(o.out), to_host(o.lse)};
        if (m < 2) got_q16[m] = to_host(o.oq);
    }
    size_t differ = 0;
    for (size_t i = 0; i < n_out; ++i) differ += std::memcmp(&got[0].out[i], &got[1].out[i], 4) != 0;
    for (size_t h = 0; h < s.n_head; ++h) differ += std::memcmp(&got[0].lse[h], &got[1].lse[h], 4) != 0;
    EXPECT_EQ(differ, 0u) << "values of the 4-stream variant differing from the single-warp kernel";
    EXPECT_EQ(got_q16[0], got_q16[1]) << "int16 output of the 4-stream variant";
    std::vector<float> out(n_out), lse(s.n_head);
    attention_partial_cpu(s, q.data(), kt, cells.k.data(), vt, cells.v.data(), n_cells, out.data(), lse.data());
    for (int m = 1; m < 4; ++m) expect_close(got[m], out, lse);
}

// The warp-specialized variant of the mma kernel (lab: a QK warp hands each step's P^T and
// alpha to a PV warp). With 4 streams per block it runs the single-warp kernel's values in the
// same order, so with the same plan its out, lse and int16 output equal that kernel's bit for
// bit; with 8 the partial sums group differently, and with per-block K for the equal quantized
// pairs (lab) the scores are summed per K block: those match the CPU. Two plans, checked equal
// for both kernels: sm_count 1000 (one split per 64 cells: each stream runs one or two steps)
// and sm_count 1 (one split: hundreds of steps per stream, so the hand-over ring's slots,
// parities and refills and the in-loop copies all run). The launch counter shows the variant
// ran (it falls back to the single-warp kernel for f16 V, where rows are not whole 16-byte
// chunks, or without sm_90 code). One size also runs with q off a 16-byte boundary (the kernels'
// scalar Q loads).
TEST(CudaAttention, WarpSpecializedKernelEqualsTheSingleWarpKernel) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const WsModeReset reset;
    int major = 0;
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major != 9) GTEST_SKIP() << "the warp-specialized variant runs on sm_90 only";
    const char* fast_copy = std::getenv("SPILLWAY_ATTN_FAST_COPY");
    if (fast_copy != nullptr && std::string(fast_copy) == "0")
        GTEST_SKIP() << "SPILLWAY_ATTN_FAST_COPY=0 keeps the single-warp kernel";
    const AttentionShape s = make_shape(40, 8, 128);
    for (KvType kt : kTypes)
        for (KvType vt : {KvType::q8_0, KvType::q4_0})  // f16 V stays on the single-warp kernel
            for (uint32_t sms : {1000u, 1u}) {
                for (uint32_t n_cells : {1u, 15u, 17u, 65u, 4099u, 20000u})
                    check_warp_specialized(s, kt, vt, sms, n_cells, true);
                check_warp_specialized(s, kt, vt, sms, 4099, false);
            }
}

// The default's use of the warp-specialized kernel: 8 streams for q8_0 / q8_0 and q4_0 / q4_0 from
// kWarpSpecializedMinCells cells on sm_90 (unless the knobs say otherwise), the single-warp kernel
// below it and for the other pairs; a one-wave plan for its 2 blocks of 16 warps per SM; the
// launch counter follows the choice, and the output matches the CPU.
TEST(CudaAttention, WarpSpecializedDefault) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    attention_mma::lab_warp_specialized(-1, -1);
    const AttentionShape s = make_shape(40, 8, 128);
    const uint32_t sms = sm_count(), min_cells = attention_mma::kWarpSpecializedMinCells;
    int major = 0;
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    const bool knobs_unset = std::getenv("SPILLWAY_ATTN_WS") == nullptr &&
                             std::getenv("SPILLWAY_ATTN_WS_MIN_CELLS") == nullptr &&
                             std::getenv("SPILLWAY_ATTN_FAST_COPY") == nullptr;
    auto streams = [&](KvType kt, KvType vt, uint32_t n_cells) {
        return attention_mma::warp_specialized_streams(kt, vt, kv_row_bytes(kt, s.n_head_kv * s.head_dim_k),
                                                       kv_row_bytes(vt, s.n_head_kv * s.head_dim_v), n_cells);
    };
    EXPECT_EQ(streams(KvType::f16, KvType::f16, 65536), 0) << "f16 V never runs the variant";
    if (major == 9 && knobs_unset) {
        for (KvType t : {KvType::q8_0, KvType::q4_0}) {
            EXPECT_EQ(streams(t, t, min_cells), 8) << kv_type_name(t);
            EXPECT_EQ(streams(t, t, 65536), 8) << kv_type_name(t);
            EXPECT_EQ(streams(t, t, min_cells - 1), 0) << kv_type_name(t);
            // 512 threads of <= 64 registers: 2 blocks per SM, one wave.
            EXPECT_LE(attention_split_count(AttentionKernel::mma, s, t, t, 65536, sms) * s.n_head_kv,
                      2u * sms + s.n_head_kv);
        }
        EXPECT_EQ(streams(KvType::q8_0, KvType::q4_0, 65536), 0) << "mixed pairs: the single-warp kernel";
        EXPECT_EQ(streams(KvType::f16, KvType::q8_0, 65536), 0);
    }
    for (KvType t : {KvType::q8_0, KvType::q4_0})
        for (uint32_t n_cells : {min_cells - 1, min_cells + 17}) {
            const uint32_t seed = fresh_seed();
            SCOPED_TRACE(std::string("KV ") + kv_type_name(t) + " cells " + std::to_string(n_cells) + " seed " +
                         std::to_string(seed));
            std::mt19937 rng(seed);
            const auto q = random_floats(rng, (size_t)s.n_head * s.head_dim_k, 2.5f);
            const KvCells cells = random_cells(rng, s, t, t, n_cells);
            auto d_q = to_device(q);
            auto d_k = to_device(cells.k);
            auto d_v = to_device(cells.v);
            PoisonedOutputs o((size_t)s.n_head * s.head_dim_v, s.n_head);
            DeviceBuffer<uint8_t> ws(std::max<size_t>(1, attention_workspace_bytes(s, n_cells, sms)));
            const uint64_t launches = attention_mma::lab_warp_specialized_launches();
            attention_partial_cuda_with(AttentionKernel::mma, s, d_q.data(), t, d_k.data(), t, d_v.data(), n_cells,
                                        o.out.data(), o.lse.data(), ws.data(), ws.bytes(), sms, nullptr);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_EQ(attention_mma::lab_warp_specialized_launches() - launches, streams(t, t, n_cells) != 0 ? 1u : 0u);
            std::vector<float> out((size_t)s.n_head * s.head_dim_v), lse(s.n_head);
            attention_partial_cpu(s, q.data(), t, cells.k.data(), t, cells.v.data(), n_cells, out.data(), lse.data());
            expect_close(GpuPartial{to_host(o.out), to_host(o.lse)}, out, lse);
        }
}

// The decode attention launched programmatically behind the kernel that writes q and the
// step's new cell (the engine: bias + RoPE + KV write): splits of settled cells (earlier
// steps') copy before waiting for that producer, the split with the new cell after. Here the
// producer releases at entry and writes q and the last cell only after 200 us; before it,
// both hold NaN. The result must match the CPU on the final bytes for every split kernel.
// Negative control: claiming the new cell settled lets the attention read it before the
// producer wrote it, which must show (so the test sees the ordering it checks).
TEST(CudaAttention, ProgrammaticLaunchReadsTheNewCellAfterItsProducer) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    if (!pdl_site_on(PdlSite::attention)) GTEST_SKIP() << "attention not launched programmatically here";
    const AttentionShape s = make_shape(40, 8, 128);
    const uint32_t sms = sm_count();
    cudaStream_t stream = nullptr;
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (AttentionKernel kernel : {AttentionKernel::tensor_core, AttentionKernel::mma, AttentionKernel::int_dot}) {
        for (KvType kt : {KvType::f16, KvType::q8_0}) {
            if (!attention_kernel_supports(kernel, s, kt, kt)) continue;
            for (uint32_t n_cells : {40u, 5000u, 20000u}) {
                for (const bool honest : {true, false}) {
                    if (!honest && n_cells != 40) continue;  // one split: its first copies hold the new cell
                    const uint32_t seed = fresh_seed();
                    SCOPED_TRACE(std::string(kernel_name(kernel)) + kv_type_name(kt) + " cells " + std::to_string(n_cells) +
                                 (honest ? "" : " (new cell claimed settled)") + " seed " + std::to_string(seed));
                    std::mt19937 rng(seed);
                    const auto q = random_floats(rng, (size_t)s.n_head * s.head_dim_k, 2.5f);
                    const KvCells cells = random_cells(rng, s, kt, kt, n_cells);
                    std::vector<float> out((size_t)s.n_head * s.head_dim_v), lse(s.n_head);
                    attention_partial_cpu(s, q.data(), kt, cells.k.data(), kt, cells.v.data(), n_cells, out.data(),
                                          lse.data());
                    const size_t row = kv_row_bytes(kt, s.n_head_kv * s.head_dim_k), last = row * (n_cells - 1);
                    auto d_q_final = to_device(q);
                    auto d_k = to_device(cells.k), d_v = to_device(cells.v);
                    DeviceBuffer<float> d_q(q.size());
                    DeviceBuffer<uint8_t> d_new_k(row), d_new_v(row);
                    SPILLWAY_CUDA_CHECK(cudaMemcpy(d_new_k.data(), d_k.data() + last, row, cudaMemcpyDeviceToDevice));
                    SPILLWAY_CUDA_CHECK(cudaMemcpy(d_new_v.data(), d_v.data() + last, row, cudaMemcpyDeviceToDevice));
                    poison(d_q);
                    SPILLWAY_CUDA_CHECK(cudaMemset(d_k.data() + last, 0xff, row));  // NaN scales / values
                    SPILLWAY_CUDA_CHECK(cudaMemset(d_v.data() + last, 0xff, row));
                    const size_t n_out = (size_t)s.n_head * s.head_dim_v;
                    DeviceBuffer<float> d_out(n_out), d_lse(s.n_head);
                    poison(d_out);
                    poison(d_lse);
                    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, attention_workspace_bytes(s, n_cells, sms)));
                    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                    const CopyRegion regions[] = {{d_q_final.data(), d_q.data(), q.size() * sizeof(float)},
                                                  {d_new_k.data(), d_k.data() + last, row},
                                                  {d_new_v.data(), d_v.data() + last, row}};
                    launch_late_producer(regions, 3, 200, stream);
                    attention_partial_cuda_with(kernel, s, d_q.data(), kt, d_k.data(), kt, d_v.data(), n_cells,
                                                d_out.data(), d_lse.data(), ws.data(), ws.bytes(), sms, stream, {},
                                                honest ? n_cells - 1 : n_cells);
                    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
                    const GpuPartial gpu{to_host(d_out), to_host(d_lse)};
                    if (honest) expect_close(gpu, out, lse);
                    else
                        EXPECT_GT(count_nan(gpu.out), 0u) << "the early copy did not see the unwritten cell";
                }
            }
        }
    }
    SPILLWAY_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The decode step's post-QKV work inside the attention kernel (AttentionPostQkv) against its
// own launch (qkv_post_cuda, then the attention on the finished q): the same raw q|k|v, bias
// and cos / sin table give bit-identical output, lse, int16 output and cache bytes, for every
// K/V tier pair, head dims 128 and 64, with and without bias, one split and several. The
// new cell's row starts poisoned in both caches, so a copy before the write would show.
TEST(CudaAttention, PostQkvInsideTheKernelEqualsItsOwnLaunch) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t sms = sm_count();
    for (const AttentionShape& s : {make_shape(40, 8, 128), make_shape(4, 2, 64)}) {
        const uint32_t D = s.head_dim_k, qd = s.n_head * D, kd = s.n_head_kv * D;
        const TestDeviceRope rope(D);
        const RopeDeviceTables& dt = rope.tables;
        for (KvType kt : kTypes)
            for (KvType vt : kTypes)
                for (uint32_t n_cells : {1u, 40u, 1000u, 6000u})
                    for (const bool with_bias : {true, false}) {
                        if (!with_bias && n_cells != 40) continue;
                        const uint32_t seed = fresh_seed();
                        SCOPED_TRACE(std::string("K ") + kv_type_name(kt) + " V " + kv_type_name(vt) + " dim " +
                                     std::to_string(D) + " cells " + std::to_string(n_cells) +
                                     (with_bias ? " bias" : "") + " seed " + std::to_string(seed));
                        std::mt19937 rng(seed);
                        PostQkvInputs in = post_qkv_inputs(rng, s, kt, vt, n_cells, dt);
                        const auto &q = in.q, &k = in.k, &v = in.v;
                        const KvCells& cells = in.cells;
                        const size_t k_row = kv_row_bytes(kt, kd), v_row = kv_row_bytes(vt, kd);
                        const size_t n_out = (size_t)s.n_head * s.head_dim_v;
                        struct Run {
                            DeviceBuffer<float> q, k, v, out, lse, od;
                            DeviceBuffer<uint8_t> kc, vc, ws;
                            DeviceBuffer<int16_t> oq;
                        };
                        auto make_run = [&]() {
                            Run r{to_device(q), to_device(k), to_device(v), DeviceBuffer<float>(n_out),
                                  DeviceBuffer<float>(s.n_head), DeviceBuffer<float>(n_out / 32), to_device(cells.k),
                                  to_device(cells.v),
                                  DeviceBuffer<uint8_t>(std::max<size_t>(1, attention_workspace_bytes(s, n_cells, sms))),
                                  DeviceBuffer<int16_t>(n_out)};
                            SPILLWAY_CUDA_CHECK(cudaMemset(r.kc.data() + k_row * (n_cells - 1), 0xff, k_row));
                            SPILLWAY_CUDA_CHECK(cudaMemset(r.vc.data() + v_row * (n_cells - 1), 0xff, v_row));
                            poison(r.out);
                            poison(r.lse);
                            poison(r.oq);
                            poison(r.od);
                            return r;
                        };
                        Run a = make_run(), b = make_run();
                        const float* bias_ptr = with_bias ? in.bias.data() : nullptr;
                        qkv_post_cuda(QkvPostShape{s.n_head, s.n_head_kv, D}, dt, a.q.data(), a.k.data(), a.v.data(),
                                      bias_ptr, 1, in.position.data(), kt, a.kc.data(), vt, a.vc.data(), n_cells - 1, nullptr,
                                      in.table.data());
                        attention_partial_cuda_with(AttentionKernel::tensor_core, s, a.q.data(), kt, a.kc.data(), vt,
                                                    a.vc.data(), n_cells, a.out.data(), a.lse.data(), a.ws.data(),
                                                    a.ws.bytes(), sms, nullptr, ActQ16{a.oq.data(), a.od.data()},
                                                    n_cells - 1);
                        AttentionPostQkv post;
                        post.rope_table = in.table.data();
                        post.rope_dims = D;
                        post.rope_neox = true;
                        post.bias = bias_ptr;
                        post.new_k = b.k.data();
                        post.new_v = b.v.data();
                        post.k_cache = b.kc.data();
                        post.v_cache = b.vc.data();
                        attention_partial_cuda_with(AttentionKernel::tensor_core, s, b.q.data(), kt, b.kc.data(), vt,
                                                    b.vc.data(), n_cells, b.out.data(), b.lse.data(), b.ws.data(),
                                                    b.ws.bytes(), sms, nullptr, ActQ16{b.oq.data(), b.od.data()},
                                                    n_cells - 1, &post);
                        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                        const std::vector<float> out_a = to_host(a.out), out_b = to_host(b.out);
                        EXPECT_EQ(count_nan(out_a), 0u);
                        EXPECT_TRUE(std::equal(out_a.begin(), out_a.end(), out_b.begin())) << "output";
                        EXPECT_EQ(to_host(a.lse), to_host(b.lse)) << "lse";
                        EXPECT_EQ(to_host(a.oq), to_host(b.oq)) << "int16 output";
                        EXPECT_EQ(to_host(a.od), to_host(b.od)) << "int16 output scales";
                        EXPECT_EQ(to_host(a.kc), to_host(b.kc)) << "K cache bytes";
                        EXPECT_EQ(to_host(a.vc), to_host(b.vc)) << "V cache bytes";
                        EXPECT_EQ(to_host(b.q), q) << "raw q changed: the kernel must only read it";
                    }
    }
}

// The short-context kernel (attention_short.cuh) against the launches it replaces: the new
// cell's cache bytes equal qkv_post_cuda's; the output and lse match the CPU attention over the
// cache qkv_post wrote, with the q it rotated (kOutTolerance / kLseTolerance); the int16 copy
// is the host twin's quantization of the kernel's own f32 output. Every tier pair, GQA groups
// of 5, 7 and 1, NeoX over the whole head and over its first 64 dims, adjacent pairs, with and
// without biases, 1 .. 128 cells; the settled cells stay as they were.
TEST(CudaAttention, ShortContextKernelMatchesPostQkvAndCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    struct RopeCase {
        bool neox;
        uint32_t n_dims;
    };
    for (const AttentionShape& s : {make_shape(40, 8, 128), make_shape(28, 4, 128), make_shape(8, 8, 128)}) {
        const uint32_t D = s.head_dim_k, qd = s.n_head * D, kd = s.n_head_kv * D;
        for (const RopeCase rc : {RopeCase{true, 128}, RopeCase{true, 64}, RopeCase{false, 128}}) {
            if (s.n_head != 40 && !(rc.neox && rc.n_dims == 128)) continue;
            const TestDeviceRope rope(D, rc.neox, rc.n_dims);
            const RopeDeviceTables& dt = rope.tables;
            for (KvType kt : kTypes)
                for (KvType vt : kTypes)
                    for (uint32_t n_cells : {1u, 2u, 17u, 64u, 100u, 128u})
                        for (const bool with_bias : {true, false}) {
                            if (!with_bias && n_cells != 17) continue;
                            if (s.n_head != 40 && kt != vt) continue;
                            const uint32_t seed = fresh_seed();
                            SCOPED_TRACE(std::string("K ") + kv_type_name(kt) + " V " + kv_type_name(vt) + " heads " +
                                         std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " rope " +
                                         (rc.neox ? "neox " : "normal ") + std::to_string(rc.n_dims) + " cells " +
                                         std::to_string(n_cells) + (with_bias ? " bias" : "") + " seed " +
                                         std::to_string(seed));
                            ASSERT_TRUE(attention_short_fits(s, n_cells));
                            std::mt19937 rng(seed);
                            PostQkvInputs in = post_qkv_inputs(rng, s, kt, vt, n_cells, dt);
                            const auto &q = in.q, &k = in.k, &v = in.v;
                            const KvCells& cells = in.cells;
                            const float* bias_ptr = with_bias ? in.bias.data() : nullptr;
                            const size_t k_row = kv_row_bytes(kt, kd), v_row = kv_row_bytes(vt, kd);
                            const size_t n_out = (size_t)s.n_head * D;
                            // Reference: qkv_post on copies (its q, and the cache it writes).
                            auto rq = to_device(q), rk = to_device(k), rv = to_device(v);
                            auto rkc = to_device(cells.k), rvc = to_device(cells.v);
                            qkv_post_cuda(QkvPostShape{s.n_head, s.n_head_kv, D}, dt, rq.data(), rk.data(), rv.data(),
                                          bias_ptr, 1, in.position.data(), kt, rkc.data(), vt, rvc.data(), n_cells - 1,
                                          nullptr, in.table.data());
                            // The kernel: the new cell's bytes poisoned first (NaN scales / values).
                            auto dq = to_device(q), dk = to_device(k), dv = to_device(v);
                            auto kc = to_device(cells.k), vc = to_device(cells.v);
                            SPILLWAY_CUDA_CHECK(cudaMemset(kc.data() + k_row * (n_cells - 1), 0xff, k_row));
                            SPILLWAY_CUDA_CHECK(cudaMemset(vc.data() + v_row * (n_cells - 1), 0xff, v_row));
                            PoisonedOutputs o(n_out, s.n_head);
                            ShortAttentionArgs a;
                            a.q = dq.data(), a.k = dk.data(), a.v = dv.data(), a.bias = bias_ptr;
                            a.rope_table = in.table.data(), a.rope_dims = dt.n_dims, a.rope_neox = dt.neox;
                            a.k_cache = kc.data(), a.v_cache = vc.data(), a.n_cells = n_cells;
                            a.out = o.out.data(), a.lse = o.lse.data(), a.out_q16 = o.q16();
                            attention_short_cuda(s, kt, vt, a, nullptr);
                            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
                            const auto got_kc = to_host(kc), got_vc = to_host(vc);
                            EXPECT_EQ(got_kc, to_host(rkc)) << "K cache bytes";
                            EXPECT_EQ(got_vc, to_host(rvc)) << "V cache bytes";
                            EXPECT_EQ(to_host(dq), q) << "raw q changed: the kernel must only read it";
                            // CPU attention over the reference cache, with the rotated q.
                            const auto q_rot = to_host(rq);
                            std::vector<float> ref_out(n_out), ref_lse(s.n_head);
                            const auto ref_kc = to_host(rkc), ref_vc = to_host(rvc);
                            attention_partial_cpu(s, q_rot.data(), kt, ref_kc.data(), vt, ref_vc.data(), n_cells,
                                                  ref_out.data(), ref_lse.data());
                            const GpuPartial got{to_host(o.out), to_host(o.lse)};
                            expect_close(got, ref_out, ref_lse);
                            const HostActQ16 want = quantize_act_q16_host(got.out);
                            EXPECT_EQ(to_host(o.oq), want.q) << "int16 output";
                            const auto got_d = to_host(o.od);
                            size_t bad_d = 0;
                            for (size_t b = 0; b < want.d.size(); ++b) bad_d += !(got_d[b] == want.d[b]);
                            EXPECT_EQ(bad_d, 0u) << "int16 output scales";
                        }
        }
    }
    // Outside what it takes: refused in words.
    EXPECT_FALSE(attention_short_fits(make_shape(40, 8, 128), 0));
    EXPECT_FALSE(attention_short_fits(make_shape(40, 8, 128), kShortAttentionMaxCells + 1));
    EXPECT_FALSE(attention_short_fits(make_shape(14, 2, 64), 10));
}

TEST(CudaAttention, DefaultKernelChoice) {
    const AttentionShape s = make_shape(40, 8, 128);
    EXPECT_EQ(attention_default_kernel(s, KvType::q8_0, KvType::q8_0), AttentionKernel::mma);
    EXPECT_EQ(attention_default_kernel(s, KvType::q4_0, KvType::f16), AttentionKernel::mma);
    EXPECT_EQ(attention_default_kernel(s, KvType::f16, KvType::q8_0), AttentionKernel::mma);
    EXPECT_EQ(attention_default_kernel(s, KvType::f16, KvType::f16, 65536), AttentionKernel::mma);
    // Short ranges keep the kernels measured faster there.
    EXPECT_EQ(attention_default_kernel(s, KvType::q8_0, KvType::q8_0, 1000), AttentionKernel::int_dot);
    EXPECT_EQ(attention_default_kernel(s, KvType::f16, KvType::f16, 8192), AttentionKernel::tensor_core);
    for (KvType t : {KvType::q8_0, KvType::q4_0}) {
        EXPECT_EQ(attention_default_kernel(s, t, t, kAttentionMmaMinCellsEqualQuantized), AttentionKernel::mma);
        EXPECT_EQ(attention_default_kernel(s, t, t, kAttentionMmaMinCellsEqualQuantized - 1), AttentionKernel::int_dot);
    }
    EXPECT_EQ(attention_default_kernel(s, KvType::q8_0, KvType::q4_0, kAttentionMmaMinCellsQ4V), AttentionKernel::mma);
    EXPECT_EQ(attention_default_kernel(s, KvType::q8_0, KvType::q4_0, kAttentionMmaMinCellsQ4V - 1), AttentionKernel::int_dot);
    EXPECT_EQ(attention_default_kernel(s, KvType::q4_0, KvType::q8_0, kAttentionMmaMinCellsQ8V), AttentionKernel::mma);
    EXPECT_EQ(attention_default_kernel(s, KvType::q4_0, KvType::q8_0, kAttentionMmaMinCellsQ4V), AttentionKernel::int_dot);
    EXPECT_EQ(attention_default_kernel(s, KvType::q4_0, KvType::f16, kAttentionMmaMinCellsQ8V), AttentionKernel::int_dot);
    EXPECT_EQ(attention_default_kernel(s, KvType::q4_0, KvType::f16, kAttentionMmaMinCellsQuantizedKF16V), AttentionKernel::mma);
    // The single-warp kernel: quantized K with q4_0 V plans half the blocks up to 16k cells, the
    // other pairs all that fit (the warp-specialized default: CudaAttention.WarpSpecializedDefault).
    const WsModeReset reset;
    attention_mma::lab_warp_specialized(0, 0);
    EXPECT_LE(attention_split_count(AttentionKernel::mma, s, KvType::q4_0, KvType::q4_0, 16384, 132) * s.n_head_kv,
              2u * 132 + s.n_head_kv);
    EXPECT_LE(attention_split_count(AttentionKernel::mma, s, KvType::q8_0, KvType::q4_0, 16384, 132) * s.n_head_kv,
              2u * 132 + s.n_head_kv);
    EXPECT_GT(attention_split_count(AttentionKernel::mma, s, KvType::q4_0, KvType::q4_0, 16385, 132) * s.n_head_kv,
              2u * 132 + s.n_head_kv);
    EXPECT_GT(attention_split_count(AttentionKernel::mma, s, KvType::q8_0, KvType::q8_0, 16384, 132) * s.n_head_kv,
              2u * 132 + s.n_head_kv);
    attention_mma::lab_warp_specialized(-1, -1);
    EXPECT_EQ(attention_default_kernel(s, KvType::q8_0, KvType::f16, 12288), AttentionKernel::mma);
    EXPECT_EQ(attention_default_kernel(s, KvType::f16, KvType::f16, 12288), AttentionKernel::tensor_core);
    EXPECT_EQ(attention_default_kernel(s, KvType::f16, KvType::q4_0, kAttentionMmaMinCellsF16KQuantizedV - 1),
              AttentionKernel::tensor_core);
    EXPECT_EQ(attention_default_kernel(s, KvType::f16, KvType::q8_0, kAttentionMmaMinCellsF16KQuantizedV), AttentionKernel::mma);
    EXPECT_EQ(attention_default_kernel(s, KvType::f16, KvType::f16, kAttentionMmaMinCellsF16KQuantizedV),
              AttentionKernel::tensor_core);
    EXPECT_EQ(attention_default_kernel(s, KvType::f16, KvType::f16, kAttentionMmaMinCells), AttentionKernel::mma);
    EXPECT_EQ(attention_default_kernel(make_shape(14, 2, 64), KvType::q8_0, KvType::q8_0), AttentionKernel::tensor_core);
    EXPECT_EQ(attention_default_kernel(make_shape(16, 1, 128), KvType::q8_0, KvType::q8_0), AttentionKernel::tensor_core);
    // One wave of blocks at most (mma: its resident blocks, 4 per SM or 5 for q8_0 / q8_0;
    // int_dot: <= 3), one split for one cell, and the shared workspace covers each kernel's splits.
    EXPECT_EQ(attention_mma::resident_blocks_per_sm(KvType::q8_0, KvType::q8_0), 5u);
    EXPECT_EQ(attention_mma::resident_blocks_per_sm(KvType::q4_0, KvType::q4_0), 4u);
    for (AttentionKernel kernel : {AttentionKernel::mma, AttentionKernel::int_dot})
        for (KvType kt : kTypes)
            for (KvType vt : kTypes) {
                if (!attention_kernel_supports(kernel, s, kt, vt)) continue;  // int_dot: quantized K only
                const uint32_t blocks_per_sm =
                    kernel == AttentionKernel::mma ? attention_mma::resident_blocks_per_sm(kt, vt) : 3u;
                EXPECT_LE(blocks_per_sm, 5u);
                EXPECT_EQ(attention_split_count(kernel, s, kt, vt, 1, 132), 1u);
                const uint32_t n = attention_split_count(kernel, s, kt, vt, 65536, 132);
                EXPECT_LE(n * s.n_head_kv, blocks_per_sm * 132 + s.n_head_kv);
                EXPECT_GE(attention_workspace_bytes(s, 65536, 132), (size_t)n * s.n_head * (s.head_dim_v + 1) * 4);
            }
    EXPECT_FALSE(attention_kernel_supports(AttentionKernel::int_dot, s, KvType::f16, KvType::f16));
}

TEST(CudaAttention, EmptyRangeIsTheMergeIdentity) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const AttentionShape s = make_shape(40, 8, 128);
    const std::vector<float> q((size_t)s.n_head * s.head_dim_k, 1.0f);
    const GpuPartial gpu = run_gpu(s, q, KvType::f16, nullptr, KvType::f16, nullptr, 0, 0, 0);
    for (float v : gpu.out) ASSERT_EQ(v, 0.0f);
    for (float l : gpu.lse) ASSERT_EQ(l, -std::numeric_limits<float>::infinity());
}

// A resident range and a tail range attended separately and merged on the GPU equal one
// pass over all cells: the split the spill path relies on.
TEST(CudaAttention, MergedPartialsEqualOnePass) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const AttentionShape s = make_shape(40, 8, 128);
    for (KvType kt : kTypes) {
        const uint32_t seed = fresh_seed();
        SCOPED_TRACE(std::string("K/V ") + kv_type_name(kt) + " seed " + std::to_string(seed));
        std::mt19937 rng(seed);
        const uint32_t n_cells = 3000, split = 1234;
        const auto q = random_floats(rng, (size_t)s.n_head * s.head_dim_k, 2.5f);
        const KvCells cells = random_cells(rng, s, kt, kt, n_cells);
        std::vector<float> out((size_t)s.n_head * s.head_dim_v), lse(s.n_head);
        attention_partial_cpu(s, q.data(), kt, cells.k.data(), kt, cells.v.data(), n_cells, out.data(), lse.data());

        const uint64_t krow = kv_row_bytes(kt, s.n_head_kv * s.head_dim_k);
        const uint64_t vrow = kv_row_bytes(kt, s.n_head_kv * s.head_dim_v);
        const GpuPartial a = run_gpu(s, q, kt, cells.k.data(), kt, cells.v.data(), split, krow * split, vrow * split);
        const GpuPartial b = run_gpu(s, q, kt, cells.k.data() + krow * split, kt, cells.v.data() + vrow * split,
                                     n_cells - split, krow * (n_cells - split), vrow * (n_cells - split));
        auto d_out_a = to_device(a.out), d_lse_a = to_device(a.lse);
        auto d_out_b = to_device(b.out), d_lse_b = to_device(b.lse);
        attention_merge_cuda(s.n_head, s.head_dim_v, d_out_a.data(), d_lse_a.data(), d_out_b.data(), d_lse_b.data(), nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        expect_close({to_host(d_out_a), to_host(d_lse_a)}, out, lse);
    }
}

TEST(CudaAttention, SplitCountIsBoundedByTiles) {
    const AttentionShape s = make_shape(40, 8, 128);
    EXPECT_EQ(attention_split_count(s, 0, 132), 0u);
    EXPECT_EQ(attention_split_count(s, 1, 132), 1u);
    EXPECT_EQ(attention_split_count(s, 64, 132), 1u);
    EXPECT_LE(attention_split_count(s, 65536, 132) * s.n_head_kv, 2u * 132 + s.n_head_kv);
    EXPECT_EQ(attention_workspace_bytes(s, 64, 132), 0u);
}

}  // namespace
}  // namespace spillway
