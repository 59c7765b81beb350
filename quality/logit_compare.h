#pragma once
// Drives the logit metrics (quality/logit_metrics.h) over a long text: the reference and
// every candidate evaluate the same tokens chunk by chunk in lockstep, so only one chunk of
// logit rows per backend is ever held (a 150k vocabulary makes whole-text logits gigabytes).
#include <cstdint>
#include <functional>
#include <vector>

#include "quality/logit_metrics.h"
#include "quality/logits_backend.h"

namespace spillway {

// done/total tokens, for a progress bar.
using CompareProgress = std::function<void(uint64_t done, uint64_t total)>;

// Position i's rows are compared and the NLL of tokens[i + 1] is added. Every backend is
// reset first and must hold tokens.size() positions. Returns one LogitMetrics per candidate.
std::vector<LogitMetrics> compare_logits(LogitsBackend& reference, const std::vector<LogitsBackend*>& candidates,
                                         const std::vector<int32_t>& tokens, uint32_t chunk,
                                         const CompareProgress& progress = {});

}  // namespace spillway
