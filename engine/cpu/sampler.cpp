#include "engine/cpu/sampler.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace spillway {
namespace {

bool by_logit_desc(const Sampler::Candidate& a, const Sampler::Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Uniform in [0, 1) from 53 bits: the same sequence on every standard library.
double uniform01(std::mt19937_64& rng) { return (double)(rng() >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace

Sampler make_sampler(const SamplerConfig& config, uint32_t n_vocab) {
    if (n_vocab == 0) fail("sampler: empty vocabulary");
    if (!(config.repeat_penalty > 0.0f)) fail("sampler: repeat penalty must be positive");
    if (config.top_p <= 0.0f) fail("sampler: top-p must be positive");
    Sampler s;
    s.config = config;
    s.n_vocab = n_vocab;
    s.rng.seed(config.seed);
    s.candidates.resize(n_vocab);
    s.penalised.assign(n_vocab, 0);
    return s;
}

int32_t argmax(const float* logits, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; ++i)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}

int32_t sample_token(Sampler& s, const float* logits, std::span<const int32_t> history) {
    const SamplerConfig& c = s.config;
    auto& cand = s.candidates;
    size_t n = s.n_vocab;
    for (uint32_t i = 0; i < s.n_vocab; ++i) cand[i] = {(int32_t)i, logits[i]};

    if (c.repeat_penalty != 1.0f && c.repeat_last_n > 0) {
        const size_t from = history.size() > c.repeat_last_n ? history.size() - c.repeat_last_n : 0;
        for (size_t i = from; i < history.size(); ++i) {
            const int32_t id = history[i];
            if (id < 0 || (uint32_t)id >= s.n_vocab || s.penalised[id]) continue;
            s.penalised[id] = 1;  // each distinct token is penalised once
            float& l = cand[id].logit;
            l = l > 0 ? l / c.repeat_penalty : l * c.repeat_penalty;
        }
        for (size_t i = from; i < history.size(); ++i)
            if (history[i] >= 0 && (uint32_t)history[i] < s.n_vocab) s.penalised[history[i]] = 0;
    }

    if (c.temperature <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < n; ++i)
            if (cand[i].logit > cand[best].logit) best = i;
        return cand[best].id;
    }

    if (c.top_k > 0 && (size_t)c.top_k < n) {
        std::partial_sort(cand.begin(), cand.begin() + c.top_k, cand.begin() + n, by_logit_desc);
        n = (size_t)c.top_k;
    } else {
        std::sort(cand.begin(), cand.begin() + n, by_logit_desc);
    }

    // Temperature-1 probabilities of what is left (sorted, so cand[0] holds the max).
    const float max_logit = cand[0].logit;
    if (c.top_p < 1.0f) {
        double total = 0;
        for (size_t i = 0; i < n; ++i) total += std::exp((double)cand[i].logit - max_logit);
        double cum = 0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            cum += std::exp((double)cand[i].logit - max_logit) / total;
            if (cum >= c.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (c.min_p > 0.0f) {
        // p_i >= min_p * p_max  <=>  logit_i >= max_logit + ln(min_p)
        const float threshold = max_logit + std::log(c.min_p);
        size_t keep = 1;
        while (keep < n && cand[keep].logit >= threshold) ++keep;
        n = keep;
    }

    double total = 0;
    for (size_t i = 0; i < n; ++i) total += std::exp(((double)cand[i].logit - max_logit) / c.temperature);
    const double r = uniform01(s.rng) * total;
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
        cum += std::exp(((double)cand[i].logit - max_logit) / c.temperature);
        if (r < cum) return cand[i].id;
    }
    return cand[n - 1].id;
}

}  // namespace spillway
