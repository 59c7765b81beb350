#pragma once
// The KV tier ladder and what one tier costs for a given model and context.
//
// Ladder (least -> most compression), chosen for the spec's "first tier that fits in
// budget + T*" walk:
//   f16/f16  ->  q8_0/q8_0  ->  q8_0/q4_0  ->  q4_0/q4_0
// Why these steps:
//  * K is more precision-sensitive than V (K errors are amplified through softmax(q.k);
//    V errors are only averaged), so when one axis must go harder, V goes first:
//    the mixed step is q8_0 K / q4_0 V, never q4_0 K / q8_0 V.
//  * No f16 K / q8_0 V step: q8_0 K is already near-lossless (8-bit blocks of 32 with an
//    f16 scale; the spec's T5 gate found q8_0/q8_0 niah == f16 niah), so keeping K at f16
//    buys almost no quality while a mixed f16/quant pair saves only 23% of the cache
//    against q8_0/q8_0's 47%. With it the walk would stop at f16/q8_0 in the spec's T5
//    configuration, a tier the spec never validated.
//  * q8_0/q4_0 sits between q8_0/q8_0 (2176 B per 1024 values of K+V) and q4_0/q4_0
//    (1152 B): it saves 24% against q8_0/q8_0 while keeping K at 8 bits, which often is
//    exactly the step that makes a long context fit (e.g. 14B at 106k on a 24 GB card).
// An explicit -ctk pins K and walks V over {f16, q8_0, q4_0} (spec, requirement #4).
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_spec.h"

namespace spillway {

struct KvTier {
    KvType k = KvType::f16;
    KvType v = KvType::f16;
    bool operator==(const KvTier&) const = default;
};

std::string kv_tier_name(KvTier tier);  // "q8_0/q4_0"

// The full walk used when neither -ctk nor -ctv is given.
std::vector<KvTier> default_kv_ladder();
// The V-only walk under a pinned K: K/f16, K/q8_0, K/q4_0.
std::vector<KvTier> v_axis_ladder(KvType pinned_k);

// KV bytes of a tier split by layer kind. Global layers hold every cell; local
// (sliding-window) layers hold at most swa_window cells and always stay resident,
// so only global layers' cells can be spilled to the host tail.
struct KvFootprint {
    uint64_t n_ctx = 0;
    uint64_t global_bytes_per_cell = 0;  // summed over global layers
    uint64_t local_bytes_per_cell = 0;   // summed over local layers
    uint64_t local_cells = 0;            // min(n_ctx, swa_window) when there are local layers
    uint32_t global_layers = 0;          // layers whose cells can spill
    uint64_t local_bytes() const { return local_bytes_per_cell * local_cells; }
    uint64_t total_bytes() const { return global_bytes_per_cell * n_ctx + local_bytes(); }
};
KvFootprint kv_footprint(const ModelSpec& model, uint64_t n_ctx, KvTier tier);

// How a tier's cache splits into a VRAM-resident window and a host tail for a budget.
// Spill is cell-granular: a cell's K and V of every global layer move together.
struct SpillWindow {
    uint64_t resident_cells = 0;
    uint64_t spilled_cells = 0;
    uint64_t resident_bytes = 0;
    uint64_t spilled_bytes = 0;
};
SpillWindow spill_window(const KvFootprint& footprint, uint64_t budget_bytes);

// The spill engine streams each layer's tail through a ring of VRAM staging buffers
// (engine/cuda/kv_spill.h), and they take their VRAM from the same budget.
inline constexpr uint32_t kSpillStagingBuffers = 2;
inline constexpr uint64_t kSpillChunkBytes = 32ull << 20;  // one buffer: one layer's tail chunk, K + V
// VRAM the staging ring needs for a tail of spilled_bytes (summed over global_layers layers):
// a buffer holds one chunk of one layer's tail, so one layer's tail bounds it below the cap.
// 0 when nothing spills.
uint64_t spill_staging_bytes(uint64_t spilled_bytes, uint32_t global_layers);

// The window once the staging ring is paid from the budget: resident cells shrink until
// resident bytes + staging fit. Equal to spill_window when the cache fits.
struct StagedSpillWindow {
    SpillWindow window;
    uint64_t staging_bytes = 0;
};
StagedSpillWindow spill_window_with_staging(const KvFootprint& footprint, uint64_t budget_bytes);

}  // namespace spillway
