// The logit metrics on distributions small enough to compute by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "quality/logit_metrics.h"

using namespace spillway;

namespace {

std::vector<float> logits_of(std::initializer_list<double> probabilities) {
    std::vector<float> v;
    for (double p : probabilities) v.push_back((float)std::log(p));
    return v;
}

uint64_t fresh_seed() {
    uint64_t s = std::random_device{}();
    std::cout << "seed " << s << "\n";
    return s;
}

}  // namespace

TEST(LogitMetrics, LogSoftmaxOfHandComputedRows) {
    double out[3];
    const float uniform[2] = {0.0f, 0.0f};
    log_softmax(uniform, 2, out);
    EXPECT_NEAR(out[0], -std::log(2.0), 1e-15);
    EXPECT_NEAR(out[1], -std::log(2.0), 1e-15);
    // logits 0, ln 3: probabilities 1/4 and 3/4.
    const float quarter[2] = {0.0f, (float)std::log(3.0)};
    log_softmax(quarter, 2, out);
    EXPECT_NEAR(std::exp(out[0]), 0.25, 1e-7);
    EXPECT_NEAR(std::exp(out[1]), 0.75, 1e-7);
    // Large logits would overflow a naive exp(); the max is subtracted first.
    const float huge[3] = {1000.0f, 1000.0f, -1000.0f};
    log_softmax(huge, 3, out);
    EXPECT_NEAR(out[0], -std::log(2.0), 1e-12);
    EXPECT_TRUE(std::isfinite(out[2]));
    EXPECT_LT(out[2], -1999.0);
}

TEST(LogitMetrics, KlOfHandComputedDistributions) {
    // KL([1/2, 1/2] || [1/4, 3/4]) = 1/2 ln 2 + 1/2 ln(2/3).
    const auto p = logits_of({0.5, 0.5}), q = logits_of({0.25, 0.75});
    EXPECT_NEAR(kl_divergence(p.data(), q.data(), 2), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
    // And the other way round: 1/4 ln(1/2) + 3/4 ln(3/2); KL is not symmetric.
    EXPECT_NEAR(kl_divergence(q.data(), p.data(), 2), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
    // Three outcomes: P = [0.7, 0.2, 0.1], Q = [0.5, 0.3, 0.2].
    const auto p3 = logits_of({0.7, 0.2, 0.1}), q3 = logits_of({0.5, 0.3, 0.2});
    const double expected = 0.7 * std::log(0.7 / 0.5) + 0.2 * std::log(0.2 / 0.3) + 0.1 * std::log(0.1 / 0.2);
    EXPECT_NEAR(kl_divergence(p3.data(), q3.data(), 3), expected, 1e-7);
}

TEST(LogitMetrics, KlIsZeroForSameDistributionAndPositiveOtherwise) {
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    const uint32_t n = 1000;
    std::vector<float> a(n), b(n), shifted(n);
    for (uint32_t i = 0; i < n; ++i) {
        a[i] = std::round(dist(rng) * 1024.0f) / 1024.0f;  // on a 2^-10 grid, so a + 16 is exact
        b[i] = a[i] + 0.1f * dist(rng);
        shifted[i] = a[i] + 16.0f;  // softmax is shift invariant
    }
    EXPECT_EQ(kl_divergence(a.data(), a.data(), n), 0.0);
    EXPECT_NEAR(kl_divergence(a.data(), shifted.data(), n), 0.0, 1e-12);
    EXPECT_GT(kl_divergence(a.data(), b.data(), n), 0.0);
    EXPECT_GT(kl_divergence(b.data(), a.data(), n), 0.0);
}

TEST(LogitMetrics, ZeroProbabilityTokensAreHandled) {
    const float inf = std::numeric_limits<float>::infinity();
    // A reference that rules a token out contributes nothing for it.
    const float p[3] = {0.0f, 0.0f, -inf};
    const float q[3] = {0.0f, 0.0f, 0.0f};
    // P = [1/2, 1/2, 0], Q = uniform over 3: KL = ln(3/2).
    EXPECT_NEAR(kl_divergence(p, q, 3), std::log(1.5), 1e-12);
    // A candidate that rules out a token the reference allows is infinitely far.
    EXPECT_TRUE(std::isinf(kl_divergence(q, p, 3)));
}

TEST(LogitMetrics, AccumulatesTopOneDeltasAndPerplexity) {
    LogitComparison c = make_logit_comparison(4);
    // Position 0: identical rows, argmax 2. Position 1: argmax differs (1 vs 3).
    const float ref0[4] = {0.0f, 1.0f, 3.0f, 0.5f}, cand0[4] = {0.0f, 1.0f, 3.0f, 0.5f};
    const float ref1[4] = {0.0f, 2.0f, 0.0f, 0.0f}, cand1[4] = {0.0f, 2.0f, 0.0f, 2.5f};
    add_logit_row(c, ref0, cand0, 2);
    add_logit_row(c, ref1, cand1);  // last position: no next token
    const LogitMetrics m = summarize(c);
    EXPECT_EQ(m.positions, 2u);
    EXPECT_DOUBLE_EQ(m.top1_agreement, 0.5);
    EXPECT_DOUBLE_EQ(m.max_abs_dlogit, 2.5);
    EXPECT_DOUBLE_EQ(m.mean_abs_dlogit, 2.5 / 8.0);
    EXPECT_EQ(m.nll_positions, 1u);
    // Same row at position 0: both perplexities are 1/p(token 2).
    double lp[4];
    log_softmax(ref0, 4, lp);
    EXPECT_NEAR(m.ppl_reference, std::exp(-lp[2]), 1e-12);
    EXPECT_NEAR(m.ppl_candidate, m.ppl_reference, 1e-12);
    EXPECT_NEAR(m.mean_kl, kl_divergence(ref1, cand1, 4) / 2.0, 1e-15);
    EXPECT_NEAR(m.max_kl, kl_divergence(ref1, cand1, 4), 1e-15);

    // A uniform reference over 4 tokens has perplexity exactly 4.
    LogitComparison u = make_logit_comparison(4);
    const float flat[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    for (int i = 0; i < 3; ++i) add_logit_row(u, flat, flat, i);
    EXPECT_NEAR(summarize(u).ppl_reference, 4.0, 1e-12);
    EXPECT_EQ(summarize(u).mean_kl, 0.0);
}

TEST(LogitMetrics, EmptyComparisonIsAllZero) {
    const LogitMetrics m = summarize(make_logit_comparison(8));
    EXPECT_EQ(m.positions, 0u);
    EXPECT_EQ(m.mean_kl, 0.0);
    EXPECT_EQ(m.ppl_reference, 0.0);
}
