// Runs the built `spillway plan` binary the way a script would.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli_run.h"

namespace {

struct PlanRun {
    int status = -1;
    std::string out;  // stdout and, with `2>&1` in the command, stderr
};

// The knobs' environment variables are cleared so the test sees only its flags (and the
// NAME=VALUE assignments in `env_set`, if any).
PlanRun run_plan(const std::string& args, const std::string& env_set = "") {
    std::string cmd = std::string("env -u SPILLWAY_KV_AUTO_TIER -u OPENCOTI_KV_AUTO_TIER -u SPILLWAY_KV_TSTAR_DROP "
                                  "-u OPENCOTI_KV_TSTAR_DROP -u SPILLWAY_KV_TSTAR_MAX_SPILL_MIB "
                                  "-u OPENCOTI_KV_TSTAR_MAX_SPILL_MIB -u SPILLWAY_KV_HOST_RAM_GBPS "
                                  "-u OPENCOTI_KV_HOST_RAM_GBPS -u SPILLWAY_VRAM_TARGET_MIB "
                                  "-u SPILLWAY_CACHE_TYPE_K -u SPILLWAY_CACHE_TYPE_V -u SPILLWAY_PCIE_GBPS "
                                  "-u SPILLWAY_VRAM_BW_GBPS -u SPILLWAY_C_ENGAGE_MS -u SPILLWAY_VRAM_FREE_MIB "
                                  "-u SPILLWAY_COMPUTE_RESERVE_MIB ") +
                      env_set + " '" + SPILLWAY_BINARY + "' plan " + args;
    const spillway::cli_test::CommandRun c = spillway::cli_test::run_command(cmd);
    return {c.status, c.out};
}

std::string profile(const char* name) { return std::string(SPILLWAY_SOURCE_DIR) + "/profiles/" + name; }

}  // namespace

TEST(PlanCli, SpecT5ConfigurationAsJson) {
    PlanRun r = run_plan("--preset qwen2.5-14b --wtype q8_0 -c 65536 --vram-target 27000 --profile " +
                     profile("rtx6000ada-pcie5-ddr5.json") + " --kv-auto-tier --json 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.out;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["decision"]["tier"], "q8_0/q8_0");
    EXPECT_EQ(j["decision"]["spill_bytes"], 0);
    EXPECT_EQ(j["decision"]["probed"], true);
    const auto& f16 = j["ladder"][0];
    EXPECT_EQ(f16["tier"], "f16/f16");
    double spill_mib = f16["spill_bytes"].get<double>() / (1 << 20);
    EXPECT_GT(spill_mib, 1024);
    EXPECT_LT(spill_mib, 2560);
    double tstar_mib = f16["tstar_bytes"].get<double>() / (1 << 20);
    // Our default (overlap) model: the copy hides under the resident read, so T* reaches the
    // DCA ceiling (800 MiB); f16 still spills more than that and the walk quantizes.
    EXPECT_EQ(j["terms"]["drop_model"], "overlap");
    EXPECT_DOUBLE_EQ(tstar_mib, 800);
    EXPECT_EQ(f16["verdict"], "spill>T*");
    EXPECT_EQ(j["terms"]["binding"], "host-RAM-bound");
    EXPECT_FALSE(j["diagnostics"].empty());

    // The spec's serial model, as the spec ran it: T* of a few tens of MiB.
    PlanRun s = run_plan("--preset qwen2.5-14b --wtype q8_0 -c 65536 --vram-target 27000 --profile " +
                         profile("rtx6000ada-pcie5-ddr5.json") + " --kv-auto-tier --drop-model serial --json 2>/dev/null");
    ASSERT_EQ(s.status, 0) << s.out;
    nlohmann::json k = nlohmann::json::parse(s.out);
    EXPECT_EQ(k["terms"]["drop_model"], "serial");
    EXPECT_EQ(k["decision"]["tier"], "q8_0/q8_0");
    double serial_tstar = k["ladder"][0]["tstar_bytes"].get<double>() / (1 << 20);
    EXPECT_GT(serial_tstar, 0);
    EXPECT_LT(serial_tstar, 100);
}

TEST(PlanCli, SwitchOffShowsTheLadderAndTheDefaultDecision) {
    PlanRun r = run_plan("--preset qwen2.5-14b -c 65536 --vram-target 27000 --profile " +
                     profile("rtx6000ada-pcie5-ddr5.json") + " 2>&1");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out.find("warn"), std::string::npos) << "switch off: no diagnostics\n" << r.out;
    EXPECT_NE(r.out.find("q4_0/q4_0"), std::string::npos) << r.out;  // the whole ladder
    EXPECT_NE(r.out.find("decision auto-tier off: f16/f16"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("it would choose q8_0/q8_0"), std::string::npos) << r.out;
}

TEST(PlanCli, InvalidValuesFailWithTheirName) {
    PlanRun r = run_plan("--preset qwen2.5-14b -c 65536 --tstar-drop 1.5 --profile " + profile("rtx3090-pcie4-ddr4.json") +
                     " 2>&1");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("--tstar-drop"), std::string::npos) << r.out;
    r = run_plan("--preset qwen2.5-14b -c 65536 --vram-target 20000 --kv-auto-tier 2>&1");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("--profile"), std::string::npos) << r.out;  // no measurements exist: say where they come from
    r = run_plan("-c 4096 2>&1");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("-m FILE or --preset NAME"), std::string::npos) << r.out;
}

