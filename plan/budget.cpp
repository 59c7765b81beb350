#include "plan/budget.h"

#include <algorithm>
#include <cstdio>

namespace spillway {

Budget compute_budget(const BudgetInputs& in) {
    Budget b;
    b.inputs = in;
    b.cap_bytes = in.vram_free_bytes;
    if (in.vram_target_bytes && *in.vram_target_bytes < in.vram_free_bytes) {
        b.cap_bytes = *in.vram_target_bytes;
        b.target_binds = true;
    }
    b.raw_bytes = (int64_t)b.cap_bytes - (int64_t)in.weight_bytes - (int64_t)in.buffer_bytes -
                  (int64_t)in.compute_reserve_bytes;
    b.bytes = b.raw_bytes > 0 ? (uint64_t)b.raw_bytes : 0;
    return b;
}

uint64_t default_compute_reserve_bytes(const ModelSpec& m) {
    constexpr uint64_t kUbatch = 512;
    uint64_t floats_per_token = 4ull * m.n_embd + 2ull * m.n_ff + m.n_vocab;
    return kUbatch * floats_per_token * sizeof(float) + 1024 * kMiB;
}

static long long mib(uint64_t bytes) { return (long long)(bytes / kMiB); }

std::string describe_budget(const Budget& b) {
    char cap[160];
    if (b.inputs.vram_target_bytes)
        std::snprintf(cap, sizeof cap, "min(free %lld, vram-target %lld)", mib(b.inputs.vram_free_bytes),
                      mib(*b.inputs.vram_target_bytes));
    else
        std::snprintf(cap, sizeof cap, "free %lld", mib(b.inputs.vram_free_bytes));
    char line[400];
    std::snprintf(line, sizeof line,
                  "budget %lld MiB = %s − used %lld (weights %lld + buffers %lld) − compute reserve %lld%s",
                  (long long)(b.raw_bytes / (int64_t)kMiB), cap,
                  mib(b.inputs.weight_bytes + b.inputs.buffer_bytes), mib(b.inputs.weight_bytes),
                  mib(b.inputs.buffer_bytes), mib(b.inputs.compute_reserve_bytes),
                  b.raw_bytes < 0 ? " (negative: the weights alone do not fit; every KV cell spills)" : "");
    return line;
}

}  // namespace spillway
