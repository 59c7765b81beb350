// The fused post-QKV kernel (bias + RoPE + K/V write) vs the CPU: q, k, v after bias and
// RoPE within 1e-5 relative (rope_cpu's float math; only sincos ulps differ), and the cache
// bytes equal the CPU codec's bytes of the GPU's own K/V rows (same IEEE rounding as
// kv_write_cuda). Cells outside the written ones stay untouched.
#include "cuda_test_util.h"
#include "engine/cpu/rope.h"
#include "engine/cuda/qkv_post.cuh"
#include "engine/cuda/rope.cuh"
#include "kv/kv_codec.h"

namespace spillway {
namespace {

using namespace cuda_test;

struct PostCase {
    uint32_t n_head, n_head_kv, head_dim, n_tokens;
    RopeSpec rope;
    bool bias;
    KvType k_type, v_type;
    bool write_cache;
    uint32_t max_token_blocks = 0;  // 0: one block per token; else blocks loop over tokens
};

void check_post(PostCase c) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("token blocks " + std::to_string(c.max_token_blocks) + " heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " dim " +
                 std::to_string(c.head_dim) + " tokens " + std::to_string(c.n_tokens) + " K " + kv_type_name(c.k_type) +
                 " V " + kv_type_name(c.v_type) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    if (c.rope.n_dims == 0) c.rope.n_dims = c.head_dim;
    const RopeTables tables = make_rope_tables(c.rope, c.head_dim);
    const uint32_t qd = c.n_head * c.head_dim, kd = c.n_head_kv * c.head_dim, T = c.n_tokens;
    auto q = random_floats(rng, (size_t)T * qd), k = random_floats(rng, (size_t)T * kd), v = random_floats(rng, (size_t)T * kd);
    const auto bias = random_floats(rng, qd + 2 * kd, 0.5f);
    std::vector<int32_t> positions(T);
    for (uint32_t t = 0; t < T; ++t) positions[t] = (int32_t)(rng() % 140000);
    const uint32_t first = 2, n_cells = first + T + 2;
    const uint64_t k_row = kv_row_bytes(c.k_type, kd), v_row = kv_row_bytes(c.v_type, kd);

    auto d_q = to_device(q), d_k = to_device(k), d_v = to_device(v), d_bias = to_device(bias);
    auto d_pos = to_device(positions);
    auto d_inv = to_device(tables.inv_freq);
    auto d_mix = to_device(tables.ramp_mix);
    DeviceBuffer<uint8_t> d_kc(k_row * n_cells), d_vc(v_row * n_cells);
    poison(d_kc);
    poison(d_vc);
    RopeDeviceTables dt;
    dt.neox = tables.type == RopeType::neox;
    dt.n_dims = tables.n_dims;
    dt.inv_freq = d_inv.data();
    dt.ramp_mix = d_mix.data();
    dt.freq_scale = tables.freq_scale;
    dt.mscale = tables.mscale;
    // The same inputs again, with cos / sin from the forward's table (rope_table_cuda): bit
    // for bit the same q, k, v and cache bytes.
    auto t_q = to_device(q), t_k = to_device(k), t_v = to_device(v);
    DeviceBuffer<uint8_t> t_kc(k_row * n_cells), t_vc(v_row * n_cells);
    DeviceBuffer<float2> table((size_t)T * (tables.n_dims / 2));
    poison(t_kc);
    poison(t_vc);
    poison(table);
    qkv_post_cuda(QkvPostShape{c.n_head, c.n_head_kv, c.head_dim}, dt, d_q.data(), d_k.data(), d_v.data(),
                  c.bias ? d_bias.data() : nullptr, T, d_pos.data(), c.k_type, c.write_cache ? d_kc.data() : nullptr,
                  c.v_type, c.write_cache ? d_vc.data() : nullptr, first, nullptr, nullptr, c.max_token_blocks);
    rope_table_cuda(dt, d_pos.data(), T, table.data(), nullptr);
    qkv_post_cuda(QkvPostShape{c.n_head, c.n_head_kv, c.head_dim}, dt, t_q.data(), t_k.data(), t_v.data(),
                  c.bias ? d_bias.data() : nullptr, T, d_pos.data(), c.k_type, c.write_cache ? t_kc.data() : nullptr,
                  c.v_type, c.write_cache ? t_vc.data() : nullptr, first, nullptr, table.data(), c.max_token_blocks);
    // And through the block kernel (the default runs the warp kernel for chunks), and the warp
    // kernel forced (one token: one warp per block): the same bits.
    auto b_q = to_device(q), b_k = to_device(k), b_v = to_device(v);
    DeviceBuffer<uint8_t> b_kc(k_row * n_cells), b_vc(v_row * n_cells);
    poison(b_kc);
    poison(b_vc);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());  // poison runs on the legacy stream
    qkv_post_cuda(QkvPostShape{c.n_head, c.n_head_kv, c.head_dim}, dt, b_q.data(), b_k.data(), b_v.data(),
                  c.bias ? d_bias.data() : nullptr, T, d_pos.data(), c.k_type, c.write_cache ? b_kc.data() : nullptr,
                  c.v_type, c.write_cache ? b_vc.data() : nullptr, first, nullptr, table.data(), c.max_token_blocks,
                  QkvPostKernel::block);
    auto w_q = to_device(q), w_k = to_device(k), w_v = to_device(v);
    DeviceBuffer<uint8_t> w_kc(k_row * n_cells), w_vc(v_row * n_cells);
    poison(w_kc);
    poison(w_vc);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    qkv_post_cuda(QkvPostShape{c.n_head, c.n_head_kv, c.head_dim}, dt, w_q.data(), w_k.data(), w_v.data(),
                  c.bias ? d_bias.data() : nullptr, T, d_pos.data(), c.k_type, c.write_cache ? w_kc.data() : nullptr,
                  c.v_type, c.write_cache ? w_vc.data() : nullptr, first, nullptr, table.data(), c.max_token_blocks,
                  QkvPostKernel::warp);
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    SCOPED_TRACE(qkv_post_warp_fits(QkvPostShape{c.n_head, c.n_head_kv, c.head_dim}, dt) ? "warp kernel vs block"
                                                                                          : "block kernel only");
    EXPECT_EQ(to_host(b_q), to_host(t_q)) << "q, block kernel";
    EXPECT_EQ(to_host(b_k), to_host(t_k)) << "k, block kernel";
    EXPECT_EQ(to_host(b_v), to_host(t_v)) << "v, block kernel";
    EXPECT_EQ(to_host(b_kc), to_host(t_kc)) << "K cache, block kernel";
    EXPECT_EQ(to_host(b_vc), to_host(t_vc)) << "V cache, block kernel";
    EXPECT_EQ(to_host(w_q), to_host(b_q)) << "q, warp kernel forced";
    EXPECT_EQ(to_host(w_k), to_host(b_k)) << "k, warp kernel forced";
    EXPECT_EQ(to_host(w_v), to_host(b_v)) << "v, warp kernel forced";
    EXPECT_EQ(to_host(w_kc), to_host(b_kc)) << "K cache, warp kernel forced";
    EXPECT_EQ(to_host(w_vc), to_host(b_vc)) << "V cache, warp kernel forced";
    EXPECT_EQ(to_host(t_q), to_host(d_q)) << "q with the cos/sin table";
    EXPECT_EQ(to_host(t_k), to_host(d_k)) << "k with the cos/sin table";
    EXPECT_EQ(to_host(t_v), to_host(d_v)) << "v with the cos/sin table";
    EXPECT_EQ(to_host(t_kc), to_host(d_kc)) << "K cache with the cos/sin table";
    EXPECT_EQ(to_host(t_vc), to_host(d_vc)) << "V cache with the cos/sin table";

