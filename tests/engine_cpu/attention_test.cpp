// attention_partial_cpu / attention_merge_cpu against a naive double-precision softmax
// attention, and split + merge against one pass, for every K/V tier pair.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu/attention.h"
#include "test_util.h"

namespace spillway {
namespace {

using test::fresh_seed;
using test::rel_error;

struct Case {
    AttentionShape shape;
    KvType k_type, v_type;
    uint32_t n_cells;
    std::vector<float> q;
    std::vector<uint8_t> k, v;
};

Case make_case(std::mt19937_64& rng, uint32_t n_head, uint32_t n_head_kv, uint32_t dk, uint32_t dv,
               KvType kt, KvType vt, uint32_t n_cells) {
    Case c;
    c.shape = {n_head, n_head_kv, dk, dv, 1.0f / std::sqrt((float)dk)};
    c.k_type = kt;
    c.v_type = vt;
    c.n_cells = n_cells;
    c.q = test::random_floats(rng, (size_t)n_head * dk, -2.0f, 2.0f);
    c.k = test::random_kv_rows(rng, kt, (uint64_t)n_cells * n_head_kv * dk);
    c.v = test::random_kv_rows(rng, vt, (uint64_t)n_cells * n_head_kv * dv);
    return c;
}

// Softmax attention in double from the naive decoder; cells [begin, end).
void naive_attention(const Case& c, uint32_t begin, uint32_t end, std::vector<float>& out,
                     std::vector<float>& lse) {
    const auto& s = c.shape;
    const uint64_t k_row = test::naive_kv_bytes(c.k_type, (uint64_t)s.n_head_kv * s.head_dim_k);
    const uint64_t v_row = test::naive_kv_bytes(c.v_type, (uint64_t)s.n_head_kv * s.head_dim_v);
    out.assign((size_t)s.n_head * s.head_dim_v, 0.0f);
    lse.assign(s.n_head, -std::numeric_limits<float>::infinity());
    for (uint32_t h = 0; h < s.n_head; ++h) {
        const uint32_t g = h / (s.n_head / s.n_head_kv);
        std::vector<double> scores;
        for (uint32_t cell = begin; cell < end; ++cell) {
            double dot = 0;
            for (uint32_t d = 0; d < s.head_dim_k; ++d)
                dot += (double)c.q[h * s.head_dim_k + d] *
                       test::naive_kv_value(c.k_type, c.k.data() + cell * k_row, g * s.head_dim_k + d);
            scores.push_back(dot * s.scale);
        }
        if (scores.empty()) continue;
        double m = -1e300;
        for (double x : scores) m = std::max(m, x);
        double sum = 0;
        for (double& x : scores) sum += (x = std::exp(x - m));
        for (uint32_t d = 0; d < s.head_dim_v; ++d) {
            double acc = 0;
            for (uint32_t cell = begin; cell < end; ++cell)
                acc += scores[cell - begin] *
                       test::naive_kv_value(c.v_type, c.v.data() + cell * v_row, g * s.head_dim_v + d);
            out[h * s.head_dim_v + d] = (float)(acc / sum);
        }
        lse[h] = (float)(m + std::log(sum));
    }
}

void run_range(const Case& c, uint32_t begin, uint32_t end, std::vector<float>& out, std::vector<float>& lse) {
    const auto& s = c.shape;
    const uint64_t k_row = test::naive_kv_bytes(c.k_type, (uint64_t)s.n_head_kv * s.head_dim_k);
    const uint64_t v_row = test::naive_kv_bytes(c.v_type, (uint64_t)s.n_head_kv * s.head_dim_v);
    out.assign((size_t)s.n_head * s.head_dim_v, 12345.0f);  // garbage: must be overwritten
    lse.assign(s.n_head, 12345.0f);
    attention_partial_cpu(s, c.q.data(), c.k_type, c.k.data() + begin * k_row, c.v_type,
                          c.v.data() + begin * v_row, end - begin, out.data(), lse.data());
}

// Tolerances: the engine accumulates in f32 with an online softmax; the reference is
// double. Outputs are O(1), so 1e-5 relative and 1e-4 absolute on lse are f32 round-off.
constexpr double kOutTol = 1e-5;
constexpr double kLseTol = 1e-4;

TEST(AttentionCpu, MatchesNaiveForEveryTierPairAndShape) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    struct Dims { uint32_t n_head, n_head_kv, dk, dv; };
    const Dims dims[] = {{4, 4, 32, 32}, {8, 2, 64, 64}, {6, 1, 64, 32}, {14, 2, 128, 128}, {40, 2, 32, 64}};
    for (KvType kt : test::kAllKvTypes)
        for (KvType vt : test::kAllKvTypes)
            for (const Dims& d : dims) {
                SCOPED_TRACE(std::string(test::kv_name(kt)) + "/" + test::kv_name(vt) + " heads " +
                             std::to_string(d.n_head) + "/" + std::to_string(d.n_head_kv));
                const uint32_t n_cells = 1 + rng() % 70;
                Case c = make_case(rng, d.n_head, d.n_head_kv, d.dk, d.dv, kt, vt, n_cells);
                std::vector<float> out, lse, ref_out, ref_lse;
                run_range(c, 0, n_cells, out, lse);
                naive_attention(c, 0, n_cells, ref_out, ref_lse);
                EXPECT_LE(rel_error(out, ref_out), kOutTol);
                for (uint32_t h = 0; h < d.n_head; ++h) EXPECT_NEAR(lse[h], ref_lse[h], kLseTol);
            }
}

TEST(AttentionCpu, EmptyRangeIsMergeIdentity) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    Case c = make_case(rng, 8, 2, 64, 64, KvType::q8_0, KvType::q4_0, 17);
    std::vector<float> empty_out, empty_lse, out, lse;
    run_range(c, 5, 5, empty_out, empty_lse);
    for (float x : empty_out) EXPECT_EQ(x, 0.0f);
    for (float x : empty_lse) EXPECT_TRUE(std::isinf(x) && x < 0);
    run_range(c, 0, 17, out, lse);
    // a := merge(a, empty) and a := merge(empty, a) both leave a unchanged, bit for bit.
    std::vector<float> a = out, la = lse;
    attention_merge_cpu(8, 64, a.data(), la.data(), empty_out.data(), empty_lse.data());
    EXPECT_EQ(a, out);
    EXPECT_EQ(la, lse);
    std::vector<float> e = empty_out, le = empty_lse;
    attention_merge_cpu(8, 64, e.data(), le.data(), out.data(), lse.data());
    EXPECT_EQ(e, out);
    EXPECT_EQ(le, lse);
}

