#include "plan/knobs.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "common/error.h"
#include "common/parse.h"

namespace spillway {

EnvLookup process_env() {
    return [](const std::string& name) -> std::optional<std::string> {
        if (const char* v = std::getenv(name.c_str())) return std::string(v);
        return std::nullopt;
    };
}

namespace {

struct Setting {
    std::string text;
    std::string what;  // the flag or the variable that supplied it, for error messages
};

// The flag if given, else the first set variable among `env_names`.
std::optional<Setting> lookup(const std::optional<std::string>& flag_value, const char* flag,
                              const std::vector<const char*>& env_names, const EnvLookup& env) {
    if (flag_value) return Setting{*flag_value, flag};
    for (const char* name : env_names)
        if (auto v = env(name)) return Setting{*v, name};
    return std::nullopt;
}

KvType parse_kv_type(const Setting& s) {
    auto type = kv_type_from_name(s.text);
    if (!type) fail(s.what + ": '" + s.text + "' is not a KV cache type (f16, q8_0, q4_0)");
    return *type;
}

}  // namespace

PlanKnobs resolve_plan_knobs(const KnobFlags& flags, const EnvLookup& env) {
    PlanKnobs k;
    if (auto s = lookup(flags.kv_auto_tier, "--kv-auto-tier", {"SPILLWAY_KV_AUTO_TIER", "OPENCOTI_KV_AUTO_TIER"}, env))
        k.auto_tier = parse_bool(s->text, s->what);
    if (auto s = lookup(flags.tstar_drop, "--tstar-drop", {"SPILLWAY_KV_TSTAR_DROP", "OPENCOTI_KV_TSTAR_DROP"}, env)) {
        double x = parse_double(s->text, s->what);
        // 0 would mean "no slowdown at all is tolerable", which the drop model cannot
        // grant (any spill costs c_engage); above 1 is "twice as slow", not a drop.
        if (!(x > 0 && x <= 1))
            fail(s->what + ": " + s->text + " is out of range (0, 1]: the tolerable per-token slowdown, e.g. 0.20");
        k.tstar_drop = x;
    }
    if (auto s = lookup(flags.max_spill_mib, "--max-spill-mib",
                        {"SPILLWAY_KV_TSTAR_MAX_SPILL_MIB", "OPENCOTI_KV_TSTAR_MAX_SPILL_MIB"}, env)) {
        double x = parse_double(s->text, s->what);
        if (x < 0) fail(s->what + ": " + s->text + " must be >= 0 MiB (0 disables spilling by T*)");
        if (x > 1e9) fail(s->what + ": " + s->text + " MiB is out of range");
        k.max_spill_mib = x;
    }
    if (auto s = lookup(flags.host_ram_gbps, "--host-ram-gbps", {"SPILLWAY_KV_HOST_RAM_GBPS", "OPENCOTI_KV_HOST_RAM_GBPS"}, env)) {
        double x = parse_double(s->text, s->what);
        if (!(x > 0) || x > 1e6) fail(s->what + ": " + s->text + " must be a bandwidth in GB/s, > 0");
        k.host_ram_gbps = x;
    }
    if (auto s = lookup(flags.vram_target_mib, "--vram-target", {"SPILLWAY_VRAM_TARGET_MIB"}, env))
        k.vram_target_mib = (uint64_t)parse_int_in(s->text, s->what + " (MiB)", 1, int64_t(1) << 30);
    if (auto s = lookup(flags.type_k, "-ctk", {"SPILLWAY_CACHE_TYPE_K"}, env)) k.type_k = parse_kv_type(*s);
    if (auto s = lookup(flags.type_v, "-ctv", {"SPILLWAY_CACHE_TYPE_V"}, env)) k.type_v = parse_kv_type(*s);
    if (auto s = lookup(flags.drop_model, "--drop-model", {"SPILLWAY_KV_DROP_MODEL"}, env)) {
        auto m = drop_model_from_name(s->text);
        if (!m) fail(s->what + ": '" + s->text + "' is not a drop model (serial, overlap)");
        k.drop_model = *m;
    }
    return k;
}

}  // namespace spillway
