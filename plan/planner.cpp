#include "plan/planner.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "common/error.h"
#include "common/log.h"
#include "probe/profile.h"

namespace spillway {

namespace {

std::string format(const char* fmt, ...) {
    char buf[1024];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, args);
    va_end(args);
    return buf;
}

long long mib(uint64_t bytes) { return std::llround((double)bytes / (double)kMiB); }

// Collects the diagnostics and logs each at WARN as it is made.
struct Diagnostics {
    std::vector<std::string>* lines;
    void warn(const std::string& line) {
        lines->push_back(line);
        log_warn(line);
    }
};

}  // namespace

HostTerms host_terms_from(const ProbeValues& values, const PlanKnobs& knobs) {
    ProbeValues v = values;
    if (knobs.host_ram_gbps) v.host_ram_gbps = knobs.host_ram_gbps;
    if (!v.vram_bw_gbps || !v.pcie_h2d_gbps || !v.host_ram_gbps || !v.c_engage_ms)
        fail(missing_measurements_message(v));
    HostTerms t;
    t.vram_bw_gbps = *v.vram_bw_gbps;
    t.bw = effective_bandwidth(*v.pcie_h2d_gbps, *v.host_ram_gbps);
    t.c_engage_ms = *v.c_engage_ms;
    t.origin = v.origin.empty() ? "probe" : v.origin;
    if (knobs.host_ram_gbps) t.origin += ", host_ram from --host-ram-gbps/SPILLWAY_KV_HOST_RAM_GBPS";
    for (const std::string& o : v.overridden) t.origin += ", " + o;
    if (!(t.vram_bw_gbps > 0) || !(t.bw.gbps > 0) || !(t.c_engage_ms >= 0))
        fail("probe values out of range: bandwidths must be > 0 and c_engage >= 0 (" + t.origin + ")");
    return t;
}

const char* row_verdict_name(RowVerdict verdict) {
    switch (verdict) {
        case RowVerdict::fits: return "fits";
        case RowVerdict::spill_within_tstar: return "spill<=T*";
        case RowVerdict::spill_over_tstar: return "spill>T*";
        case RowVerdict::spills: return "spills";
    }
    return "?";
}

const char* plan_mode_name(PlanMode mode) {
    switch (mode) {
        case PlanMode::auto_off: return "auto-tier off";
        case PlanMode::full_walk: return "auto-tier: full walk";
        case PlanMode::v_walk: return "auto-tier: -ctk pins K, V walks";
        case PlanMode::explicit_v: return "auto-tier disabled by -ctv";
    }
    return "?";
}

LadderRow make_ladder_row(const ModelSpec& model, uint64_t n_ctx, uint64_t budget_bytes, KvTier tier,
                          const HostTerms* terms, const PlanKnobs& knobs) {
    LadderRow row;
    row.tier = tier;
    KvFootprint fp = kv_footprint(model, n_ctx, tier);
    row.kv_bytes = fp.total_bytes();
    StagedSpillWindow staged = spill_window_with_staging(fp, budget_bytes);
    row.window = staged.window;
    row.staging_bytes = staged.staging_bytes;
    bool spills = row.window.spilled_bytes > 0;
    row.verdict = spills ? RowVerdict::spills : RowVerdict::fits;
    if (!terms) return row;

    DropTerms dt;
    dt.t_resident_ms = t_resident_ms(model, n_ctx, tier, terms->vram_bw_gbps);
    dt.c_engage_ms = terms->c_engage_ms;
    dt.bw_eff_gbps = terms->bw.gbps;
    dt.h2d_gbps = terms->bw.pcie_gbps;
    const DropModel drop_model = knobs.drop_model;
    row.t_resident_ms = dt.t_resident_ms;
    row.tstar_unclamped_bytes = tolerable_spill_bytes(drop_model, dt, knobs.tstar_drop);
    // DCA ceiling: past ~800 MiB the DCA-on streaming path falls off a cliff the drop model
    // does not describe, so T* never exceeds it.
    double ceiling = std::floor(knobs.max_spill_mib * (double)kMiB);
    row.tstar_bytes = (uint64_t)std::min<double>((double)*row.tstar_unclamped_bytes, ceiling);
    row.predicted_drop = predicted_drop(drop_model, dt, row.window.spilled_bytes);
    row.predicted_tok_s = 1000.0 / predicted_token_ms(drop_model, dt, row.window.spilled_bytes);
    if (spills)
        row.verdict = row.window.spilled_bytes <= *row.tstar_bytes ? RowVerdict::spill_within_tstar
                                                                   : RowVerdict::spill_over_tstar;
    return row;
}

