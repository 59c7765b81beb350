#pragma once
// Next-token sampling: repetition penalty, then top-k, top-p, min-p (on temperature-1
// probabilities), then temperature and a draw from a seeded generator, the order
// llama.cpp's default chain uses. temperature <= 0 is greedy (argmax after the penalty).
// All buffers are sized at construction: sampling allocates nothing.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace spillway {

struct SamplerConfig {
    float temperature = 0.8f;
    int32_t top_k = 40;            // <= 0: off
    float top_p = 0.95f;           // >= 1: off
    float min_p = 0.05f;           // <= 0: off
    float repeat_penalty = 1.0f;   // 1: off
    uint32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at
    uint64_t seed = 0;
};

struct Sampler {
    struct Candidate {
        int32_t id;
        float logit;
    };
    SamplerConfig config;
    uint32_t n_vocab = 0;
    std::mt19937_64 rng;
    std::vector<Candidate> candidates;  // n_vocab
    std::vector<uint8_t> penalised;     // n_vocab flags, cleared after each use
};

Sampler make_sampler(const SamplerConfig& config, uint32_t n_vocab);

// `history`: tokens so far (prompt and generated); only the last repeat_last_n matter.
int32_t sample_token(Sampler& sampler, const float* logits, std::span<const int32_t> history);

// Index of the largest logit (the first on ties).
int32_t argmax(const float* logits, uint32_t n);

}  // namespace spillway
