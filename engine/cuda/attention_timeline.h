#pragma once
// Lab: reading the mma decode attention's timeline stamps (attention_lab_timeline; layout in
// attention.cuh): per launch, the phase means the kernel bench prints (`bench_kernels --only
// "attention timeline"`), and with SPILLWAY_ATTN_ENGINE_TIMELINE=1 in `spillway bench` the
// same stamps recorded in every layer inside the decode graph, summarised per decode row:
// what isolated launches cannot show (the producer overlap, the merge behind the next GEMV,
// the part of each layer outside the attention). Plain host code; no CUDA types.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spillway {

// One launch's phases (ns). Per-warp means over the warps that stamped (an empty split's do
// not); first / loop / steps over the warps that ran steps.
struct AttentionTimelineLaunch {
    uint64_t start = 0;     // the first warp's entry
    uint64_t released = 0;  // the first warp past the dependency wait
    uint64_t last_done = 0; // the last warp's partial written
    uint64_t end = 0;       // the merge's end (the last warp's when one split)
    double entry = 0, entry_spread = 0, pre_wait = 0, q = 0, first = 0, loop = 0, steps = 0, barrier = 0,
           epilogue = 0, stores = 0;
    double tail = 0;  // the last warp done minus the mean warp done
    // Split merge: first block's entry after start, its last dependency wait after the last
    // warp, its run after both, and per block the loads, weighted sums and output.
    double merge_start = 0, merge_wait = 0, merge_run = 0, merge_loads = 0, merge_sums = 0, merge_out = 0;
};

// Stamp slots one launch needs for n_splits splits (every warp, then one per merge block).
size_t attention_timeline_slots(uint32_t n_head, uint32_t n_head_kv, uint32_t n_splits);

// Reads one launch's stamps (warps, then merge blocks). False when no warp stamped.
bool attention_timeline_launch(const uint64_t* stamps, size_t warps, size_t merges, AttentionTimelineLaunch& out);

// One decode step's stamps, layer after layer (stride slots each), from launches of n_splits
// splits: means over layers (us) in one line; empty when nothing was stamped (the mma kernel
// did not run at this depth) or stride is too small for the split count.
std::string attention_engine_timeline_summary(const std::vector<uint64_t>& stamps, size_t stride, uint32_t n_layer,
                                              uint32_t n_head, uint32_t n_head_kv, uint32_t n_splits);

}  // namespace spillway
