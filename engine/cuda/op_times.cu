#include "engine/cuda/op_times.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/lab_knob.h"

namespace spillway {
namespace {

struct OpTimes {
    std::mutex mutex;
    std::vector<cudaEvent_t> pool;            // reused across forwards
    std::vector<const char*> labels;          // label of the interval ending at event i (i >= 1)
    cudaStream_t timed = nullptr;             // the stream of the forward being timed
    std::map<std::string, std::pair<double, uint64_t>> totals;  // ms, intervals
    // Largest single interval per label (ms): a one-time cost (the first forward's library
    // initialisation, lazy module loading) shows here instead of hiding in the average.
    std::map<std::string, double> largest;
    // Mode 2 only: host time from the previous mark's wait to this mark, per label (ms). The
    // GPU idles meanwhile, so an interval is this plus the op's GPU time: a large share here
    // means the op is bound by its host-side enqueue (e.g. a library's heuristics).
    std::vector<double> host_ms;
    std::map<std::string, double> host_totals;
    std::chrono::steady_clock::time_point last_wait{};
    uint64_t forwards = 0;

    ~OpTimes() {
        if (totals.empty()) return;
        double all = 0.0;
        for (const auto& [label, t] : totals) all += t.first;
        std::vector<std::pair<std::string, std::pair<double, uint64_t>>> rows(totals.begin(), totals.end());
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
        std::fprintf(stderr, "\nop times (SPILLWAY_OP_TIMES), %llu prefill forwards, %.1f ms of GPU time:\n",
                     (unsigned long long)forwards, all);
        const bool host = !host_totals.empty();
        std::fprintf(stderr, host ? "| op | ms | share | count | largest ms | host enqueue ms |\n|---|---:|---:|---:|---:|---:|\n"
                                  : "| op | ms | share | count | largest ms |\n|---|---:|---:|---:|---:|\n");
        for (const auto& [label, t] : rows) {
            std::fprintf(stderr, "| %s | %.2f | %.1f%% | %llu | %.3f |", label.c_str(), t.first, 100.0 * t.first / all,
                         (unsigned long long)t.second, largest[label]);
            if (host) std::fprintf(stderr, " %.2f |", host_totals[label]);
            std::fprintf(stderr, "\n");
        }
        // Events are not destroyed: the CUDA context may already be gone at exit.
    }
};

OpTimes& op_times() {
    static OpTimes t;
    return t;
}

// 1: events only; 2: also wait for the stream at every mark (each op timed alone, without
// overlap with its neighbours: the difference to 1 is what running together costs or saves).
int op_times_mode() {
    static const int mode = std::max(0, lab_knob_choice("SPILLWAY_OP_TIMES", {"0", "1", "2"}));
    return mode;
}

}  // namespace

bool op_times_enabled() { return op_times_mode() != 0; }

void op_times_begin(cudaStream_t stream) {
    if (!op_times_enabled()) return;
    OpTimes& t = op_times();
    const std::lock_guard<std::mutex> lock(t.mutex);
    // One timed forward at a time: a second stream's forward (another thread) is not timed.
    if (!t.labels.empty() && t.timed != stream) return;
    t.labels.assign(1, nullptr);
    t.host_ms.assign(1, 0.0);
    t.timed = stream;
    if (t.pool.empty()) {
        t.pool.push_back(nullptr);
        SPILLWAY_CUDA_CHECK(cudaEventCreate(&t.pool.back()));
    }
    SPILLWAY_CUDA_CHECK(cudaEventRecord(t.pool[0], stream));
    if (op_times_mode() == 2) {
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
        t.last_wait = std::chrono::steady_clock::now();
    }
}

void op_times_mark(const char* label, cudaStream_t stream) {
    if (!op_times_enabled()) return;
    OpTimes& t = op_times();
    const std::lock_guard<std::mutex> lock(t.mutex);
    // Not inside a timed forward (e.g. a decode step, maybe under graph capture), or another
    // stream's work.
    if (t.labels.empty() || stream != t.timed) return;
    const size_t i = t.labels.size();
    if (t.pool.size() <= i) {
        t.pool.push_back(nullptr);
        SPILLWAY_CUDA_CHECK(cudaEventCreate(&t.pool.back()));
    }
    const auto enqueued = std::chrono::steady_clock::now();
    SPILLWAY_CUDA_CHECK(cudaEventRecord(t.pool[i], stream));
    t.labels.push_back(label);
    if (op_times_mode() == 2) {
        t.host_ms.push_back(std::chrono::duration<double, std::milli>(enqueued - t.last_wait).count());
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
        t.last_wait = std::chrono::steady_clock::now();
    }
}

void op_times_end(cudaStream_t stream) {
    if (!op_times_enabled()) return;
    OpTimes& t = op_times();
    const std::lock_guard<std::mutex> lock(t.mutex);
    if (t.labels.empty() || stream != t.timed) return;
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 1; i < t.labels.size(); ++i) {
        float ms = 0.0f;
        SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&ms, t.pool[i - 1], t.pool[i]));
        auto& total = t.totals[t.labels[i]];
        total.first += ms;
        total.second += 1;
        double& big = t.largest[t.labels[i]];
        big = std::max(big, (double)ms);
        if (i < t.host_ms.size()) t.host_totals[t.labels[i]] += t.host_ms[i];
    }
    t.labels.clear();
    t.forwards += 1;
}

void op_times_cancel(cudaStream_t stream) {
    if (!op_times_enabled()) return;
    OpTimes& t = op_times();
    const std::lock_guard<std::mutex> lock(t.mutex);
    if (stream == t.timed) t.labels.clear();
}

}  // namespace spillway