    for (uint32_t t = 0; t < T; ++t) {
        float* qt = q.data() + (size_t)t * qd;
        float* kt = k.data() + (size_t)t * kd;
        float* vt = v.data() + (size_t)t * kd;
        if (c.bias) {
            for (uint32_t i = 0; i < qd; ++i) qt[i] += bias[i];
            for (uint32_t i = 0; i < kd; ++i) kt[i] += bias[qd + i];
            for (uint32_t i = 0; i < kd; ++i) vt[i] += bias[qd + kd + i];
        }
        rope_cpu(tables, qt, c.n_head, c.head_dim, (uint32_t)positions[t]);
        rope_cpu(tables, kt, c.n_head_kv, c.head_dim, (uint32_t)positions[t]);
    }
    const auto got_q = to_host(d_q), got_k = to_host(d_k), got_v = to_host(d_v);
    EXPECT_LT(rel_error(got_q, q), 1e-5);
    EXPECT_LT(rel_error(got_k, k), 1e-5);
    EXPECT_LT(rel_error(got_v, v), 1e-6);
    const auto kc = to_host(d_kc), vc = to_host(d_vc);
    if (!c.write_cache) {
        for (uint8_t b : kc) ASSERT_EQ(b, 0xFF);
        for (uint8_t b : vc) ASSERT_EQ(b, 0xFF);
        return;
    }
    std::vector<uint8_t> ref_k(k_row), ref_v(v_row);
    size_t mismatches = 0;
    for (uint32_t t = 0; t < T; ++t) {
        kv_store_row(c.k_type, got_k.data() + (size_t)t * kd, ref_k.data(), kd);
        kv_store_row(c.v_type, got_v.data() + (size_t)t * kd, ref_v.data(), kd);
        for (uint64_t i = 0; i < k_row; ++i) mismatches += kc[(first + t) * k_row + i] != ref_k[i];
        for (uint64_t i = 0; i < v_row; ++i) mismatches += vc[(first + t) * v_row + i] != ref_v[i];
    }
    EXPECT_EQ(mismatches, 0u);
    for (uint64_t i = 0; i < first * k_row; ++i) ASSERT_EQ(kc[i], 0xFF);
    for (uint64_t i = (first + T) * k_row; i < n_cells * k_row; ++i) ASSERT_EQ(kc[i], 0xFF);
    for (uint64_t i = 0; i < first * v_row; ++i) ASSERT_EQ(vc[i], 0xFF);
    for (uint64_t i = (first + T) * v_row; i < n_cells * v_row; ++i) ASSERT_EQ(vc[i], 0xFF);
}

TEST(CudaQkvPost, MatchesBiasRopeAndKvWriteOnTheCpu) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    RopeSpec neox;
    neox.type = RopeType::neox;
    neox.freq_base = 1000000.0f;
    RopeSpec yarn = neox;
    yarn.scaling = RopeScaling::yarn;
    yarn.scaling_factor = 4.0f;
    yarn.original_context = 32768;
    RopeSpec normal;
    normal.freq_base = 500000.0f;
    RopeSpec partial = neox;
    partial.n_dims = 32;
    for (KvType kt : {KvType::f16, KvType::q8_0, KvType::q4_0})
        for (KvType vt : {KvType::f16, KvType::q8_0, KvType::q4_0})
            check_post({40, 8, 128, 1, neox, true, kt, vt, true});  // the Qwen2.5-14B decode step
    check_post({4, 2, 64, 3, yarn, true, KvType::q8_0, KvType::q4_0, true});
    check_post({6, 3, 64, 2, normal, false, KvType::f16, KvType::q8_0, true});
    check_post({4, 4, 64, 1, partial, true, KvType::q4_0, KvType::f16, true});
    check_post({40, 8, 128, 1, neox, true, KvType::q8_0, KvType::q8_0, false});  // bias + RoPE only
    check_post({40, 8, 128, 37, neox, true, KvType::f16, KvType::f16, true});    // a prefill chunk
    check_post({8, 2, 128, 19, yarn, true, KvType::q8_0, KvType::q8_0, true});
    // Blocks looping over tokens (the prefill variant): 300 tokens on 64 blocks per head, 19 on 4.
    check_post({40, 8, 128, 300, neox, true, KvType::q8_0, KvType::q4_0, true, 64});
    check_post({8, 2, 128, 19, yarn, false, KvType::f16, KvType::q8_0, true, 4});
    // A 2048-token chunk of the 14B shape (the block kernel as the prefill ran it), head dim
    // 256, and NeoX over half of a 128-dim head (whole 32-value groups: the warp kernel).
    check_post({40, 8, 128, 2048, neox, true, KvType::q4_0, KvType::q8_0, true, 256});
    check_post({4, 2, 256, 9, neox, true, KvType::q8_0, KvType::f16, true});
    RopeSpec half_neox = neox;
    half_neox.n_dims = 64;
    check_post({4, 2, 128, 5, half_neox, true, KvType::f16, KvType::q4_0, true});
    check_post({4, 2, 128, 5, normal, true, KvType::q4_0, KvType::q4_0, false});
    // The warp kernel's fit: NeoX pairs must not cross 32-value groups (partial is 16 apart).
    RopeDeviceTables t;
    t.neox = true;
    t.n_dims = 32;
    EXPECT_FALSE(qkv_post_warp_fits(QkvPostShape{4, 4, 64}, t));
    t.n_dims = 64;
    EXPECT_TRUE(qkv_post_warp_fits(QkvPostShape{4, 4, 64}, t));
    EXPECT_FALSE(qkv_post_warp_fits(QkvPostShape{4, 4, 96}, t));
    t.neox = false;
    t.n_dims = 32;
    EXPECT_TRUE(qkv_post_warp_fits(QkvPostShape{4, 4, 128}, t));
}

TEST(CudaQkvPost, RejectsBadShapes) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    DeviceBuffer<float> buf(4096);
    DeviceBuffer<double> inv(64);
    DeviceBuffer<int32_t> pos(1);
    RopeDeviceTables dt;
    dt.n_dims = 128;
    dt.inv_freq = inv.data();
    EXPECT_THROW(qkv_post_cuda(QkvPostShape{4, 2, 100}, dt, buf.data(), buf.data(), buf.data(), nullptr, 1, pos.data(),
                               KvType::f16, nullptr, KvType::f16, nullptr, 0, nullptr), Error);
    EXPECT_THROW(qkv_post_cuda(QkvPostShape{4, 2, 64}, dt, buf.data(), buf.data(), buf.data(), nullptr, 1, pos.data(),
                               KvType::f16, nullptr, KvType::f16, nullptr, 0, nullptr), Error);  // n_dims > head_dim
}

}  // namespace
}  // namespace spillway
