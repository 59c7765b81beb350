#pragma once
// The per-token slowdown ("drop") a spilled KV tail costs, and the tolerable spill T*.
// Every caller goes through predicted_drop() / tolerable_spill_bytes() with a DropModel,
// so a later overlap-aware model (copy engine streaming the tail while the resident part
// is read, DESIGN.md's roofline max()) can be added as a second enumerator beside the
// spec's serial model without touching the ladder walk.
#include <cstdint>
#include <optional>
#include <string>

#include "model/model_spec.h"
#include "plan/kv_tiers.h"

namespace spillway {

enum class DropModel {
    // Spec: drop(tail) = (c_engage + tail/bw_eff) / t_resident; the tail transfer and the
    // engagement step add to the resident per-token time.
    serial,
    // Ours: the copy engine streams each layer's tail from pinned memory while the GPU reads
    // the resident part (DESIGN.md's roofline max()), so
    // token(tail) = max(t_resident, tail/h2d) + c_engage, with h2d the measured pinned
    // host->GPU copy bandwidth (no host-side memcpy: the tail already lives in pinned RAM).
    overlap,
};
const char* drop_model_name(DropModel model);  // "serial", "overlap"
std::optional<DropModel> drop_model_from_name(const std::string& name);

// The measured terms of the drop model for one host, GPU and tier.
struct DropTerms {
    double t_resident_ms = 0;  // per-token time with the tier fully resident
    double c_engage_ms = 0;    // fixed cost of turning the streaming path on
    double bw_eff_gbps = 0;    // serial: min(pcie, host_ram), the rate the tail arrives at
    double h2d_gbps = 0;       // overlap: pinned host->GPU copy bandwidth (the copy engine's)
};

// Which link binds bw_eff, for the diagnostics ("PCIe-bound" / "host-RAM-bound").
struct EffectiveBandwidth {
    double gbps = 0;
    double pcie_gbps = 0;
    double host_ram_gbps = 0;
    const char* binding = "";  // "PCIe-bound" or "host-RAM-bound"
};
EffectiveBandwidth effective_bandwidth(double pcie_gbps, double host_ram_gbps);

// W_active: weight bytes one decode step reads. Every tensor once, except the embedding
// table, of which one row is gathered (a tied head reads the whole table as the head).
uint64_t weight_bytes_read_per_token(const ModelSpec& model);

// t_resident = (W_active + KV bytes read per token) / vram_bw, with the KV read from the
// model's real per-layer structure (GQA widths, local layers capped at their window).
double t_resident_ms(const ModelSpec& model, uint64_t n_ctx, KvTier tier, double vram_bw_gbps);

// Predicted fractional slowdown of spilling `tail_bytes` (0 when nothing spills).
double predicted_drop(DropModel model, const DropTerms& terms, uint64_t tail_bytes);
// Predicted per-token decode time with `tail_bytes` spilled, in ms.
double predicted_token_ms(DropModel model, const DropTerms& terms, uint64_t tail_bytes);
// The largest tail whose predicted drop stays <= target_drop, before any ceiling;
// 0 when even the engagement step alone exceeds the target (T* <= 0: never spill).
uint64_t tolerable_spill_bytes(DropModel model, const DropTerms& terms, double target_drop);

}  // namespace spillway
