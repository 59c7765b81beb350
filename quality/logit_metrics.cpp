#include "quality/logit_metrics.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "engine/cpu/sampler.h"

namespace spillway {

void log_softmax(const float* logits, uint32_t n, double* out) {
    if (n == 0) fail("log_softmax: empty row");
    double max = logits[0];
    for (uint32_t i = 1; i < n; ++i) max = std::max(max, (double)logits[i]);
    // -inf logits (masked tokens) give exp() = 0 and log-probability -inf, as they should.
    double sum = 0;
    for (uint32_t i = 0; i < n; ++i) sum += std::exp((double)logits[i] - max);
    const double log_z = max + std::log(sum);
    for (uint32_t i = 0; i < n; ++i) out[i] = (double)logits[i] - log_z;
}

double kl_divergence(const float* reference, const float* candidate, uint32_t n, double* scratch) {
    std::vector<double> own;
    if (!scratch) {
        own.resize(2 * (size_t)n);
        scratch = own.data();
    }
    double* log_p = scratch;
    double* log_q = scratch + n;
    log_softmax(reference, n, log_p);
    log_softmax(candidate, n, log_q);
    double kl = 0;
    for (uint32_t i = 0; i < n; ++i) {
        if (log_p[i] == -INFINITY) continue;  // p_i = 0 contributes nothing
        kl += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
    }
    // Rounding can leave a tiny negative sum for near-identical rows; KL is never negative.
    return std::max(kl, 0.0);
}

LogitComparison make_logit_comparison(uint32_t n_vocab) {
    if (n_vocab == 0) fail("logit comparison: n_vocab is 0");
    LogitComparison c;
    c.n_vocab = n_vocab;
    c.scratch.resize(2 * (size_t)n_vocab);
    return c;
}

void add_logit_row(LogitComparison& c, const float* reference, const float* candidate, int32_t next_token) {
    const uint32_t n = c.n_vocab;
    const double kl = kl_divergence(reference, candidate, n, c.scratch.data());
    c.kl_sum += kl;
    c.kl_max = std::max(c.kl_max, kl);
    if (argmax(reference, n) == argmax(candidate, n)) ++c.top1_agree;
    double row_sum = 0;
    for (uint32_t i = 0; i < n; ++i) {
        const double d = std::fabs((double)reference[i] - (double)candidate[i]);
        row_sum += d;
        c.abs_dlogit_max = std::max(c.abs_dlogit_max, d);
    }
    c.abs_dlogit_sum += row_sum;
    if (next_token >= 0 && (uint32_t)next_token < n) {
        // scratch still holds both log-softmax rows from kl_divergence.
        c.nll_reference_sum -= c.scratch[(size_t)next_token];
        c.nll_candidate_sum -= c.scratch[(size_t)n + (size_t)next_token];
        ++c.nll_positions;
    }
    ++c.positions;
}

LogitMetrics summarize(const LogitComparison& c) {
    LogitMetrics m;
    m.positions = c.positions;
    m.nll_positions = c.nll_positions;
    if (c.positions == 0) return m;
    const double n = (double)c.positions;
    m.mean_kl = c.kl_sum / n;
    m.max_kl = c.kl_max;
    m.top1_agreement = (double)c.top1_agree / n;
    m.max_abs_dlogit = c.abs_dlogit_max;
    m.mean_abs_dlogit = c.abs_dlogit_sum / (n * (double)c.n_vocab);
    if (c.nll_positions) {
        m.ppl_reference = std::exp(c.nll_reference_sum / (double)c.nll_positions);
        m.ppl_candidate = std::exp(c.nll_candidate_sum / (double)c.nll_positions);
    }
    return m;
}

}  // namespace spillway
