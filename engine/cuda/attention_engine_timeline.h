#pragma once
// Lab (SPILLWAY_ATTN_ENGINE_TIMELINE=1 in `spillway bench`): the mma decode attention's
// per-warp timeline (attention_lab_timeline) recorded inside the engine's decode graph, one
// stamp area per layer, and summarised per decode row: what the kernel bench's isolated
// launches cannot show (the producer overlap, the merge behind the next GEMV, the part of
// each layer outside the attention). Plain host code over the stamps; no CUDA types.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spillway {

// Stamp slots one layer needs for n_splits splits (every warp, then one per merge block).
size_t attention_engine_timeline_slots(uint32_t n_head, uint32_t n_head_kv, uint32_t n_splits);

// One decode step's stamps, layer after layer (stride slots each), from a launch with n_splits
// splits: means over layers (us) in one line. Empty when nothing was stamped (the mma kernel
// did not run at this depth).
std::string attention_engine_timeline_summary(const std::vector<uint64_t>& stamps, size_t stride, uint32_t n_layer,
                                              uint32_t n_head, uint32_t n_head_kv, uint32_t n_splits);

}  // namespace spillway
