// Each CPU op against a straightforward naive implementation on fresh random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/rmsnorm.h"
#include "engine/cpu/rope.h"
#include "engine/cpu/sampler.h"
#include "engine/cpu/swiglu.h"
#include "engine/cpu/thread_pool.h"
#include "gguf/quants.h"
#include "kv/kv_codec.h"
#include "test_util.h"

namespace spillway {
namespace {

using test::fresh_seed;
using test::random_floats;
using test::rel_error;

TEST(ThreadPoolCpu, EveryIndexExactlyOnce) {
    for (unsigned threads : {1u, 2u, 3u, 8u}) {
        ThreadPool pool(threads);
        for (size_t n : {1ul, 2ul, 7ul, 64ul, 1000ul}) {
            std::vector<std::atomic<int>> hits(n);
            for (int rep = 0; rep < 3; ++rep)
                pool.parallel_for(n, [&](size_t b, size_t e, unsigned t) {
                    EXPECT_LT(t, threads);
                    for (size_t i = b; i < e; ++i) hits[i]++;
                });
            for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 3) << "threads " << threads << " n " << n;
        }
    }
}

TEST(RmsNormCpu, MatchesNaive) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    for (size_t n : {32ul, 896ul, 4096ul}) {
        auto x = random_floats(rng, n, -3, 3), w = random_floats(rng, n, 0.5f, 1.5f);
        std::vector<float> y(n), ref(n);
        rmsnorm_cpu(x.data(), w.data(), y.data(), n, 1e-6f);
        double ss = 0;
        for (float v : x) ss += (double)v * v;
        const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
        for (size_t i = 0; i < n; ++i) ref[i] = (float)(x[i] * inv * w[i]);
        EXPECT_LE(rel_error(y, ref), 1e-6);  // f32 products of O(1) values
    }
}

TEST(SwigluCpu, MatchesNaive) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const size_t n = 4864;
    auto g = random_floats(rng, n, -8, 8), u = random_floats(rng, n, -2, 2);
    std::vector<float> y(n), ref(n);
    swiglu_cpu(g.data(), u.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) ref[i] = (float)((double)g[i] / (1.0 + std::exp(-(double)g[i])) * u[i]);
    EXPECT_LE(rel_error(y, ref), 1e-6);
}

// Naive RoPE straight from the definitions in rope.h, in double.
std::vector<float> naive_rope(const RopeSpec& spec, uint32_t head_dim, const std::vector<float>& x,
                              uint32_t n_heads, uint32_t pos) {
    const uint32_t nd = spec.n_dims ? spec.n_dims : head_dim;
    const double factor = spec.scaling_factor;
    double low = 0, high = 0, mscale = 1;
    if (spec.scaling == RopeScaling::yarn) {
        auto corr = [&](double beta) {
            return nd * std::log(spec.original_context / (beta * 2 * M_PI)) / (2 * std::log((double)spec.freq_base));
        };
        low = std::max(0.0, std::floor(corr(spec.yarn_beta_fast)));
        high = std::min((double)nd - 1, std::ceil(corr(spec.yarn_beta_slow)));
        mscale = spec.yarn_attn_factor * (1 + 0.1 * std::log(factor));
    }
    std::vector<float> y = x;
    for (uint32_t h = 0; h < n_heads; ++h)
        for (uint32_t i = 0; i < nd / 2; ++i) {
            const double extrap = pos * std::pow((double)spec.freq_base, -2.0 * i / nd);
            double theta = extrap;
            if (spec.scaling == RopeScaling::linear) theta = extrap / factor;
            if (spec.scaling == RopeScaling::yarn) {
                // The tables keep the ramp weight in f32 (the GPU reads the same table); at
                // pos 131071 a pair turns ~1e5 rad, so the weight's f32 rounding alone can move
                // the angle past this test's bound. Round it here as the table does.
                const double ramp = (double)(float)(1 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0));
                theta = extrap / factor * (1 - ramp) + extrap * ramp;
            }
            const uint32_t a = spec.type == RopeType::normal ? 2 * i : i;
            const uint32_t b = spec.type == RopeType::normal ? 2 * i + 1 : i + nd / 2;
            const double x0 = x[h * head_dim + a], x1 = x[h * head_dim + b];
            y[h * head_dim + a] = (float)(mscale * (x0 * std::cos(theta) - x1 * std::sin(theta)));
            y[h * head_dim + b] = (float)(mscale * (x0 * std::sin(theta) + x1 * std::cos(theta)));
        }
    return y;
}

