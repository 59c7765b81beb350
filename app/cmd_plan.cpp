// spillway plan: the KV tier and spill decision for a model, a context and a GPU/host
// described by a profile, printed as the whole ladder plus the decision (or JSON).
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/args.h"
#include "app/commands.h"
#include "app/model_arg.h"
#include "app/plan_args.h"
#include "common/error.h"
#include "common/log.h"
#include "common/parse.h"
#include "gguf/gguf.h"
#include "model/model_spec.h"
#include "model/presets.h"
#include "plan/planner.h"
#include "probe/machine_probe.h"
#include "probe/profile.h"

namespace spillway {

namespace {

const char* kEpilog = R"(The decision (spec/tstar_auto_spill.md): walk the ladder f16/f16 -> q8_0/q8_0 ->
q8_0/q4_0 -> q4_0/q4_0 and take the first tier whose spill past the budget is <= T*,
the largest host tail whose predicted per-token slowdown stays under --tstar-drop;
if even the floor spills past T*, the floor is chosen and the window spills the rest.
-ctv disables the walk; -ctk (with default V) pins K and walks V over f16, q8_0, q4_0.

Auto-tier switch OFF (the default, as in the engine): the decision is the requested
types (f16/f16 unless -ctk/-ctv) with their spill window, nothing is measured and no
diagnostics are logged. plan still prints the whole ladder, with predicted drop and
tok/s when a profile supplies the terms, and what --kv-auto-tier would choose.
Switch ON: the T* walk decides and WARN lines on stderr explain each step.

Probe values come from, in order: the override flags below, then --profile FILE, else
this machine's GPU: its measurements are loaded from the probe cache (see spillway probe)
or measured once, and only when the walk needs them. Without a profile and without a GPU
the table shows bytes only and --kv-auto-tier fails when the walk needs measurements.
Shipped profiles:
  profiles/rtx3090-pcie4-ddr4.json  profiles/rtx6000ada-pcie5-ddr5.json  profiles/h200-sxm.json
Budget = min(free VRAM, --vram-target) - weights - compute reserve. Free VRAM is the
profile's vram_free_mib, else its vram_total_mib, else --vram-target alone.

Environment (flags win; the spec's OPENCOTI_ names are accepted as aliases):
  SPILLWAY_KV_AUTO_TIER, SPILLWAY_KV_TSTAR_DROP, SPILLWAY_KV_TSTAR_MAX_SPILL_MIB,
  SPILLWAY_KV_HOST_RAM_GBPS, SPILLWAY_VRAM_TARGET_MIB, SPILLWAY_CACHE_TYPE_K/_V,
  SPILLWAY_KV_DROP_MODEL; the measured terms' overrides SPILLWAY_PCIE_GBPS,
  SPILLWAY_VRAM_BW_GBPS, SPILLWAY_C_ENGAGE_MS, SPILLWAY_VRAM_FREE_MIB,
  SPILLWAY_COMPUTE_RESERVE_MIB

Example (the spec's T5 configuration):
  spillway plan --preset qwen2.5-14b -c 65536 --vram-target 27000 \
      --profile profiles/rtx6000ada-pcie5-ddr5.json --kv-auto-tier)";

long long mib(uint64_t bytes) { return std::llround((double)bytes / (double)kMiB); }

// Rows to display: the planner's when it measured, else recomputed with the profile's
// terms (reading a profile is not a measurement), else bytes only.
std::vector<LadderRow> display_rows(const ModelSpec& model, const KvPlan& plan, const HostTerms* terms,
                                    const PlanKnobs& knobs) {
    if (plan.terms || !terms) return plan.ladder;
    std::vector<LadderRow> rows;
    for (const LadderRow& r : plan.ladder)
        rows.push_back(make_ladder_row(model, plan.n_ctx, plan.budget.bytes, r.tier, terms, knobs));
    return rows;
}

template <typename T>
nlohmann::json opt(const std::optional<T>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json row_json(const LadderRow& r, bool chosen) {
    return {{"tier", kv_tier_name(r.tier)},
            {"k_type", kv_type_name(r.tier.k)},
            {"v_type", kv_type_name(r.tier.v)},
            {"kv_bytes", r.kv_bytes},
            {"resident_bytes", r.window.resident_bytes},
            {"spill_bytes", r.window.spilled_bytes},
            {"resident_cells", r.window.resident_cells},
            {"spilled_cells", r.window.spilled_cells},
            {"staging_bytes", r.staging_bytes},
            {"t_resident_ms", opt(r.t_resident_ms)},
            {"tstar_bytes", opt(r.tstar_bytes)},
            {"tstar_unclamped_bytes", opt(r.tstar_unclamped_bytes)},
            {"predicted_drop", opt(r.predicted_drop)},
            {"predicted_tok_s", opt(r.predicted_tok_s)},
            {"verdict", row_verdict_name(r.verdict)},
            {"chosen", chosen}};
}

std::string fmt_opt(const std::optional<double>& v, const char* fmt) {
    if (!v) return "-";
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, *v);
    return buf;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
    ArgParser args("plan", "Decide the KV cache tier and host spill for a model, context size and GPU/host.");
    add_model_options(args);
    args.option({"-c", "--ctx-size"}, "N", "context size in cells (tokens)");
    args.option({"-ctk", "--cache-type-k"}, "T", "explicit K type (f16, q8_0, q4_0): pins K, V is walked");
    args.option({"-ctv", "--cache-type-v"}, "T", "explicit V type: disables the auto-tier walk");
    add_plan_options(args, true);
    args.flag({"--json"}, "print the plan as JSON on stdout");
    args.epilog(kEpilog);
    args.parse(argc, argv);
    if (args.help_requested()) {
        std::fputs(args.help().c_str(), stdout);
        return 0;
    }

    PlanKnobs knobs = resolve_plan_knobs(knob_flags_from(args), process_env());

    auto ctx_text = args.get("-c");
    if (!ctx_text) fail("-c N (the context size) is required");
    uint64_t n_ctx = (uint64_t)parse_int_in(*ctx_text, "-c", 1, int64_t(1) << 31);

    ModelChoice model = model_from_args(args);

    // Probe values: a profile if given; else this machine's GPU (identity now, bandwidths
    // measured or loaded from the cache only if the walk needs them); else flags alone.
    const PlanSource source = plan_source_from(args);
    const ProbeValues& values = source.values;
    const BudgetInputs budget = budget_inputs_from(args, model.spec, values, knobs);
    KvPlan plan = plan_from_source(model.spec, n_ctx, budget, knobs, source);

    std::optional<HostTerms> terms = plan.terms;
    if (!terms) {
        try {
            terms = host_terms_from(values, knobs);
        } catch (const Error&) {
            // Not needed for the decision (it was made without them): show bytes only.
        }
    }
    std::vector<LadderRow> rows = display_rows(model.spec, plan, terms ? &*terms : nullptr, knobs);

    // With the switch off, say what the walk would choose (its WARN lines swallowed).
    std::optional<std::string> would_choose;
    if (!knobs.auto_tier) {
        PlanKnobs on = knobs;
        on.auto_tier = true;
        ScopedLogCapture quiet;
        try {
            FixedProbeSource what_if(values);
            KvPlan alt = plan_kv(model.spec, n_ctx, budget, on, what_if);
            would_choose = kv_tier_name(alt.tier) + " (" + alt.reason + ")";
        } catch (const Error&) {
            would_choose = "unknown: the walk needs measurements (see --profile)";
        }
    }

    const LadderRow& chosen_row = rows[plan.chosen];
    if (args.has("--json")) {
        nlohmann::json out;
        out["model"] = {{"source", model.label},
                        {"name", model.spec.name},
                        {"arch", arch_name(model.spec.arch)},
                        {"n_layer", model.spec.n_layer},
                        {"weight_bytes", model.spec.weight_bytes_total},
                        {"weight_bytes_read_per_token", weight_bytes_read_per_token(model.spec)}};
        out["n_ctx"] = n_ctx;
        out["knobs"] = {{"auto_tier", knobs.auto_tier},
                        {"tstar_drop", knobs.tstar_drop},
                        {"max_spill_mib", knobs.max_spill_mib},
                        {"host_ram_gbps", opt(knobs.host_ram_gbps)},
                        {"vram_target_mib", opt(knobs.vram_target_mib)},
                        {"type_k", knobs.type_k ? nlohmann::json(kv_type_name(*knobs.type_k)) : nlohmann::json(nullptr)},
                        {"type_v", knobs.type_v ? nlohmann::json(kv_type_name(*knobs.type_v)) : nlohmann::json(nullptr)}};
        out["probe"] = {{"origin", values.origin},
                        {"gpu_name", values.gpu_name},
                        {"vram_total_mib", opt(values.vram_total_mib)},
                        {"vram_free_mib", opt(values.vram_free_mib)},
                        {"vram_bw_gbps", opt(values.vram_bw_gbps)},
                        {"pcie_h2d_gbps", opt(values.pcie_h2d_gbps)},
                        {"host_ram_gbps", opt(values.host_ram_gbps)},
                        {"c_engage_ms", opt(values.c_engage_ms)},
                        {"overridden", values.overridden}};
        out["budget"] = {{"vram_free_bytes", budget.vram_free_bytes},
                         {"vram_target_bytes", opt(budget.vram_target_bytes)},
                         {"weight_bytes", budget.weight_bytes},
                         {"buffer_bytes", budget.buffer_bytes},
                         {"compute_reserve_bytes", budget.compute_reserve_bytes},
                         {"budget_bytes", plan.budget.bytes},
                         {"budget_raw_bytes", plan.budget.raw_bytes}};
        if (terms)
            out["terms"] = {{"vram_bw_gbps", terms->vram_bw_gbps},
                            {"pcie_gbps", terms->bw.pcie_gbps},
                            {"host_ram_gbps", terms->bw.host_ram_gbps},
                            {"bw_eff_gbps", terms->bw.gbps},
                            {"binding", terms->bw.binding},
                            {"c_engage_ms", terms->c_engage_ms},
                            {"drop_model", drop_model_name(knobs.drop_model)},
                            {"origin", terms->origin}};
        else
            out["terms"] = nullptr;
        out["ladder"] = nlohmann::json::array();
        for (size_t i = 0; i < rows.size(); ++i) out["ladder"].push_back(row_json(rows[i], i == plan.chosen));
        out["decision"] = {{"auto_tier", knobs.auto_tier},
                           {"mode", plan_mode_name(plan.mode)},
                           {"tier", kv_tier_name(plan.tier)},
                           {"k_type", kv_type_name(plan.tier.k)},
                           {"v_type", kv_type_name(plan.tier.v)},
                           {"kv_bytes", plan.kv_bytes},
                           {"resident_cells", plan.window.resident_cells},
                           {"spilled_cells", plan.window.spilled_cells},
                           {"resident_bytes", plan.window.resident_bytes},
                           {"spill_bytes", plan.window.spilled_bytes},
                           {"staging_bytes", plan.staging_bytes},
                           {"tstar_bytes", opt(chosen_row.tstar_bytes)},
                           {"predicted_drop", opt(chosen_row.predicted_drop)},
                           {"predicted_tok_s", opt(chosen_row.predicted_tok_s)},
                           {"probed", plan.probed},
                           {"reason", plan.reason},
                           {"with_auto_tier", opt(would_choose)}};
        out["diagnostics"] = plan.diagnostics;
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }

    std::printf("model   %s: %s, %u layers, weights %lld MiB (%lld MiB read per token)\n", model.label.c_str(),
                arch_name(model.spec.arch), model.spec.n_layer, mib(model.spec.weight_bytes_total),
                mib(weight_bytes_read_per_token(model.spec)));
    std::printf("context %llu cells%s\n", (unsigned long long)n_ctx,
                model.spec.n_ctx_train && n_ctx > model.spec.n_ctx_train ? " (longer than the model was trained for)" : "");
    std::printf("gpu     %s (%s)\n", values.gpu_name.empty() ? "unknown" : values.gpu_name.c_str(), values.origin.c_str());
    std::printf("%s\n", describe_budget(plan.budget).c_str());
    if (terms)
        std::printf("terms   vram_bw %.0f GB/s; bw_eff %.1f GB/s %s (pcie %.1f, host_ram %.1f); c_engage %.2f ms; "
                    "target_drop %.2f; max spill %.0f MiB; drop model %s\n",
                    terms->vram_bw_gbps, terms->bw.gbps, terms->bw.binding, terms->bw.pcie_gbps, terms->bw.host_ram_gbps,
                    terms->c_engage_ms, knobs.tstar_drop, knobs.max_spill_mib, drop_model_name(knobs.drop_model));
    else
        std::printf("terms   incomplete: no drop/tok/s predictions (pass --profile FILE or the override flags)\n");
    std::printf("\n%-10s %8s %12s %9s %9s %7s %7s %7s  %s\n", "tier", "KV MiB", "resident MiB", "spill MiB",
                "t_res ms", "T* MiB", "drop", "tok/s", "verdict");
    for (size_t i = 0; i < rows.size(); ++i) {
        const LadderRow& r = rows[i];
        std::string tstar = r.tstar_bytes ? std::to_string(mib(*r.tstar_bytes)) : "-";
        std::string drop = r.predicted_drop ? fmt_opt(100.0 * *r.predicted_drop, "%.1f%%") : "-";
        std::printf("%-10s %8lld %12lld %9lld %9s %7s %7s %7s  %s%s\n", kv_tier_name(r.tier).c_str(), mib(r.kv_bytes),
                    mib(r.window.resident_bytes), mib(r.window.spilled_bytes), fmt_opt(r.t_resident_ms, "%.2f").c_str(),
                    tstar.c_str(), drop.c_str(), fmt_opt(r.predicted_tok_s, "%.1f").c_str(), row_verdict_name(r.verdict),
                    i == plan.chosen ? "  <- chosen" : "");
    }
    std::printf("\ndecision %s: %s — %s\n", plan_mode_name(plan.mode), kv_tier_name(plan.tier).c_str(), plan.reason.c_str());
    std::printf("window   %llu resident cells, %llu spilled cells (%lld MiB to pinned host RAM%s)\n",
                (unsigned long long)plan.window.resident_cells, (unsigned long long)plan.window.spilled_cells,
                mib(plan.window.spilled_bytes),
                plan.staging_bytes ? (", staging ring " + std::to_string(mib(plan.staging_bytes)) + " MiB in VRAM").c_str() : "");
    if (chosen_row.predicted_tok_s)
        std::printf("predict  drop %.1f%%, decode %.1f tok/s (roofline: weights + resident KV over VRAM bandwidth)\n",
                    100.0 * *chosen_row.predicted_drop, *chosen_row.predicted_tok_s);
    if (would_choose)
        std::printf("note     auto-tier is off (--kv-auto-tier or SPILLWAY_KV_AUTO_TIER=1 turns it on); it would choose %s\n",
                    would_choose->c_str());
    return 0;
}

}  // namespace spillway
