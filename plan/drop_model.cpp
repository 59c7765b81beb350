#include "plan/drop_model.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace spillway {

namespace {
// 1 GB/s moves 1e6 bytes per ms.
constexpr double kBytesPerMsPerGbps = 1e6;
}  // namespace

const char* drop_model_name(DropModel model) {
    switch (model) {
        case DropModel::serial: return "serial";
        case DropModel::overlap: return "overlap";
    }
    return "?";
}

std::optional<DropModel> drop_model_from_name(const std::string& name) {
    if (name == "serial") return DropModel::serial;
    if (name == "overlap") return DropModel::overlap;
    return std::nullopt;
}

EffectiveBandwidth effective_bandwidth(double pcie_gbps, double host_ram_gbps) {
    EffectiveBandwidth bw;
    bw.pcie_gbps = pcie_gbps;
    bw.host_ram_gbps = host_ram_gbps;
    // Ties go to PCIe: it is the link the spec names first.
    bool ram_binds = host_ram_gbps < pcie_gbps;
    bw.gbps = ram_binds ? host_ram_gbps : pcie_gbps;
    bw.binding = ram_binds ? "host-RAM-bound" : "PCIe-bound";
    return bw;
}

uint64_t weight_bytes_read_per_token(const ModelSpec& model) {
    // A token reads one row of the embedding table, not the table; a tied head reads it all.
    if (model.tied_embeddings) return model.weight_bytes_total;
    uint64_t one_row = model.n_vocab ? model.weight_bytes_token_embd / model.n_vocab : 0;
    return model.weight_bytes_total - model.weight_bytes_token_embd + one_row;
}

double t_resident_ms(const ModelSpec& model, uint64_t n_ctx, KvTier tier, double vram_bw_gbps) {
    if (!(vram_bw_gbps > 0)) fail("VRAM bandwidth must be > 0 GB/s");
    double bytes = (double)weight_bytes_read_per_token(model) + (double)kv_footprint(model, n_ctx, tier).total_bytes();
    return bytes / (vram_bw_gbps * kBytesPerMsPerGbps);
}

double predicted_token_ms(DropModel model, const DropTerms& t, uint64_t tail_bytes) {
    switch (model) {
        case DropModel::serial:
            if (tail_bytes == 0) return t.t_resident_ms;
            return t.t_resident_ms + t.c_engage_ms + (double)tail_bytes / (t.bw_eff_gbps * kBytesPerMsPerGbps);
        case DropModel::overlap: {
            if (tail_bytes == 0) return t.t_resident_ms;
            if (!(t.h2d_gbps > 0)) fail("overlap drop model needs the pinned host->GPU bandwidth (> 0 GB/s)");
            double copy_ms = (double)tail_bytes / (t.h2d_gbps * kBytesPerMsPerGbps);
            return std::max(t.t_resident_ms, copy_ms) + t.c_engage_ms;
        }
    }
    fail("unknown drop model");
}

double predicted_drop(DropModel model, const DropTerms& t, uint64_t tail_bytes) {
    return predicted_token_ms(model, t, tail_bytes) / t.t_resident_ms - 1.0;
}

uint64_t tolerable_spill_bytes(DropModel model, const DropTerms& t, double target_drop) {
    switch (model) {
        case DropModel::serial: {
            // T* = (target * t_resident - c_engage) * bw_eff; <= 0 means never spill.
            double ms_left = target_drop * t.t_resident_ms - t.c_engage_ms;
            if (!(ms_left > 0)) return 0;
            double bytes = ms_left * t.bw_eff_gbps * kBytesPerMsPerGbps;
            return (uint64_t)std::floor(bytes);
        }
        case DropModel::overlap: {
            // The copy hides under the resident read up to t_resident; past it the copy is
            // the token time: max(t_res, tail/h2d) + c <= (1 + target) t_res.
            if (!(t.h2d_gbps > 0)) fail("overlap drop model needs the pinned host->GPU bandwidth (> 0 GB/s)");
            if (!(target_drop * t.t_resident_ms - t.c_engage_ms > 0)) return 0;
            double ms_left = (1.0 + target_drop) * t.t_resident_ms - t.c_engage_ms;
            return (uint64_t)std::floor(ms_left * t.h2d_gbps * kBytesPerMsPerGbps);
        }
    }
    fail("unknown drop model");
}

}  // namespace spillway
