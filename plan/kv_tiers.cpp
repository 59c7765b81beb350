#include "plan/kv_tiers.h"

#include <algorithm>

namespace spillway {

std::string kv_tier_name(KvTier tier) {
    return std::string(kv_type_name(tier.k)) + "/" + kv_type_name(tier.v);
}

std::vector<KvTier> default_kv_ladder() {
    return {{KvType::f16, KvType::f16},
            {KvType::q8_0, KvType::q8_0},
            {KvType::q8_0, KvType::q4_0},
            {KvType::q4_0, KvType::q4_0}};
}

std::vector<KvTier> v_axis_ladder(KvType pinned_k) {
    return {{pinned_k, KvType::f16}, {pinned_k, KvType::q8_0}, {pinned_k, KvType::q4_0}};
}

KvFootprint kv_footprint(const ModelSpec& model, uint64_t n_ctx, KvTier tier) {
    KvFootprint f;
    f.n_ctx = n_ctx;
    bool any_local = false;
    for (uint32_t il = 0; il < model.layers.size(); ++il) {
        uint64_t per_cell = layer_kv_bytes_per_cell(model, il, tier.k, tier.v);
        if (model.layers[il].is_local && model.swa_window > 0) {
            f.local_bytes_per_cell += per_cell;
            any_local = true;
        } else {
            f.global_bytes_per_cell += per_cell;
            ++f.global_layers;
        }
    }
    f.local_cells = any_local ? std::min<uint64_t>(n_ctx, model.swa_window) : 0;
    return f;
}

SpillWindow spill_window(const KvFootprint& f, uint64_t budget_bytes) {
    SpillWindow w;
    if (f.global_bytes_per_cell == 0) {  // nothing spillable: the whole (local) cache stays
        w.resident_cells = f.n_ctx;
        w.resident_bytes = f.total_bytes();
        return w;
    }
    // Local layers' windows are resident first; what is left holds whole global cells.
    uint64_t for_global = budget_bytes > f.local_bytes() ? budget_bytes - f.local_bytes() : 0;
    w.resident_cells = std::min<uint64_t>(f.n_ctx, for_global / f.global_bytes_per_cell);
    w.spilled_cells = f.n_ctx - w.resident_cells;
    w.spilled_bytes = w.spilled_cells * f.global_bytes_per_cell;
    w.resident_bytes = f.total_bytes() - w.spilled_bytes;
    return w;
}

uint64_t spill_staging_bytes(uint64_t spilled_bytes, uint32_t global_layers) {
    if (spilled_bytes == 0) return 0;
    const uint64_t layers = std::max<uint32_t>(1, global_layers);
    const uint64_t per_layer_tail = (spilled_bytes + layers - 1) / layers;
    return std::min<uint64_t>(kSpillChunkBytes, per_layer_tail) * kSpillStagingBuffers;
}

StagedSpillWindow spill_window_with_staging(const KvFootprint& f, uint64_t budget_bytes) {
    StagedSpillWindow s;
    s.window = spill_window(f, budget_bytes);
    if (s.window.spilled_cells == 0) return s;
    // Paying for staging spills more, which can need more staging, up to its cap: iterate
    // until the staging the window needs is the staging it was computed with (the tail at
    // least doubles per round below the cap, so this ends within a few dozen rounds).
    for (int round = 0; round < 64; ++round) {
        uint64_t need = spill_staging_bytes(s.window.spilled_bytes, f.global_layers);
        if (need <= s.staging_bytes) break;
        s.staging_bytes = need;
        s.window = spill_window(f, budget_bytes > s.staging_bytes ? budget_bytes - s.staging_bytes : 0);
    }
    return s;
}

}  // namespace spillway