// The contract the CUDA split-K kernels and the spilled tail rely on.
TEST(AttentionCpu, SplitAndMergeEqualsOnePassForEveryTierPair) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    for (KvType kt : test::kAllKvTypes)
        for (KvType vt : test::kAllKvTypes)
            for (int trial = 0; trial < 4; ++trial) {
                SCOPED_TRACE(std::string(test::kv_name(kt)) + "/" + test::kv_name(vt) + " trial " +
                             std::to_string(trial));
                const uint32_t n_cells = 2 + rng() % 300;
                Case c = make_case(rng, 12, 4, 64, 64, kt, vt, n_cells);
                std::vector<float> one, one_lse;
                run_range(c, 0, n_cells, one, one_lse);
                // Random cut points (possibly empty pieces), merged left to right.
                const uint32_t n_pieces = 1 + rng() % 6;
                std::vector<uint32_t> cuts = {0, n_cells};
                for (uint32_t i = 1; i < n_pieces; ++i) cuts.push_back(rng() % (n_cells + 1));
                std::sort(cuts.begin(), cuts.end());
                std::vector<float> acc, acc_lse, part, part_lse;
                run_range(c, cuts[0], cuts[1], acc, acc_lse);
                for (size_t i = 1; i + 1 < cuts.size(); ++i) {
                    run_range(c, cuts[i], cuts[i + 1], part, part_lse);
                    attention_merge_cpu(12, 64, acc.data(), acc_lse.data(), part.data(), part_lse.data());
                }
                EXPECT_LE(rel_error(acc, one), 1e-5);
                for (uint32_t h = 0; h < 12; ++h) EXPECT_NEAR(acc_lse[h], one_lse[h], 1e-4);
            }
}

}  // namespace
}  // namespace spillway
