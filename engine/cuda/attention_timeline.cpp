#include "engine/cuda/attention_timeline.h"

#include <algorithm>
#include <cstdio>

namespace spillway {
namespace {

// attention.cuh's layout (kAttentionTimelineSlots, 4 warps per block); repeated here so this
// file needs no CUDA header. attention.cu checks the slot count against attention_mma.cuh.
constexpr size_t kSlots = 10, kWarpsPerBlock = 4;

}  // namespace

size_t attention_timeline_slots(uint32_t n_head, uint32_t n_head_kv, uint32_t n_splits) {
    return ((size_t)n_head_kv * n_splits * kWarpsPerBlock + n_head) * kSlots;
}

bool attention_timeline_launch(const uint64_t* t, size_t warps, size_t merges, AttentionTimelineLaunch& y) {
    y = AttentionTimelineLaunch{};
    y.start = UINT64_MAX, y.released = UINT64_MAX;
    size_t live = 0, active = 0;
    uint64_t last_entry = 0;
    for (size_t w = 0; w < warps; ++w) {
        const uint64_t* tw = t + w * kSlots;
        if (tw[0] == 0) continue;  // an empty split (whole waves)
        ++live;
        y.start = std::min(y.start, tw[0]);
        y.released = std::min(y.released, tw[1]);
        last_entry = std::max(last_entry, tw[0]);
    }
    if (live == 0) return false;
    double done_sum = 0;
    for (size_t w = 0; w < warps; ++w) {
        const uint64_t* tw = t + w * kSlots;
        if (tw[0] == 0) continue;
        y.entry += (double)(tw[0] - y.start);
        y.pre_wait += (double)(tw[1] - tw[0]);
        y.q += (double)(tw[2] - tw[1]);
        if (tw[7] > 0) {  // steps run (a count)
            ++active;
            y.first += (double)(tw[3] - tw[2]);
            y.loop += (double)(tw[4] - tw[3]);
            y.steps += (double)tw[7];
        }
        y.barrier += (double)(tw[5] - tw[4]);
        y.epilogue += (double)(tw[8] - tw[5]);
        y.stores += (double)(tw[6] - tw[8]);
        y.last_done = std::max(y.last_done, tw[6]);
        done_sum += (double)tw[6];
    }
    const double n_live = (double)live, n_active = (double)std::max<size_t>(1, active);
    y.entry /= n_live, y.pre_wait /= n_live, y.q /= n_live, y.barrier /= n_live, y.epilogue /= n_live;
    y.stores /= n_live, y.first /= n_active, y.loop /= n_active, y.steps /= n_active;
    y.entry_spread = (double)(last_entry - y.start);
    y.tail = (double)y.last_done - done_sum / n_live;
    y.end = y.last_done;
    uint64_t merge_first = UINT64_MAX, merge_wait = 0;
    size_t stamped = 0;
    for (size_t b = 0; b < merges; ++b) {
        const uint64_t* tb = t + (warps + b) * kSlots;
        if (tb[0] == 0) continue;
        ++stamped;
        merge_first = std::min(merge_first, tb[0]);
        merge_wait = std::max(merge_wait, tb[1]);
        y.end = std::max(y.end, tb[2]);
        y.merge_loads += (double)(tb[3] - tb[1]);
        y.merge_sums += (double)(tb[4] - tb[3]);
        y.merge_out += (double)(tb[2] - tb[4]);
    }
    if (stamped > 0) {
        y.merge_loads /= (double)stamped, y.merge_sums /= (double)stamped, y.merge_out /= (double)stamped;
        y.merge_start = (double)merge_first - (double)y.start;
        y.merge_wait = (double)merge_wait - (double)y.last_done;
        y.merge_run = (double)y.end - (double)std::max(merge_wait, y.last_done);
    }
    return true;
}

std::string attention_engine_timeline_summary(const std::vector<uint64_t>& stamps, size_t stride, uint32_t n_layer,
                                              uint32_t n_head, uint32_t n_head_kv, uint32_t n_splits) {
    const size_t warps = (size_t)n_head_kv * n_splits * kWarpsPerBlock, merges = n_splits > 1 ? n_head : 0;
    if (stride < (warps + merges) * kSlots || stamps.size() < stride * n_layer) return "";
    std::vector<AttentionTimelineLaunch> layers(n_layer);
    for (uint32_t l = 0; l < n_layer; ++l)
        if (!attention_timeline_launch(stamps.data() + (size_t)l * stride, warps, merges, layers[l])) return "";
    // Means over layers; "outside" = from a layer's last attention stamp to the next layer's
    // first attention warp (the rest of the layer as the GPU ran it).
    double span = 0, after_wait = 0, pre_wait = 0, q = 0, first = 0, loop = 0, tail = 0, merge = 0, outside = 0;
    double entry = 0, barrier = 0, epilogue = 0, stores = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
        const AttentionTimelineLaunch& y = layers[l];
        span += (double)(y.end - y.start);
        after_wait += (double)(y.end - y.released);
        pre_wait += y.pre_wait, q += y.q, first += y.first, loop += y.loop, tail += y.tail, merge += y.merge_run;
        entry += y.entry, barrier += y.barrier, epilogue += y.epilogue, stores += y.stores;
        if (l + 1 < layers.size()) outside += (double)layers[l + 1].start - (double)y.end;
    }
    const double n = (double)layers.size() * 1000.0;  // ns sums -> us means
    // Every phase of a warp's life is printed, so that the span's parts add up: entry (after the
    // launch's first warp) + the per-warp phases + the tail + the merge.
    char line[640];
    std::snprintf(line, sizeof line,
                  "attention in the engine (%u splits, mean of %zu layers, us): span %.2f (%.2f after the first "
                  "wait) | per warp: entry %.2f, before the wait %.2f, q %.2f, first cells %.2f, loop %.2f, block "
                  "barrier %.2f, block merge %.2f, partial stores %.2f | tail %.2f | merge after the last warp %.2f | "
                  "outside the attention %.2f",
                  n_splits, layers.size(), span / n, after_wait / n, entry / n, pre_wait / n, q / n, first / n,
                  loop / n, barrier / n, epilogue / n, stores / n, tail / n, merge / n,
                  layers.size() > 1 ? outside / ((double)(layers.size() - 1) * 1000.0) : 0.0);
    return line;
}

}  // namespace spillway
