#include "quality/logit_compare.h"

#include <algorithm>

#include "common/error.h"

namespace spillway {

std::vector<LogitMetrics> compare_logits(LogitsBackend& reference, const std::vector<LogitsBackend*>& candidates,
                                         const std::vector<int32_t>& tokens, uint32_t chunk,
                                         const CompareProgress& progress) {
    if (tokens.empty()) fail("logit comparison: no tokens");
    if (chunk == 0) fail("logit comparison: chunk is 0");
    const uint32_t V = reference.n_vocab();
    for (LogitsBackend* b : candidates)
        if (b->n_vocab() != V) fail("logit comparison: " + b->describe() + " has a different vocabulary size");
    std::vector<LogitsBackend*> all = candidates;
    all.push_back(&reference);
    for (LogitsBackend* b : all) {
        if (b->n_ctx() < tokens.size())
            fail("logit comparison: " + std::to_string(tokens.size()) + " tokens exceed " + b->describe() +
                 "'s context of " + std::to_string(b->n_ctx()));
        b->reset();
    }
    std::vector<LogitComparison> sums(candidates.size(), make_logit_comparison(V));
    const uint64_t n = tokens.size();
    for (uint64_t pos = 0; pos < n; pos += chunk) {
        const uint32_t m = (uint32_t)std::min<uint64_t>(chunk, n - pos);
        const float* ref = reference.eval(tokens.data() + pos, m, true);
        for (size_t c = 0; c < candidates.size(); ++c) {
            const float* cand = candidates[c]->eval(tokens.data() + pos, m, true);
            for (uint32_t i = 0; i < m; ++i) {
                const uint64_t p = pos + i;
                const int32_t next = p + 1 < n ? tokens[p + 1] : -1;
                add_logit_row(sums[c], ref + (size_t)i * V, cand + (size_t)i * V, next);
            }
        }
        if (progress) progress(pos + m, n);
    }
    std::vector<LogitMetrics> out;
    for (const LogitComparison& s : sums) out.push_back(summarize(s));
    return out;
}

}  // namespace spillway
