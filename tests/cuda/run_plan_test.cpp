// `spillway run --device cuda` and the auto-tier switch, through the built binary as a user
// runs it: with the switch off nothing is probed (no probe cache file appears), no line is
// added, and the output is byte-identical however the other planner knobs are set; with it
// on the WARN lines appear; a forced spill (--vram-target) still gives the resident tokens.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cuda_test_util.h"

namespace fs = std::filesystem;

namespace {

struct CliRun {
    int status = -1;
    std::string out, err;
};

// The binary under test: the build's, or SPILLWAY_TEST_BINARY where the tests run from
// binaries carried to another machine (tools/device-check.sh --prebuilt), whose build path
// is not there.
std::string spillway_binary() {
    const char* carried = std::getenv("SPILLWAY_TEST_BINARY");
    return carried != nullptr && *carried != '\0' ? std::string(carried) : std::string(SPILLWAY_BINARY);
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

class RunPlan : public ::testing::Test {
protected:
    void SetUp() override {
        SPILLWAY_SKIP_WITHOUT_GPU();
        dir_ = fs::temp_directory_path() / ("spillway_run_plan_" + std::to_string(::getpid()));
        fs::create_directories(dir_ / "cache");
        model_ = (dir_ / "tiny.gguf").string();
        CliRun r = run("", "make-model --preset tiny --wtype q8_0 --seed 5 --no-progress -o " + model_);
        ASSERT_EQ(r.status, 0) << r.err;
    }
    void TearDown() override {
        if (!dir_.empty()) fs::remove_all(dir_);
    }
    // env: "NAME=value ..." prefix; the probe cache is always this test's own folder.
    CliRun run(const std::string& env, const std::string& args) {
        const fs::path out = dir_ / "out.txt", err = dir_ / "err.txt";
        const std::string cmd = "env -u SPILLWAY_KV_AUTO_TIER -u OPENCOTI_KV_AUTO_TIER SPILLWAY_CACHE_DIR=" +
                                (dir_ / "cache").string() + " " + env + " " + spillway_binary() + " " + args + " >" +
                                out.string() + " 2>" + err.string();
        const int status = std::system(cmd.c_str());
        CliRun r;
        r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        r.out = slurp(out);
        r.err = slurp(err);
        return r;
    }
    std::string gen(const std::string& extra) {
        return "run -m " + model_ + " -p 'The quick brown fox' -n 24 --temp 0 --device cuda " + extra;
    }
    // Timing lines differ between runs; everything else must not.
    static std::string without_timings(const std::string& err) {
        std::string kept, line;
        std::istringstream in(err);
        while (std::getline(in, line))
            if (line.rfind("prefill:", 0) != 0 && line.rfind("decode:", 0) != 0) kept += line + "\n";
        return kept;
    }
    bool probe_cache_written() const { return !fs::is_empty(dir_ / "cache"); }

    fs::path dir_;
    std::string model_;
};

TEST_F(RunPlan, SwitchOffProbesNothingPrintsNothingAndKnobsDoNotMatter) {
    const CliRun plain = run("", gen(""));
    ASSERT_EQ(plain.status, 0) << plain.err;
    const CliRun knobs = run("SPILLWAY_KV_AUTO_TIER=0 SPILLWAY_KV_TSTAR_DROP=0.9 SPILLWAY_KV_DROP_MODEL=serial",
                          gen("--tstar-drop 0.5 --max-spill-mib 0 --drop-model overlap"));
    ASSERT_EQ(knobs.status, 0) << knobs.err;
    EXPECT_EQ(plain.out, knobs.out);
    EXPECT_EQ(without_timings(plain.err), without_timings(knobs.err));
    EXPECT_EQ(plain.err.find("auto KV tier"), std::string::npos) << plain.err;
    EXPECT_EQ(plain.err.find("kv cache:"), std::string::npos) << plain.err;
    EXPECT_FALSE(probe_cache_written()) << "the switch is off: nothing may be measured";
}

TEST_F(RunPlan, SwitchOnExplainsItselfAndKeepsTheTokensWhenF16Fits) {
    const CliRun off = run("", gen("--json"));
    const CliRun on = run("", gen("--json --kv-auto-tier"));
    ASSERT_EQ(off.status, 0) << off.err;
    ASSERT_EQ(on.status, 0) << on.err;
    EXPECT_NE(on.err.find("auto KV tier"), std::string::npos) << on.err;
    const auto a = nlohmann::json::parse(off.out), b = nlohmann::json::parse(on.out);
    EXPECT_EQ(a["generated_tokens"], b["generated_tokens"]);
    EXPECT_FALSE(a.contains("kv_plan"));
    ASSERT_TRUE(b.contains("kv_plan"));
    EXPECT_EQ(b["kv_plan"]["tier"], "f16/f16");  // the tiny cache fits any GPU
    EXPECT_EQ(b["kv_plan"]["probed"], false);     // fits: nothing to measure
}

TEST_F(RunPlan, ForcedSpillStreamsTheTailAndKeepsTheTokens) {
    const CliRun resident = run("", gen("--json -c 256"));
    const CliRun spilled = run("", gen("--json -c 256 --resident-cells 9"));
    ASSERT_EQ(resident.status, 0) << resident.err;
    ASSERT_EQ(spilled.status, 0) << spilled.err;
    EXPECT_EQ(nlohmann::json::parse(resident.out)["generated_tokens"],
              nlohmann::json::parse(spilled.out)["generated_tokens"]);
    // A budget that holds no cell is a clear error, not a crash.
    const CliRun none = run("", gen("-c 256 --vram-target 1 --compute-reserve-mib 0"));
    EXPECT_NE(none.status, 0);
    EXPECT_NE(none.err.find("holds no cell"), std::string::npos) << none.err;
}

}  // namespace
