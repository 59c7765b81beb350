#pragma once
// How far a candidate's next-token distributions are from a reference's on the same tokens
// (the spec's "logit equivalence" check): KL(reference || candidate), top-1 agreement and
// |Δlogit|. Pure functions over logit rows; the math is done in double so that the KL of a
// distribution against itself is exactly 0 and tiny quantization effects are not lost in
// float rounding.
#include <cstdint>
#include <vector>

namespace spillway {

// out[i] = logits[i] - logsumexp(logits), in double, stable for any logit range (the max
// is subtracted first). out must hold n values; n >= 1.
void log_softmax(const float* logits, uint32_t n, double* out);

// KL(P || Q) in nats, P = softmax(reference), Q = softmax(candidate): sum_i p_i (log p_i -
// log q_i). >= 0; 0 exactly when the rows are identical. `scratch` (2n doubles) avoids
// allocating per row when given.
double kl_divergence(const float* reference, const float* candidate, uint32_t n, double* scratch = nullptr);

// Running sums over many positions; add rows with add_logit_row, read with summarize.
struct LogitComparison {
    uint32_t n_vocab = 0;
    uint64_t positions = 0;
    double kl_sum = 0;
    double kl_max = 0;
    uint64_t top1_agree = 0;
    double abs_dlogit_max = 0;
    double abs_dlogit_sum = 0;    // over every vocabulary entry of every position
    uint64_t nll_positions = 0;   // positions whose next token was given
    double nll_reference_sum = 0; // -log p_ref(next token)
    double nll_candidate_sum = 0;
    std::vector<double> scratch;  // 2 * n_vocab
};

LogitComparison make_logit_comparison(uint32_t n_vocab);

// One position. next_token < 0: unknown (the last position of a text), no NLL term.
void add_logit_row(LogitComparison& c, const float* reference, const float* candidate, int32_t next_token = -1);

struct LogitMetrics {
    uint64_t positions = 0;
    double mean_kl = 0;           // nats
    double max_kl = 0;
    double top1_agreement = 0;    // fraction in [0, 1]
    double max_abs_dlogit = 0;
    double mean_abs_dlogit = 0;
    uint64_t nll_positions = 0;
    double ppl_reference = 0;     // exp(mean NLL) of the text's next tokens; 0 when none
    double ppl_candidate = 0;
};

LogitMetrics summarize(const LogitComparison& c);

}  // namespace spillway
