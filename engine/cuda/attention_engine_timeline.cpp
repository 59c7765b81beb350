#include "engine/cuda/attention_engine_timeline.h"

#include <algorithm>
#include <cstdio>

namespace spillway {
namespace {

// attention.cuh's layout (kAttentionTimelineSlots, 4 warps per block); repeated here so this
// file needs no CUDA header. attention.cu checks the slot count against attention_mma.cuh.
constexpr size_t kSlots = 10, kWarpsPerBlock = 4;

}  // namespace

size_t attention_engine_timeline_slots(uint32_t n_head, uint32_t n_head_kv, uint32_t n_splits) {
    return ((size_t)n_head_kv * n_splits * kWarpsPerBlock + n_head) * kSlots;
}

std::string attention_engine_timeline_summary(const std::vector<uint64_t>& stamps, size_t stride, uint32_t n_layer,
                                              uint32_t n_head, uint32_t n_head_kv, uint32_t n_splits) {
    const size_t warps = (size_t)n_head_kv * n_splits * kWarpsPerBlock, merges = n_splits > 1 ? n_head : 0;
    if (stride < (warps + merges) * kSlots || stamps.size() < stride * n_layer) return "";
    struct Layer {
        uint64_t entry = UINT64_MAX, released = UINT64_MAX, end = 0;
        double pre_wait = 0, q = 0, first = 0, loop = 0, tail = 0, merge = 0;
    };
    std::vector<Layer> layers;
    for (uint32_t l = 0; l < n_layer; ++l) {
        const uint64_t* t = stamps.data() + (size_t)l * stride;
        Layer y;
        size_t live = 0, active = 0;
        uint64_t last_done = 0;
        double done_sum = 0;
        for (size_t w = 0; w < warps; ++w) {
            const uint64_t* tw = t + w * kSlots;
            if (tw[0] == 0) continue;  // an empty split (whole waves) or no stamp
            ++live;
            y.entry = std::min(y.entry, tw[0]);
            y.released = std::min(y.released, tw[1]);
            y.pre_wait += (double)(tw[1] - tw[0]);
            y.q += (double)(tw[2] - tw[1]);
            if (tw[7] > 0) {
                ++active;
                y.first += (double)(tw[3] - tw[2]);
                y.loop += (double)(tw[4] - tw[3]);
            }
            last_done = std::max(last_done, tw[6]);
            done_sum += (double)tw[6];
        }
        if (live == 0) return "";
        y.pre_wait /= (double)live, y.q /= (double)live;
        y.first /= (double)std::max<size_t>(1, active), y.loop /= (double)std::max<size_t>(1, active);
        y.tail = (double)last_done - done_sum / (double)live;
        y.end = last_done;
        uint64_t merge_wait = 0;
        for (size_t b = 0; b < merges; ++b) {
            const uint64_t* tb = t + (warps + b) * kSlots;
            if (tb[0] == 0) continue;
            merge_wait = std::max(merge_wait, tb[1]);
            y.end = std::max(y.end, tb[2]);
        }
        if (merges > 0 && merge_wait > 0) y.merge = (double)y.end - (double)std::max(merge_wait, last_done);
        layers.push_back(y);
    }
    // Means over layers; "outside" = from a layer's last attention stamp to the next layer's
    // first attention warp (the rest of the layer as the GPU ran it).
    double span = 0, after_wait = 0, pre_wait = 0, q = 0, first = 0, loop = 0, tail = 0, merge = 0, outside = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
        const Layer& y = layers[l];
        span += (double)(y.end - y.entry);
        after_wait += (double)(y.end - y.released);
        pre_wait += y.pre_wait, q += y.q, first += y.first, loop += y.loop, tail += y.tail, merge += y.merge;
        if (l + 1 < layers.size()) outside += (double)layers[l + 1].entry - (double)y.end;
    }
    const double n = (double)layers.size() * 1000.0;  // ns sums -> us means
    char line[512];
    std::snprintf(line, sizeof line,
                  "attention in the engine (%u splits, mean of %zu layers, us): span %.2f (%.2f after the first "
                  "wait) | per warp: before the wait %.2f, q %.2f, first cells %.2f, loop %.2f | tail %.2f | "
                  "merge after the last warp %.2f | outside the attention %.2f",
                  n_splits, layers.size(), span / n, after_wait / n, pre_wait / n, q / n, first / n, loop / n,
                  tail / n, merge / n, layers.size() > 1 ? outside / ((double)(layers.size() - 1) * 1000.0) : 0.0);
    return line;
}

}  // namespace spillway
