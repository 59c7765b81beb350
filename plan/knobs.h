#pragma once
// The planner's user knobs, resolved from flags and environment variables (flag wins).
// Pure: the environment comes in through an EnvLookup so tests inject it, and run/bench/
// serve resolve the same knobs the same way.
//
//   knob              flag               env (first found; OPENCOTI_ names are the spec's)
//   auto-tier switch  --kv-auto-tier     SPILLWAY_KV_AUTO_TIER, OPENCOTI_KV_AUTO_TIER   off
//   drop target       --tstar-drop X     SPILLWAY_KV_TSTAR_DROP, OPENCOTI_KV_TSTAR_DROP   0.20, (0,1]
//   DCA ceiling       --max-spill-mib M  SPILLWAY_KV_TSTAR_MAX_SPILL_MIB, OPENCOTI_...     800, >= 0
//   host RAM GB/s     --host-ram-gbps G  SPILLWAY_KV_HOST_RAM_GBPS, OPENCOTI_...           measured
//   VRAM cap          --vram-target MiB  SPILLWAY_VRAM_TARGET_MIB                         none
//   K / V type        -ctk T / -ctv T    SPILLWAY_CACHE_TYPE_K / SPILLWAY_CACHE_TYPE_V    f16
//   drop model        --drop-model M     SPILLWAY_KV_DROP_MODEL       serial | overlap   (kDefaultDropModel)
#include <functional>
#include <optional>
#include <string>

#include "model/model_spec.h"
#include "plan/drop_model.h"

namespace spillway {

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();  // std::getenv

// The drop model the planner uses unless told otherwise: the one whose predictions matched
// the measured spill sweep best (README, "Drop model sweep").
inline constexpr DropModel kDefaultDropModel = DropModel::overlap;

struct PlanKnobs {
    bool auto_tier = false;
    double tstar_drop = 0.20;
    double max_spill_mib = 800;               // DCA ceiling on T*
    std::optional<double> host_ram_gbps;      // overrides the measured host RAM bandwidth
    std::optional<uint64_t> vram_target_mib;
    std::optional<KvType> type_k, type_v;     // set only when the user chose them
    DropModel drop_model = kDefaultDropModel;
};

// Raw text of each knob as given on the command line (nullopt: not given).
struct KnobFlags {
    std::optional<std::string> kv_auto_tier;  // "1" for the bare flag
    std::optional<std::string> tstar_drop;
    std::optional<std::string> max_spill_mib;
    std::optional<std::string> host_ram_gbps;
    std::optional<std::string> vram_target_mib;
    std::optional<std::string> type_k;
    std::optional<std::string> type_v;
    std::optional<std::string> drop_model;
};

// Throws spillway::Error naming the flag or variable on any invalid value.
PlanKnobs resolve_plan_knobs(const KnobFlags& flags, const EnvLookup& env);

}  // namespace spillway
