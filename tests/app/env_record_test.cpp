// The SPILLWAY_* record that `bench` prints and the timing-bound warning of `bench` / `run`.
#include "app/env_record.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/cli_run.h"

namespace spillway {
namespace {

TEST(EnvRecord, KeepsSpillwaySettingsSortedAndSkipsTheRest) {
    const char* env[] = {"PATH=/usr/bin",
                         "SPILLWAY_LAB_SKIP_MERGE=1",
                         "SPILLWAY_TEST_SEED=7",  // the test harness's own
                         "SPILLWAY_ATTN_MERGE=warp",
                         "SPILLWAY_EMPTY=",
                         "SPILLWAYX=1",
                         "HOME=/root",
                         "SPILLWAY_SHORT_ATTENTION=0",
                         nullptr};
    const std::vector<EnvSetting> got = spillway_env_settings(env);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].name, "SPILLWAY_ATTN_MERGE");
    EXPECT_EQ(got[0].value, "warp");
    EXPECT_EQ(got[1].name, "SPILLWAY_LAB_SKIP_MERGE");
    EXPECT_EQ(got[2].name, "SPILLWAY_SHORT_ATTENTION");
    EXPECT_EQ(env_settings_text(got), "SPILLWAY_ATTN_MERGE=warp, SPILLWAY_LAB_SKIP_MERGE=1, SPILLWAY_SHORT_ATTENTION=0");
    EXPECT_EQ(env_settings_text({}), "none");
    const char* none[] = {nullptr};
    EXPECT_TRUE(spillway_env_settings(none).empty());
}

TEST(EnvRecord, NamesTheTimingBounds) {
    EXPECT_TRUE(is_timing_bound({"SPILLWAY_LAB_SKIP_MERGE", "1"}));
    EXPECT_TRUE(is_timing_bound({"SPILLWAY_LAB_SKIP_DECODE_ATTENTION", "1"}));
    EXPECT_FALSE(is_timing_bound({"SPILLWAY_LAB_SKIP_MERGE", "0"}));
    EXPECT_FALSE(is_timing_bound({"SPILLWAY_LAB_SKIP_MERGE", "yes"}));  // refused by the engine's knob parser
    EXPECT_TRUE(is_timing_bound({"SPILLWAY_HANDOVER", "skip"}));
    EXPECT_FALSE(is_timing_bound({"SPILLWAY_HANDOVER", "fence"}));
    EXPECT_TRUE(is_timing_bound({"SPILLWAY_SHORT_ATTENTION_LAB", "empty"}));
    EXPECT_TRUE(is_timing_bound({"SPILLWAY_SHORT_ATTENTION_LAB", "kvheads"}));
    EXPECT_FALSE(is_timing_bound({"SPILLWAY_SHORT_ATTENTION_LAB", "late"}));
    EXPECT_FALSE(is_timing_bound({"SPILLWAY_ATTN_MERGE", "warp"}));  // a lab, not a bound
}

// `run --device cuda` and `bench` say so on stderr before any GPU work (so on any machine: the
// command may fail after it for want of a GPU or a CUDA build); the CPU engine reads no lab
// knob, so `run` on it says nothing.
TEST(EnvRecord, RunAndBenchWarnAboutATimingBound) {
    const std::string model = (std::filesystem::temp_directory_path() / "spillway-env-record.gguf").string();
    const std::string bin = std::string("'") + SPILLWAY_BINARY + "'";
    const cli_test::CommandRun made =
        cli_test::run_command(bin + " make-model --preset tiny --wtype q8_0 --seed 5 -o '" + model + "' 2>&1");
    ASSERT_EQ(made.status, 0) << made.out;
    const std::string warning = "warning: SPILLWAY_LAB_SKIP_MERGE=1 is a lab timing bound";
    const std::string run = bin + " run -m '" + model + "' -p hi -n 2 --temp 0";
    const cli_test::CommandRun gpu = cli_test::run_command("SPILLWAY_LAB_SKIP_MERGE=1 " + run + " --device cuda 2>&1");
    EXPECT_NE(gpu.out.find("spillway run: " + warning), std::string::npos) << gpu.out;
    const cli_test::CommandRun bench =
        cli_test::run_command("SPILLWAY_LAB_SKIP_MERGE=1 " + bin + " bench --synthetic tiny -p 0 -n 2 2>&1");
    EXPECT_NE(bench.out.find("spillway bench: " + warning), std::string::npos) << bench.out;
    const cli_test::CommandRun cpu = cli_test::run_command("SPILLWAY_LAB_SKIP_MERGE=1 " + run + " 2>&1");
    EXPECT_EQ(cpu.status, 0) << cpu.out;
    EXPECT_EQ(cpu.out.find("timing bound"), std::string::npos) << cpu.out;
    const cli_test::CommandRun plain =
        cli_test::run_command("env -u SPILLWAY_LAB_SKIP_MERGE " + bin + " bench --synthetic tiny -p 0 -n 2 2>&1");
    EXPECT_EQ(plain.out.find("timing bound"), std::string::npos) << plain.out;
    std::filesystem::remove(model);
}

}  // namespace
}  // namespace spillway