// -m FILE: a tiny synthetic GGUF written by make-model, planned like a real file.
TEST(PlanCli, PlansAGgufFile) {
    std::string path = ::testing::TempDir() + "plan_cli_tiny.gguf";
    std::string make = std::string("'") + SPILLWAY_BINARY + "' make-model --preset tiny --wtype q8_0 --no-progress -o '" +
                       path + "' >/dev/null 2>&1";
    ASSERT_EQ(std::system(make.c_str()), 0);
    PlanRun r = run_plan("-m '" + path + "' -c 4096 --vram-free-mib 2048 --json 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.out;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["decision"]["tier"], "f16/f16");
    EXPECT_EQ(j["decision"]["spill_bytes"], 0);
    EXPECT_EQ(j["model"]["n_layer"], 4);
    EXPECT_EQ(j["terms"], nullptr);  // no profile: bytes only, no predictions
    std::remove(path.c_str());
}

// The measured terms' overrides also come from the environment (flag first): the same plan
// either way, and a bad value names its variable.
TEST(PlanCli, MeasuredTermsFromTheEnvironmentEqualTheFlags) {
    const std::string base = "--preset qwen2.5-14b -c 131072 --vram-target 40000 --kv-auto-tier --host-ram-gbps 30 --json";
    const std::string env_terms =
        "SPILLWAY_VRAM_FREE_MIB=48000 SPILLWAY_VRAM_BW_GBPS=1800 SPILLWAY_C_ENGAGE_MS=0.5";
    PlanRun flags = run_plan(base + " --vram-free-mib 48000 --vram-bw-gbps 1800 --pcie-gbps 25 --c-engage-ms 0.5 2>/dev/null");
    ASSERT_EQ(flags.status, 0) << flags.out;
    PlanRun env = run_plan(base + " 2>/dev/null", env_terms + " SPILLWAY_PCIE_GBPS=25");
    ASSERT_EQ(env.status, 0) << env.out;
    const nlohmann::json a = nlohmann::json::parse(flags.out), b = nlohmann::json::parse(env.out);
    EXPECT_EQ(a["terms"], b["terms"]);
    EXPECT_EQ(a["decision"], b["decision"]);
    EXPECT_DOUBLE_EQ(b["terms"]["pcie_gbps"].get<double>(), 25.0);
    // The flag wins over the environment.
    PlanRun both = run_plan(base + " --pcie-gbps 25 2>/dev/null", env_terms + " SPILLWAY_PCIE_GBPS=99");
    ASSERT_EQ(both.status, 0) << both.out;
    EXPECT_EQ(nlohmann::json::parse(both.out)["terms"], a["terms"]);
    PlanRun bad = run_plan(base + " 2>&1", env_terms + " SPILLWAY_PCIE_GBPS=fast");
    EXPECT_NE(bad.status, 0);
    EXPECT_NE(bad.out.find("SPILLWAY_PCIE_GBPS"), std::string::npos) << bad.out;
}
