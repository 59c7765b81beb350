#include "app/gate_synthetic.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/gate_plans.h"
#include "common/error.h"
#include "probe/device_probe.h"
#include "gguf/ggml_types.h"
#include "model/model_spec.h"
#include "model/presets.h"
#include "plan/knobs.h"
#include "plan/kv_tiers.h"
#include "quality/gate_cells.h"
#ifdef SPILLWAY_HAVE_CUDA
#include "engine/cuda/cuda_bench.h"
#endif

namespace spillway {

namespace {

// One cell's cache: a tier and how many MiB of the filled cache at the bench depth live in
// the host tail (the cells of the depth beyond the planner's window).
struct SpeedCell {
    GateCell cell;
    KvTier tier;
    uint64_t tail_mib = 0;
    std::string note;
};

uint64_t tail_mib_at(const ModelSpec& spec, const KvPlan& plan, uint64_t depth) {
    if (plan.window.spilled_cells == 0 || depth <= plan.window.resident_cells) return 0;
    const uint64_t cell_bytes = kv_footprint(spec, 1, plan.tier).global_bytes_per_cell;
    return ((depth - plan.window.resident_cells) * cell_bytes + kMiB - 1) / kMiB;
}

}  // namespace

int gate_cells_synthetic(const ArgParser& args, bool json) {
    if (!args.has("--cells")) fail("--synthetic runs only the speed columns of --cells");
    if (args.get_or("--device", "cpu") != "cuda") fail("--synthetic builds its weights on the GPU: add --device cuda");
    const std::string preset = *args.get("--synthetic");
    const auto wtype = ggml_type_from_name(args.get_or("--wtype", "q8_0"));
    if (!wtype) fail("--wtype: unknown type '" + args.get_or("--wtype", "") + "'");
    const auto ctx = args.get_int("--ctx-size", 2, int64_t(1) << 31);
    if (!ctx) fail("--synthetic: give -c N, the context the cells run at");
    const uint32_t steps = (uint32_t)args.get_int("--decode-steps", 1, 1 << 16).value_or(32);
    if ((uint64_t)steps + 1 >= (uint64_t)*ctx) fail("--decode-steps must be below -c - 1");
    const ModelSpec spec = model_spec_from_gguf(preset_header(preset, *wtype));
    const uint64_t n_ctx = (uint64_t)*ctx;
    const uint32_t depth = (uint32_t)(n_ctx - steps - 1);

    if (!cuda_device_available() && !args.has("--profile"))
        fail("--synthetic: no usable CUDA GPU on this machine");
    const std::optional<GatePlans> plans = plan_gate_cells(args, false, spec, n_ctx);
    const AutoDecision decision = auto_decision_from(*plans);
    const KvTier f16{KvType::f16, KvType::f16}, q8{KvType::q8_0, KvType::q8_0};
    std::vector<SpeedCell> speed = {
        {GateCell::f16_resident, f16, 0, ""},
        {GateCell::f16_spill, f16, tail_mib_at(spec, plans->f16, depth), ""},
        {GateCell::q8_resident, q8, 0, ""},
        {GateCell::auto_tier, plans->automatic.tier, tail_mib_at(spec, plans->automatic, depth), ""},
    };
    std::vector<CellResult> cells(4);
    for (size_t i = 0; i < speed.size(); ++i) {
        cells[i].cell = speed[i].cell;
        cells[i].kv_tier = kv_tier_name(speed[i].tier);
        cells[i].spilled_mib = (double)speed[i].tail_mib;
    }
    cells[0].kl_reference = true;
    if (speed[1].tail_mib == 0)
        cells[1].unavailable = "f16/f16 fits the budget at ctx " + std::to_string(n_ctx) + ": nothing spills (lower --vram-target)";
    cells[3].chosen_tier = decision.tier;
    cells[3].chosen_note = plans->automatic.probed ? "planned with this machine's measurements" : "planned";

#ifndef SPILLWAY_HAVE_CUDA
    (void)json;
    fail("--synthetic measures the CUDA engine, and this build has none");
#else
    // One bench run per tier, with every spill its cells need (the bench adds the resident
    // row itself), so each synthetic model is built once per tier.
    std::map<std::string, std::vector<size_t>> by_tier;
    for (size_t i = 0; i < speed.size(); ++i)
        if (!cells[i].unavailable) by_tier[kv_tier_name(speed[i].tier)].push_back(i);
    CudaBenchReport last;
    for (const auto& [name, members] : by_tier) {
        CudaBenchOptions o;
        o.synthetic_preset = preset;
        o.wtype = *wtype;
        o.n_prompt = 0;
        o.n_gen = steps;
        o.depths = {depth};
        o.kv_types = {{speed[members[0]].tier.k, speed[members[0]].tier.v}};
        o.show_progress = !json;
        o.spill_mib.clear();
        for (size_t i : members) o.spill_mib.push_back(speed[i].tail_mib);
        std::sort(o.spill_mib.begin(), o.spill_mib.end());
        o.spill_mib.erase(std::unique(o.spill_mib.begin(), o.spill_mib.end()), o.spill_mib.end());
        const CudaBenchReport r = run_cuda_bench(o);
        for (size_t i : members)
            for (const CudaBenchRow& row : r.rows)
                if (row.test.rfind("tg", 0) == 0 && !row.engage &&
                    (speed[i].tail_mib ? row.spill_cells > 0 && row.spill_mib == speed[i].tail_mib : row.spill_cells == 0))
                    cells[i].decode_tok_s = row.tok_s;
        last = r;
    }
    GateThresholds thresholds;
    KnobFlags drop_flag;
    drop_flag.tstar_drop = args.get("--tstar-drop");
    thresholds.tstar_drop = resolve_plan_knobs(drop_flag, process_env()).tstar_drop;
    for (CellResult& c : cells)
        if (!c.unavailable && !c.decode_tok_s) c.unavailable = "the bench returned no decode row for it";
    const std::vector<GateCheck> checks = evaluate_gate_checks(cells, decision, thresholds);
    if (json) {
        nlohmann::json out = gate_cells_json(cells, checks, decision);
        out["mode"] = "cells";
        out["model"] = "synthetic " + preset + " (" + ggml_type_name(*wtype) + ")";
        out["device"] = last.device;
        out["ctx"] = n_ctx;
        out["decode_depth"] = depth;
        out["decode_steps"] = steps;
        out["f16_window"] = {{"resident_cells", plans->f16.window.resident_cells},
                             {"spilled_cells", plans->f16.window.spilled_cells},
                             {"staging_bytes", plans->f16.staging_bytes},
                             {"budget", describe_budget(plans->f16.budget)}};
        out["planner_diagnostics"] = plans->automatic.diagnostics;
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("== quality gate (spec T5 cells, speed columns), synthetic %s (%s) on %s\n", preset.c_str(),
                ggml_type_name(*wtype), last.device.c_str());
    std::printf("random weights: no niah or KL; decode tok/s over %u steps from depth %u of a %llu-cell cache\n",
                steps, depth, (unsigned long long)n_ctx);
    std::printf("f16 window: %s; %llu cells resident, %llu spilled\n\n", describe_budget(plans->f16.budget).c_str(),
                (unsigned long long)plans->f16.window.resident_cells, (unsigned long long)plans->f16.window.spilled_cells);
    std::printf("%s\n", format_gate_table(cells).c_str());
    std::printf("auto: %s — %s [%s]\n", decision.tier.c_str(), decision.reason.c_str(), decision.source.c_str());
    for (const std::string& line : plans->automatic.diagnostics) std::printf("  %s\n", line.c_str());
    std::printf("\n%s", format_gate_checks(checks).c_str());
    return 0;
#endif
}

}  // namespace spillway
