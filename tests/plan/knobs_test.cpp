#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "plan/knobs.h"

using namespace spillway;

namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
    return [vars](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
    };
}

}  // namespace

TEST(Knobs, DefaultsWhenNothingIsSet) {
    PlanKnobs k = resolve_plan_knobs({}, env_of({}));
    EXPECT_FALSE(k.auto_tier);
    EXPECT_DOUBLE_EQ(k.tstar_drop, 0.20);
    EXPECT_DOUBLE_EQ(k.max_spill_mib, 800);
    EXPECT_FALSE(k.host_ram_gbps);
    EXPECT_FALSE(k.vram_target_mib);
    EXPECT_FALSE(k.type_k);
    EXPECT_FALSE(k.type_v);
}

TEST(Knobs, EnvNamesAliasesAndFlagPrecedence) {
    PlanKnobs k = resolve_plan_knobs({}, env_of({{"OPENCOTI_KV_AUTO_TIER", "1"},
                                                 {"OPENCOTI_KV_TSTAR_DROP", "0.3"},
                                                 {"OPENCOTI_KV_TSTAR_MAX_SPILL_MIB", "0"},
                                                 {"OPENCOTI_KV_HOST_RAM_GBPS", "10.3"},
                                                 {"SPILLWAY_VRAM_TARGET_MIB", "27000"},
                                                 {"SPILLWAY_CACHE_TYPE_K", "q8_0"}}));
    EXPECT_TRUE(k.auto_tier);
    EXPECT_DOUBLE_EQ(k.tstar_drop, 0.3);
    EXPECT_DOUBLE_EQ(k.max_spill_mib, 0);
    EXPECT_DOUBLE_EQ(*k.host_ram_gbps, 10.3);
    EXPECT_EQ(*k.vram_target_mib, 27000u);
    EXPECT_EQ(*k.type_k, KvType::q8_0);

    // SPILLWAY_ wins over the OPENCOTI_ alias; a flag wins over both.
    auto env = env_of({{"SPILLWAY_KV_TSTAR_DROP", "0.5"}, {"OPENCOTI_KV_TSTAR_DROP", "0.9"},
                       {"SPILLWAY_KV_AUTO_TIER", "on"}});
    EXPECT_DOUBLE_EQ(resolve_plan_knobs({}, env).tstar_drop, 0.5);
    KnobFlags flags;
    flags.tstar_drop = "0.7";
    flags.kv_auto_tier = "0";
    PlanKnobs f = resolve_plan_knobs(flags, env);
    EXPECT_DOUBLE_EQ(f.tstar_drop, 0.7);
    EXPECT_FALSE(f.auto_tier);
    flags = {};
    flags.tstar_drop = "1";  // the upper end is allowed
    EXPECT_DOUBLE_EQ(resolve_plan_knobs(flags, env_of({})).tstar_drop, 1.0);
}

struct BadKnob {
    const char* name;      // test name
    KnobFlags flags;
    std::map<std::string, std::string> env;
    const char* expected;  // substring of the error: names the setting and the problem
};

class InvalidKnobs : public ::testing::TestWithParam<BadKnob> {};

TEST_P(InvalidKnobs, AreRejectedWithAClearMessage) {
    const BadKnob& c = GetParam();
    try {
        resolve_plan_knobs(c.flags, env_of(c.env));
        FAIL() << "accepted an invalid value";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos) << e.what();
    }
}

KnobFlags drop(const char* v) {
    KnobFlags f;
    f.tstar_drop = v;
    return f;
}
KnobFlags spill(const char* v) {
    KnobFlags f;
    f.max_spill_mib = v;
    return f;
}
KnobFlags ram(const char* v) {
    KnobFlags f;
    f.host_ram_gbps = v;
    return f;
}
KnobFlags target(const char* v) {
    KnobFlags f;
    f.vram_target_mib = v;
    return f;
}
KnobFlags ctk(const char* v) {
    KnobFlags f;
    f.type_k = v;
    return f;
}
KnobFlags ctv(const char* v) {
    KnobFlags f;
    f.type_v = v;
    return f;
}