TEST(RopeCpu, MatchesNaiveForTypesAndScalings) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    for (RopeType type : {RopeType::normal, RopeType::neox})
        for (RopeScaling scaling : {RopeScaling::none, RopeScaling::linear, RopeScaling::yarn})
            for (uint32_t n_dims : {0u, 32u}) {  // 0: all of the head; 32: partial rotation
                RopeSpec spec;
                spec.type = type;
                spec.freq_base = scaling == RopeScaling::yarn ? 1000000.0f : 10000.0f;
                spec.n_dims = n_dims;
                spec.scaling = scaling;
                spec.scaling_factor = scaling == RopeScaling::none ? 1.0f : 4.0f;
                spec.original_context = 32768;
                const uint32_t head_dim = 64, n_heads = 3;
                RopeTables t = make_rope_tables(spec, head_dim);
                for (uint32_t pos : {0u, 1u, 17u, 5000u, 131071u}) {
                    auto x = random_floats(rng, head_dim * n_heads, -2, 2);
                    auto ref = naive_rope(spec, head_dim, x, n_heads, pos);
                    rope_cpu(t, x.data(), n_heads, head_dim, pos);
                    // Angles in double, cos/sin rounded to f32: ~1e-7 relative.
                    EXPECT_LE(rel_error(x, ref), 2e-6) << "type " << (int)type << " scaling " << (int)scaling
                                                       << " n_dims " << n_dims << " pos " << pos;
                }
            }
}

// The property RoPE exists for: <rope(q, m), rope(k, n)> depends only on m - n.
TEST(RopeCpu, DotProductDependsOnlyOnRelativePosition) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    for (RopeType type : {RopeType::normal, RopeType::neox}) {
        RopeSpec spec;
        spec.type = type;
        spec.freq_base = 500000.0f;
        RopeTables t = make_rope_tables(spec, 128);
        auto q = random_floats(rng, 128), k = random_floats(rng, 128);
        auto dot_at = [&](uint32_t m, uint32_t n) {
            auto qq = q, kk = k;
            rope_cpu(t, qq.data(), 1, 128, m);
            rope_cpu(t, kk.data(), 1, 128, n);
            double d = 0;
            for (int i = 0; i < 128; ++i) d += (double)qq[i] * kk[i];
            return d;
        };
        EXPECT_NEAR(dot_at(10, 3), dot_at(1007, 1000), 1e-4);
        EXPECT_NEAR(dot_at(5, 5), dot_at(0, 0), 1e-4);
    }
}

// Encodes random f32 weights as `type`; returns the bytes and the f32 values they decode to.
std::vector<uint8_t> encode_weights(GgmlType type, const std::vector<float>& w, std::vector<float>& decoded) {
    const size_t n = w.size();
    std::vector<uint8_t> bytes(*ggml_row_bytes(type, n));
    decoded.resize(n);
    switch (type) {
        case GgmlType::F32: std::memcpy(bytes.data(), w.data(), 4 * n); break;
        case GgmlType::F16:
        case GgmlType::BF16:
            for (size_t i = 0; i < n; ++i) {
                uint16_t h = type == GgmlType::F16 ? fp32_to_fp16(w[i]) : fp32_to_bf16(w[i]);
                std::memcpy(&bytes[2 * i], &h, 2);
            }
            break;
        default: quantize_row(type, w.data(), bytes.data(), n); break;
    }
    // Decode independently of the engine: halves and bfloats by their definitions, blocks
    // by the naive block decoder of the KV tests (same GGUF layouts).
    for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        if (type == GgmlType::F32) decoded[i] = w[i];
        else if (type == GgmlType::F16) { std::memcpy(&h, &bytes[2 * i], 2); decoded[i] = fp16_to_fp32(h); }
        else if (type == GgmlType::BF16) { std::memcpy(&h, &bytes[2 * i], 2); decoded[i] = bf16_to_fp32(h); }
        else decoded[i] = test::naive_kv_value(type == GgmlType::Q8_0 ? KvType::q8_0 : KvType::q4_0, bytes.data(), i);
    }
    return bytes;
}