std::vector<KvTier> ladder_for(const ModelSpec& model, const PlanKnobs& knobs) {
    for (std::optional<KvType> t : {knobs.type_k, knobs.type_v})
        if (t && !kv_type_fits(model, *t))
            fail(std::string("KV type ") + kv_type_name(*t) + " does not fit this model's head dims (" +
                 std::to_string(model.head_dim_k) + "/" + std::to_string(model.head_dim_v) +
                 " are not multiples of its 32-value blocks)");
    std::vector<KvTier> tiers;
    if (knobs.type_v) tiers = {{knobs.type_k.value_or(KvType::f16), *knobs.type_v}};
    else if (knobs.type_k) tiers = v_axis_ladder(*knobs.type_k);
    else tiers = default_kv_ladder();
    // Quantized tiers need head dims that split into whole blocks; f16 always fits.
    std::vector<KvTier> usable;
    for (KvTier t : tiers)
        if (kv_type_fits(model, t.k) && kv_type_fits(model, t.v)) usable.push_back(t);
    return usable;
}

KvPlan plan_kv(const ModelSpec& model, uint64_t n_ctx, const BudgetInputs& budget_inputs, const PlanKnobs& knobs,
               ProbeSource& probe) {
    const DropModel drop_model = knobs.drop_model;
    if (n_ctx == 0) fail("context size must be at least 1 cell");
    KvPlan plan;
    plan.n_ctx = n_ctx;
    plan.budget = compute_budget(budget_inputs);
    std::vector<KvTier> tiers = ladder_for(model, knobs);
    for (KvTier t : tiers) plan.ladder.push_back(make_ladder_row(model, n_ctx, plan.budget.bytes, t, nullptr, knobs));

    auto choose = [&](size_t i, std::string reason) {
        plan.chosen = i;
        const LadderRow& row = plan.ladder[i];
        plan.tier = row.tier;
        plan.kv_bytes = row.kv_bytes;
        plan.window = row.window;
        plan.staging_bytes = row.staging_bytes;
        plan.tstar_bytes = row.tstar_bytes;
        plan.predicted_drop = row.predicted_drop;
        plan.predicted_tok_s = row.predicted_tok_s;
        plan.reason = std::move(reason);
    };
    auto window_reason = [&](const LadderRow& row) {
        if (row.window.spilled_bytes == 0) return std::string("fits");
        return format("window spills %lld MiB (%llu of %llu cells) to host", mib(row.window.spilled_bytes),
                      (unsigned long long)row.window.spilled_cells, (unsigned long long)n_ctx);
    };

    // Switch off: the requested (or default) types, the spill window computed; no probe,
    // no output. This is the byte-identical path the spec requires.
    if (!knobs.auto_tier) {
        plan.mode = PlanMode::auto_off;
        choose(0, "auto-tier off: requested types; " + window_reason(plan.ladder[0]));
        return plan;
    }

    Diagnostics diag{&plan.diagnostics};
    if (knobs.type_v) {
        plan.mode = PlanMode::explicit_v;
        std::string window = window_reason(plan.ladder[0]);
        choose(0, "-ctv given: auto-tier disabled; " + window);
        diag.warn(format("auto KV tier: -ctv %s given → auto-tier disabled, KV tier = %s as requested; %s",
                         kv_type_name(*knobs.type_v), kv_tier_name(plan.tier).c_str(), window.c_str()));
        return plan;
    }
    plan.mode = knobs.type_k ? PlanMode::v_walk : PlanMode::full_walk;
    const char* walk = knobs.type_k ? " (-ctk pins K; V walks f16 → q8_0 → q4_0)" : "";

    const LadderRow& top = plan.ladder[0];
    std::string top_state = top.window.spilled_bytes == 0
                                ? std::string("fits")
                                : format("SPILLS by %lld MiB", mib(top.window.spilled_bytes));
    diag.warn(format("auto KV tier: %s; top tier %s (KV %lld MiB) %s%s", describe_budget(plan.budget).c_str(),
                     kv_tier_name(top.tier).c_str(), mib(top.kv_bytes), top_state.c_str(), walk));

    // Fast path: the top tier fits, nothing to measure.
    if (top.window.spilled_bytes == 0) {
        choose(0, "fits");
        diag.warn(format("auto KV tier = %s (fits; no measurement needed)", kv_tier_name(plan.tier).c_str()));
        return plan;
    }

    // The walk needs T*: measure once, then recompute every row with the terms.
    HostTerms terms = host_terms_from(probe.measure(), knobs);
    plan.probed = true;
    plan.terms = terms;
    diag.warn(format("auto KV tier: probe (%s): vram_bw %.0f GB/s, pcie %.1f GB/s, host_ram %.1f GB/s → bw_eff=%.1f %s; "
                     "c_engage %.2f ms",
                     terms.origin.c_str(), terms.vram_bw_gbps, terms.bw.pcie_gbps, terms.bw.host_ram_gbps, terms.bw.gbps,
                     terms.bw.binding, terms.c_engage_ms));
    for (LadderRow& row : plan.ladder)
        row = make_ladder_row(model, n_ctx, plan.budget.bytes, row.tier, &terms, knobs);

    // The link each model charges the tail to: the serial model the slower of PCIe and the
    // host's single-thread copy (the spec's proxy), the overlap model the measured pinned
    // copy engine, which reads the pinned tail directly.
    const bool overlapped = drop_model == DropModel::overlap;
    const char* link_name = overlapped ? "h2d" : "bw_eff";
    const double link_gbps = overlapped ? terms.bw.pcie_gbps : terms.bw.gbps;
    const char* link_binding = overlapped ? "copy overlapped with compute" : terms.bw.binding;
    std::optional<size_t> pick;
    for (size_t i = 0; i < plan.ladder.size() && !pick; ++i) {
        const LadderRow& row = plan.ladder[i];
        if (row.verdict == RowVerdict::fits) {
            pick = i;
            break;
        }
        std::string clamp = *row.tstar_unclamped_bytes > *row.tstar_bytes
                                ? format(" (clamped from %lld MiB by max-spill %.0f MiB)", mib(*row.tstar_unclamped_bytes),
                                         knobs.max_spill_mib)
                                : std::string();
        diag.warn(format("T* drop-model (%s) — %s: t_resident %.2f ms, c_engage %.2f ms, target_drop=%.2f, %s=%.1f "
                         "→ tolerable spill %lld MiB%s; spill %lld MiB, predicted drop %.1f%% → %s",
                         drop_model_name(drop_model), kv_tier_name(row.tier).c_str(), *row.t_resident_ms,
                         terms.c_engage_ms, knobs.tstar_drop, link_name, link_gbps, mib(*row.tstar_bytes), clamp.c_str(),
                         mib(row.window.spilled_bytes), 100.0 * *row.predicted_drop,
                         row.verdict == RowVerdict::spill_within_tstar ? "accept" : "reject"));
        if (row.verdict == RowVerdict::spill_within_tstar) pick = i;
    }

    if (pick) {
        const LadderRow& row = plan.ladder[*pick];
        if (row.verdict == RowVerdict::fits)
            choose(*pick, "fits");
        else
            choose(*pick, format("spill %lld MiB <= T* %lld MiB: keeps the higher tier, window spills the tail",
                                 mib(row.window.spilled_bytes), mib(*row.tstar_bytes)));
    } else {
        size_t floor = plan.ladder.size() - 1;
        const LadderRow& row = plan.ladder[floor];
        choose(floor, format("floor: spill %lld MiB > T* %lld MiB; the window spills the rest (%llu of %llu cells)",
                             mib(row.window.spilled_bytes), mib(*row.tstar_bytes),
                             (unsigned long long)row.window.spilled_cells, (unsigned long long)n_ctx));
    }
    diag.warn(format("top tier %s SPILLS by %lld MiB … T* tolerable spill %lld MiB (%s=%.1f %s, target_drop=%.2f) → "
                     "auto KV tier = %s (%s)",
                     kv_tier_name(top.tier).c_str(), mib(plan.ladder[0].window.spilled_bytes),
                     mib(*plan.ladder[0].tstar_bytes), link_name, link_gbps, link_binding, knobs.tstar_drop,
                     kv_tier_name(plan.tier).c_str(), plan.reason.c_str()));
    return plan;
}

}  // namespace spillway
