// spillway probe: the measured properties of this GPU and host that the planner uses
// (spec T2/T3), from the cache or measured now.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/args.h"
#include "app/commands.h"
#include "app/model_arg.h"
#include "common/error.h"
#include "probe/machine_probe.h"

namespace spillway {

int cmd_probe(int argc, char** argv) {
    ArgParser args("probe", "Measure (or load cached) GPU and host properties the KV planner uses: VRAM read\n"
                            "bandwidth, pinned host->GPU copy bandwidth, host RAM single-thread copy bandwidth,\n"
                            "attention cost per KV cell for each tier, and c_engage (the fixed per-token cost of\n"
                            "streaming a spilled tail). The attention terms depend on the model's head shape.");
    add_model_options(args);
    args.flag({"--refresh"}, "ignore the cache and measure again");
    args.flag({"--json"}, "print JSON");
    args.epilog("Cache: $SPILLWAY_CACHE_DIR/probes.json, else $XDG_CACHE_HOME/spillway/probes.json, else\n"
                "~/.cache/spillway/probes.json; keyed by GPU UUID, driver and attention shape class.\n"
                "Without -m/--preset the Qwen2.5-14B shape is used.");
    args.parse(argc, argv);
    if (args.help_requested()) {
        std::printf("%s", args.help().c_str());
        return 0;
    }
    if (!cuda_device_available())
        fail("no CUDA GPU is available here (or this build has no CUDA): nothing to measure; "
             "plan with --profile FILE instead (see profiles/)");
    ModelChoice model = model_from_args(args, "qwen2.5-14b");
    MachineProbeResult r = probe_machine(model.spec, args.has("--refresh"));
    const ProbeValues& v = r.values;
    auto num = [](const std::optional<double>& x) { return x ? nlohmann::json(*x) : nlohmann::json(nullptr); };
    if (args.has("--json")) {
        nlohmann::json j = {{"gpu_name", v.gpu_name},
                            {"gpu_uuid", r.key.gpu_uuid},
                            {"driver", r.key.driver},
                            {"shape_class", r.key.shape_class},
                            {"from_cache", r.from_cache},
                            {"cache_path", r.cache_path},
                            {"seconds", r.seconds},
                            {"vram_total_mib", num(v.vram_total_mib)},
                            {"vram_free_mib", num(v.vram_free_mib)},
                            {"vram_bw_gbps", num(v.vram_bw_gbps)},
                            {"pcie_h2d_gbps", num(v.pcie_h2d_gbps)},
                            {"host_ram_gbps", num(v.host_ram_gbps)},
                            {"c_engage_ms", num(v.c_engage_ms)}};
        nlohmann::json cells = nlohmann::json::object();
        for (const auto& [type, ms] : v.attn_ms_per_cell) cells[kv_type_name(type)] = ms;
        j["attn_ms_per_cell"] = cells;
        if (!r.from_cache) j["host_ram_multi_thread_gbps"] = r.host_ram_multi_thread_gbps;
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    auto show = [](const std::optional<double>& x, const char* fmt) {
        char buf[64];
        if (!x) return std::string("n/a");
        std::snprintf(buf, sizeof buf, fmt, *x);
        return std::string(buf);
    };
    std::printf("gpu            %s (%s, driver %s)\n", v.gpu_name.c_str(), r.key.gpu_uuid.c_str(), r.key.driver.c_str());
    std::printf("source         %s %s (%.0f ms)\n", r.from_cache ? "cache" : "measured now, cached in",
                r.cache_path.c_str(), r.seconds * 1000.0);
    std::printf("vram           %s MiB total, %s MiB free\n", show(v.vram_total_mib, "%.0f").c_str(),
                show(v.vram_free_mib, "%.0f").c_str());
    std::printf("vram read      %s GB/s\n", show(v.vram_bw_gbps, "%.0f").c_str());
    std::printf("pinned H2D     %s GB/s\n", show(v.pcie_h2d_gbps, "%.1f").c_str());
    std::printf("host RAM copy  %s GB/s (1 thread)", show(v.host_ram_gbps, "%.1f").c_str());
    if (!r.from_cache) std::printf(", %.1f GB/s (all threads)", r.host_ram_multi_thread_gbps);
    std::printf("\nshape class    %s\n", r.key.shape_class.c_str());
    for (const auto& [type, ms] : v.attn_ms_per_cell)
        std::printf("attention      %-5s %.3g ms per 1k cells per layer\n", kv_type_name(type), ms * 1000.0);
    std::printf("c_engage       %s ms per token\n", show(v.c_engage_ms, "%.3f").c_str());
    return 0;
}

}  // namespace spillway