TEST(MatmulCpu, EveryWeightTypeMatchesNaiveForDecodeAndPrefill) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    ThreadPool pool(3);
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0}) {
        SCOPED_TRACE(ggml_type_name(type));
        const uint32_t n_in = 32 * (1 + rng() % 40), n_out = 1 + rng() % 97;
        auto w = random_floats(rng, (size_t)n_in * n_out);
        std::vector<float> decoded;
        auto bytes = encode_weights(type, w, decoded);
        auto bias = random_floats(rng, n_out);
        WeightMatrix m = make_weight_matrix(type, bytes.data(), n_in, n_out);
        std::vector<float> scratch(pool.size() * n_in);
        for (uint32_t n_tokens : {1u, 5u}) {
            auto x = random_floats(rng, (size_t)n_tokens * n_in, -2, 2);
            for (const float* b : {(const float*)nullptr, (const float*)bias.data()}) {
                std::vector<float> y((size_t)n_tokens * n_out), ref(y.size());
                matmul_cpu(pool, m, x.data(), n_tokens, b, y.data(), scratch.data());
                for (uint32_t t = 0; t < n_tokens; ++t)
                    for (uint32_t r = 0; r < n_out; ++r) {
                        double acc = b ? b[r] : 0.0;
                        for (uint32_t i = 0; i < n_in; ++i) acc += (double)decoded[(size_t)r * n_in + i] * x[t * n_in + i];
                        ref[t * n_out + r] = (float)acc;
                    }
                // f32 accumulation over <= 1280 terms of O(1) values.
                EXPECT_LE(rel_error(y, ref), 1e-5) << "n_tokens " << n_tokens;
            }
        }
        std::vector<float> row(n_in);
        const uint32_t r = rng() % n_out;
        weight_row_f32(m, r, row.data());
        EXPECT_EQ(0, std::memcmp(row.data(), decoded.data() + (size_t)r * n_in, 4 * n_in));
    }
}

TEST(MatmulCpu, UnsupportedTypeIsAClearError) {
    std::vector<uint8_t> bytes(144);
    EXPECT_THROW(make_weight_matrix(GgmlType::Q4_K, bytes.data(), 256, 1), Error);
}

TEST(KvCodec, RoundTripWithinTierError) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const size_t n = 256;
    for (KvType t : test::kAllKvTypes) {
        SCOPED_TRACE(test::kv_name(t));
        auto x = random_floats(rng, n, -3, 3);
        std::vector<uint8_t> row(kv_bytes(t, n));
        std::vector<float> y(n);
        kv_store_row(t, x.data(), row.data(), n);
        kv_load_row(t, row.data(), y.data(), n);
        // Uniform data: f16 ~5e-4, q8_0 ~ amax/254 / rms ~ 7e-3, q4_0 ~ amax/16 / rms ~ 0.12.
        const double tol = t == KvType::f16 ? 1e-3 : t == KvType::q8_0 ? 1e-2 : 0.15;
        EXPECT_LE(rel_error(y, x), tol);
        for (size_t i = 0; i < n; ++i) EXPECT_EQ(y[i], test::naive_kv_value(t, row.data(), i));
        auto q = random_floats(rng, n);
        double dot = 0;
        for (size_t i = 0; i < n; ++i) dot += (double)q[i] * y[i];
        EXPECT_NEAR(kv_dot(t, row.data(), q.data(), n), dot, 1e-4 * (1 + std::fabs(dot)));
    }
}