INSTANTIATE_TEST_SUITE_P(
    Knobs, InvalidKnobs,
    ::testing::Values(
        BadKnob{"drop_zero", drop("0"), {}, "--tstar-drop: 0 is out of range (0, 1]"},
        BadKnob{"drop_above_one", drop("1.5"), {}, "--tstar-drop: 1.5 is out of range (0, 1]"},
        BadKnob{"drop_negative", drop("-0.2"), {}, "--tstar-drop: -0.2 is out of range"},
        BadKnob{"drop_nan", drop("nan"), {}, "--tstar-drop: 'nan' is not a finite number"},
        BadKnob{"drop_text", drop("twenty"), {}, "--tstar-drop: 'twenty' is not a number"},
        BadKnob{"drop_trailing", drop("0.2x"), {}, "--tstar-drop: '0.2x' is not a number"},
        BadKnob{"drop_empty", drop(""), {}, "--tstar-drop: expected a number"},
        BadKnob{"drop_env_alias", {}, {{"OPENCOTI_KV_TSTAR_DROP", "2"}}, "OPENCOTI_KV_TSTAR_DROP: 2 is out of range"},
        BadKnob{"drop_env", {}, {{"SPILLWAY_KV_TSTAR_DROP", "inf"}}, "SPILLWAY_KV_TSTAR_DROP: 'inf' is not a finite"},
        BadKnob{"spill_negative", spill("-1"), {}, "--max-spill-mib: -1 must be >= 0"},
        BadKnob{"spill_nan", spill("NaN"), {}, "--max-spill-mib: 'NaN' is not a finite number"},
        BadKnob{"spill_env", {}, {{"OPENCOTI_KV_TSTAR_MAX_SPILL_MIB", "lots"}}, "OPENCOTI_KV_TSTAR_MAX_SPILL_MIB: 'lots'"},
        BadKnob{"ram_zero", ram("0"), {}, "--host-ram-gbps: 0 must be a bandwidth in GB/s, > 0"},
        BadKnob{"ram_negative", ram("-9.3"), {}, "--host-ram-gbps: -9.3 must be"},
        BadKnob{"ram_env", {}, {{"SPILLWAY_KV_HOST_RAM_GBPS", "fast"}}, "SPILLWAY_KV_HOST_RAM_GBPS: 'fast' is not a number"},
        BadKnob{"target_zero", target("0"), {}, "--vram-target (MiB): 0 is out of range"},
        BadKnob{"target_fraction", target("27000.5"), {}, "--vram-target (MiB): '27000.5' is not an integer"},
        BadKnob{"target_env", {}, {{"SPILLWAY_VRAM_TARGET_MIB", "-5"}}, "SPILLWAY_VRAM_TARGET_MIB (MiB): -5 is out of range"},
        BadKnob{"switch_env", {}, {{"OPENCOTI_KV_AUTO_TIER", "maybe"}}, "OPENCOTI_KV_AUTO_TIER: 'maybe' is not a boolean"},
        BadKnob{"ctk_unknown", ctk("q5_0"), {}, "-ctk: 'q5_0' is not a KV cache type"},
        BadKnob{"ctv_unknown", ctv("f32"), {}, "-ctv: 'f32' is not a KV cache type"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Knobs, DropModelFromFlagOrEnvAndRejectsUnknownNames) {
    EXPECT_EQ(resolve_plan_knobs({}, env_of({})).drop_model, kDefaultDropModel);
    EXPECT_EQ(resolve_plan_knobs({}, env_of({{"SPILLWAY_KV_DROP_MODEL", "overlap"}})).drop_model, DropModel::overlap);
    KnobFlags flags;
    flags.drop_model = "serial";
    EXPECT_EQ(resolve_plan_knobs(flags, env_of({{"SPILLWAY_KV_DROP_MODEL", "overlap"}})).drop_model, DropModel::serial);
    flags.drop_model = "Overlap";  // names are exact, as the other enum knobs
    try {
        resolve_plan_knobs(flags, env_of({}));
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--drop-model"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("serial, overlap"), std::string::npos) << e.what();
    }
}
