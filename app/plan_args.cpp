#include "app/plan_args.h"

#include "common/error.h"
#include "common/parse.h"
#include "probe/device_probe.h"

namespace spillway {

namespace {

// A measured term's override: the flag, else its environment variable (scripts and services
// set the machine's numbers once), else nothing (measure).
std::optional<double> positive_option(const ArgParser& args, const std::string& name, const std::string& env_name,
                                      bool zero_allowed = false) {
    std::optional<std::string> text = args.get(name);
    std::string source = name;
    if (!text) {
        text = process_env()(env_name);
        source = env_name;
    }
    if (!text) return std::nullopt;
    double x = parse_double(*text, source);
    if (x < 0 || (x == 0 && !zero_allowed))
        fail(source + ": " + *text + (zero_allowed ? " must be >= 0" : " must be > 0"));
    return x;
}

}  // namespace

void add_plan_options(ArgParser& args, bool with_profile) {
    args.flag({"--kv-auto-tier"}, "turn the T*-aware auto-tier on (env SPILLWAY_KV_AUTO_TIER=1)");
    args.option({"--vram-target"}, "MiB", "cap on the process's VRAM; forces a spill below the cache size (env SPILLWAY_VRAM_TARGET_MIB)");
    args.option({"--tstar-drop"}, "X", "tolerable per-token slowdown, in (0, 1]", "0.20");
    args.option({"--max-spill-mib"}, "M", "ceiling on T* (DCA pre-cliff band), >= 0", "800");
    args.option({"--drop-model"}, "M", "drop model of T*: serial (spec) or overlap (copy overlapped)",
                drop_model_name(kDefaultDropModel));
    args.option({"--host-ram-gbps"}, "G", "host RAM bandwidth override (env SPILLWAY_KV_HOST_RAM_GBPS)");
    args.option({"--pcie-gbps"}, "G", "pinned host->device bandwidth override (env SPILLWAY_PCIE_GBPS)");
    args.option({"--vram-bw-gbps"}, "G", "VRAM bandwidth override (env SPILLWAY_VRAM_BW_GBPS)");
    args.option({"--c-engage-ms"}, "MS", "streaming engagement cost override (env SPILLWAY_C_ENGAGE_MS)");
    args.option({"--vram-free-mib"}, "MiB", "free VRAM override (env SPILLWAY_VRAM_FREE_MIB)");
    args.option({"--compute-reserve-mib"}, "MiB", "compute reserve (env SPILLWAY_COMPUTE_RESERVE_MIB; default: estimated from the model)");
    if (with_profile) args.option({"--profile"}, "FILE", "GPU/host profile JSON instead of this machine (see profiles/)");
}

KnobFlags knob_flags_from(const ArgParser& args) {
    KnobFlags flags;
    if (args.has("--kv-auto-tier")) flags.kv_auto_tier = "1";
    flags.tstar_drop = args.get("--tstar-drop");
    flags.max_spill_mib = args.get("--max-spill-mib");
    flags.host_ram_gbps = args.get("--host-ram-gbps");
    flags.vram_target_mib = args.get("--vram-target");
    flags.drop_model = args.get("--drop-model");
    flags.type_k = args.get("-ctk");
    flags.type_v = args.get("-ctv");
    return flags;
}

ProbeOverrides probe_overrides_from(const ArgParser& args) {
    ProbeOverrides o;
    o.vram_free_mib = positive_option(args, "--vram-free-mib", "SPILLWAY_VRAM_FREE_MIB");
    o.vram_bw_gbps = positive_option(args, "--vram-bw-gbps", "SPILLWAY_VRAM_BW_GBPS");
    o.pcie_h2d_gbps = positive_option(args, "--pcie-gbps", "SPILLWAY_PCIE_GBPS");
    o.c_engage_ms = positive_option(args, "--c-engage-ms", "SPILLWAY_C_ENGAGE_MS", true);
    return o;
}

PlanSource plan_source_from(const ArgParser& args) {
    PlanSource s;
    // Undeclared options read as absent: a command without --profile plans this machine.
    if (auto profile = args.get("--profile")) {
        s.values = load_probe_profile(*profile);
    } else if (cuda_device_available()) {
        GpuIdentity gpu = gpu_identity();
        s.values.gpu_name = gpu.name;
        s.values.vram_total_mib = gpu.vram_total_mib;
        s.values.vram_free_mib = gpu.vram_free_mib;
        s.values.origin = "this GPU (" + gpu.name + ")";
        s.use_machine = true;
    } else {
        s.values.origin = "flags";
    }
    s.overrides = probe_overrides_from(args);
    apply_probe_overrides(s.values, s.overrides);
    return s;
}

BudgetInputs budget_inputs_from(const ArgParser& args, const ModelSpec& model, const ProbeValues& values,
                                const PlanKnobs& knobs) {
    BudgetInputs budget;
    std::optional<double> free_mib = values.vram_free_mib ? values.vram_free_mib : values.vram_total_mib;
    if (free_mib) budget.vram_free_bytes = (uint64_t)(*free_mib * (double)kMiB);
    else if (knobs.vram_target_mib) budget.vram_free_bytes = *knobs.vram_target_mib * kMiB;
    else fail("no VRAM size: pass --profile FILE, --vram-free-mib MiB or --vram-target MiB");
    if (knobs.vram_target_mib) budget.vram_target_bytes = *knobs.vram_target_mib * kMiB;
    budget.weight_bytes = model.weight_bytes_total;
    auto reserve = positive_option(args, "--compute-reserve-mib", "SPILLWAY_COMPUTE_RESERVE_MIB", true);
    budget.compute_reserve_bytes = reserve ? (uint64_t)(*reserve * (double)kMiB) : default_compute_reserve_bytes(model);
    return budget;
}

ProbeValues OverriddenMachineProbe::measure() {
    ProbeValues v = machine_.measure();
    apply_probe_overrides(v, overrides_);
    return v;
}

KvPlan plan_from_source(const ModelSpec& model, uint64_t n_ctx, const BudgetInputs& budget, const PlanKnobs& knobs,
                        const PlanSource& source) {
    if (source.use_machine) {
        OverriddenMachineProbe probe(model, source.overrides);
        return plan_kv(model, n_ctx, budget, knobs, probe);
    }
    FixedProbeSource probe(source.values);
    return plan_kv(model, n_ctx, budget, knobs, probe);
}

}  // namespace spillway