TEST(SamplerCpu, GreedyIsArgmaxAndTopK1IsGreedyAtAnyTemperature) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const uint32_t V = 1000;
    auto logits = random_floats(rng, V, -5, 5);
    SamplerConfig greedy;
    greedy.temperature = 0;
    Sampler g = make_sampler(greedy, V);
    EXPECT_EQ(sample_token(g, logits.data(), {}), argmax(logits.data(), V));
    SamplerConfig k1;
    k1.temperature = 1.5f;
    k1.top_k = 1;
    k1.seed = rng();
    Sampler s = make_sampler(k1, V);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(s, logits.data(), {}), argmax(logits.data(), V));
}

TEST(SamplerCpu, SameSeedSameSequenceDifferentSeedDiffers) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const uint32_t V = 500;
    auto logits = random_floats(rng, V, -1, 1);
    SamplerConfig c;
    c.temperature = 1.0f;
    c.top_k = 0;
    c.top_p = 1.0f;
    c.min_p = 0;
    c.seed = rng();
    auto draw = [&](uint64_t s) {
        c.seed = s;
        Sampler sm = make_sampler(c, V);
        std::vector<int32_t> out;
        for (int i = 0; i < 50; ++i) out.push_back(sample_token(sm, logits.data(), {}));
        return out;
    };
    const uint64_t s1 = rng();
    EXPECT_EQ(draw(s1), draw(s1));
    EXPECT_NE(draw(s1), draw(s1 + 1));
}

TEST(SamplerCpu, FrequenciesFollowTemperedSoftmax) {
    const uint64_t seed = fresh_seed();
    SPILLWAY_SEED_TRACE(seed);
    std::mt19937_64 rng(seed);
    const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    SamplerConfig c;
    c.temperature = 0.7f;
    c.top_k = 0;
    c.top_p = 1.0f;
    c.min_p = 0;
    c.seed = rng();
    Sampler s = make_sampler(c, 5);
    const int N = 40000;
    std::vector<int> counts(5);
    for (int i = 0; i < N; ++i) counts[sample_token(s, logits.data(), {})]++;
    double z = 0;
    for (float l : logits) z += std::exp(l / 0.7);
    for (int i = 0; i < 5; ++i) {
        const double p = std::exp(logits[i] / 0.7) / z;
        // 5 standard deviations of a binomial proportion.
        EXPECT_NEAR((double)counts[i] / N, p, 5 * std::sqrt(p * (1 - p) / N)) << "token " << i;
    }
}

TEST(SamplerCpu, TopPMinPAndRepetitionPenaltyFilter) {
    // Probabilities at T=1: ~[0.64, 0.24, 0.087, 0.032, ...]
    const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f};
    SamplerConfig c;
    c.temperature = 1.0f;
    c.top_k = 0;
    c.min_p = 0;
    c.top_p = 0.85f;  // keeps {0, 1} (0.64 + 0.24 >= 0.85)
    Sampler s = make_sampler(c, 6);
    for (int i = 0; i < 300; ++i) EXPECT_LE(sample_token(s, logits.data(), {}), 1);
    c.top_p = 1.0f;
    c.min_p = 0.1f;  // keeps p >= 0.064: {0, 1, 2}
    s = make_sampler(c, 6);
    std::map<int, int> seen;
    for (int i = 0; i < 2000; ++i) seen[sample_token(s, logits.data(), {})]++;
    EXPECT_EQ(seen.size(), 3u);
    EXPECT_LE(seen.rbegin()->first, 2);
    // Penalty 3 on token 0 (repeated twice, penalised once): 3/3 = 1 < 2, so greedy picks 1.
    c.temperature = 0;
    c.repeat_penalty = 3.0f;
    s = make_sampler(c, 6);
    const std::vector<int32_t> history = {0, 5, 0};
    EXPECT_EQ(sample_token(s, logits.data(), history), 1);
    // A negative logit is multiplied: token 4 (-1 -> -3) ranks below token 5 (-2) after penalties.
    const std::vector<float> negative = {-1.0f, -2.0f};
    s = make_sampler(c, 2);
    EXPECT_EQ(sample_token(s, negative.data(), std::vector<int32_t>{0}), 1);
}

}  // namespace
}  // namespace spillway
