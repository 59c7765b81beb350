// `spillway bench` refuses bad input by name before it touches a GPU: these run on any machine
// (the CI has no GPU, so a check that came after the GPU's would fail here with "needs a CUDA
// GPU" instead of the message asserted).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/cli_run.h"

namespace {

using spillway::cli_test::CommandRun;

CommandRun run_bench(const std::string& args) {
    return spillway::cli_test::run_command(std::string("'") + SPILLWAY_BINARY + "' bench " + args + " 2>&1");
}

void expect_refused(const std::string& args, const std::string& message) {
    SCOPED_TRACE("spillway bench " + args);
    const CommandRun r = run_bench(args);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("needs a CUDA GPU"), std::string::npos) << r.out;
}

std::string write_file(const std::string& name, const std::string& bytes) {
    const std::string path = (std::filesystem::temp_directory_path() / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
}

}  // namespace

TEST(BenchCli, RefusesBadModelsByName) {
    expect_refused("--synthetic no-such-shape", "unknown preset 'no-such-shape' (presets: tiny");
    expect_refused("--synthetic tiny --wtype q4_0", "q4_0");  // the engine's or the preset's refusal, by build
    expect_refused("-m /no/such/model.gguf", "/no/such/model.gguf: cannot open");
    const std::string truncated = write_file("spillway-bench-truncated.gguf", std::string("GGUF\x03\x00\x00\x00", 8) + "xx");
    expect_refused("-m " + truncated, "truncated file");
    const std::string not_gguf = write_file("spillway-bench-not-gguf.gguf", "this is not a model file at all");
    expect_refused("-m " + not_gguf, "not a GGUF file");
    std::filesystem::remove(truncated);
    std::filesystem::remove(not_gguf);
}

TEST(BenchCli, RefusesRunsWithNothingToMeasure) {
    expect_refused("--synthetic tiny -p 0 -n 0", "nothing to measure");
    expect_refused("--synthetic tiny -n 0 --spill 64", "--spill measures decode");
    expect_refused("--synthetic tiny -ctk q5_1", "unknown KV type 'q5_1'");
    expect_refused("--synthetic tiny -d 1e9", "-d: bad number");
    expect_refused("--synthetic tiny -r 0", "--repetitions: 0 is out of range");
    expect_refused("-m a.gguf --synthetic tiny", "exactly one of -m FILE or --synthetic PRESET");
}

// bench's -ctk/-ctv take lists of tiers; without a GPU the command must get past its argument
// checks and stop only at "no GPU" (a regression once rejected the lists as a planner axis).
TEST(BenchCli, TierListsParseAndOnlyTheMissingGpuStopsIt) {
    const CommandRun r = run_bench("--synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 4 -d 8192,65536 -ctk f16,q8_0 --spill 0,64");
    if (r.status == 0) {  // a machine with a GPU ran it: both tiers' spilled rows are there
        EXPECT_NE(r.out.find("| f16 | f16 | 65536 | 64 |"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("| q8_0 | q8_0 | 8192 | 64 |"), std::string::npos) << r.out;
    } else {
        EXPECT_EQ(r.out.find("-ctk"), std::string::npos) << r.out;
        EXPECT_TRUE(r.out.find("CUDA") != std::string::npos || r.out.find("GPU") != std::string::npos) << r.out;
    }
    const CommandRun bad = run_bench("--synthetic qwen2.5-14b -ctk f16,q5_9");
    EXPECT_NE(bad.status, 0);
    EXPECT_NE(bad.out.find("-ctk"), std::string::npos) << bad.out;
}
