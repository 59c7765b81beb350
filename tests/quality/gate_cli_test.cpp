// `spillway gate` end to end through the binary on the tiny synthetic model (random weights:
// it cannot retrieve, so these tests check the plumbing and the metrics' invariants, not
// retrieval quality).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "tests/cli_run.h"

namespace {

struct Result {
    int rc;
    std::string out;  // stdout
    std::string err;  // stderr
};

Result run(const std::string& args, const std::filesystem::path& dir) {
    const std::filesystem::path err = dir / "stderr.txt";
    const spillway::cli_test::CommandRun c = spillway::cli_test::run_command(std::string(SPILLWAY_BINARY) + " " + args + " 2>" + err.string());
    Result r{c.status, c.out, ""};
    std::array<char, 4096> buf;
    size_t n;
    if (FILE* e = fopen(err.c_str(), "r")) {
        while ((n = fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
        fclose(e);
    }
    return r;
}

class GateCommand : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = std::filesystem::temp_directory_path() / ("spillway_gate_test_" + std::to_string(::getpid()));
        std::filesystem::create_directories(dir_);
        model_ = (dir_ / "tiny.gguf").string();
        const Result r = run("make-model --preset tiny --wtype f32 --seed 7 --no-progress -o " + model_, dir_);
        ASSERT_EQ(r.rc, 0) << r.out << r.err;
    }
    static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
    static nlohmann::json run_json(const std::string& args) {
        const Result r = run(args, dir_);
        EXPECT_EQ(r.rc, 0) << args << "\n" << r.out << r.err;
        try {
            return nlohmann::json::parse(r.out);
        } catch (const std::exception& e) {
            ADD_FAILURE() << "not JSON: " << e.what() << "\n" << r.out;
            return {};
        }
    }
    static inline std::filesystem::path dir_;
    static inline std::string model_;
};

}  // namespace

TEST_F(GateCommand, KlOfF16AgainstItselfIsZeroAndQ4IsNot) {
    const nlohmann::json j =
        run_json("gate -m " + model_ + " --kl --tiers f16/f16,q4_0/q4_0 --kl-tokens 256 -b 64 -t 2 --json");
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["mode"], "kl");
    EXPECT_EQ(j["reference"], "f16/f16");
    EXPECT_EQ(j["tokens"], 256);
    ASSERT_EQ(j["tiers"].size(), 2u);
    const auto& same = j["tiers"][0];
    EXPECT_EQ(same["tier"], "f16/f16");
    EXPECT_EQ(same["positions"], 256);
    EXPECT_EQ(same["mean_kl"].get<double>(), 0.0);
    EXPECT_EQ(same["max_abs_dlogit"].get<double>(), 0.0);
    EXPECT_EQ(same["top1_agreement"].get<double>(), 1.0);
    EXPECT_EQ(same["ppl_reference"].get<double>(), same["ppl_candidate"].get<double>());
    const auto& q4 = j["tiers"][1];
    EXPECT_EQ(q4["tier"], "q4_0/q4_0");
    EXPECT_GT(q4["mean_kl"].get<double>(), 0.0);
    EXPECT_GE(q4["max_kl"].get<double>(), q4["mean_kl"].get<double>());
    EXPECT_GT(q4["max_abs_dlogit"].get<double>(), 0.0);
    EXPECT_LE(q4["top1_agreement"].get<double>(), 1.0);
    EXPECT_GT(q4["top1_agreement"].get<double>(), 0.0);
    EXPECT_GT(q4["ppl_reference"].get<double>(), 1.0);
    std::cout << "tiny model, 256 tokens: q4_0/q4_0 mean KL " << q4["mean_kl"] << ", top-1 " << q4["top1_agreement"] << "\n";
}

TEST_F(GateCommand, NiahRunsToCompletionOnOneTaskAndLength) {
    const nlohmann::json j = run_json("gate -m " + model_ +
                                      " --niah --tasks single_1 --lengths 384 --depths 2 --max-answer-tokens 8 -b 128 -t 2 --json --cases");
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["mode"], "niah");
    ASSERT_EQ(j["tiers"].size(), 1u);
    EXPECT_EQ(j["tiers"][0]["tier"], "f16/f16");
    const auto& niah = j["tiers"][0]["niah"];
    EXPECT_EQ(niah["cases"], 2);
    const double score = niah["score"];
    EXPECT_GE(score, 0.0);
    EXPECT_LE(score, 100.0);
    ASSERT_EQ(niah["by_task"].size(), 1u);
    EXPECT_EQ(niah["by_task"][0]["name"], "niah_single_1");
    ASSERT_EQ(niah["by_depth"].size(), 2u);
    EXPECT_EQ(niah["by_length"][0]["name"], "384");
    for (const auto& c : niah["case_list"]) {
        EXPECT_LE(c["prompt_tokens"].get<int>() + 8, 384);
        EXPECT_LE(c["generated_tokens"].get<int>(), 8);
    }
}

TEST_F(GateCommand, NiahInTheChatTemplateAndOnTwoTiers) {
    const nlohmann::json j = run_json("gate -m " + model_ +
                                      " --niah --chat --tiers f16/f16,q8_0/q4_0 --tasks multiquery --lengths 600 --depths 1"
                                      " --max-answer-tokens 4 -b 128 -t 2 --json");
    ASSERT_TRUE(j.is_object());
    ASSERT_EQ(j["tiers"].size(), 2u);
    EXPECT_EQ(j["tiers"][1]["tier"], "q8_0/q4_0");
    EXPECT_EQ(j["tiers"][1]["niah"]["by_task"][0]["name"], "niah_multiquery");
    EXPECT_LE(j["tiers"][0]["niah"]["prefill_tokens"].get<int>() + 4, 600);
}

TEST_F(GateCommand, CellsOnTheCpuRunWhatFitsAndSayWhySpilledCellsDoNot) {
    const std::string profile = std::string(SPILLWAY_SOURCE_DIR) + "/profiles/h200-sxm.json";
    // On the H200 profile the tiny model's f16 cache fits: nothing spills, auto keeps f16.
    const nlohmann::json j = run_json("gate -m " + model_ +
                                      " --cells --tasks single_2 --lengths 320 --depths 1 --max-answer-tokens 4"
                                      " --kl-tokens 128 -b 128 -t 2 --profile " + profile + " --json");
    ASSERT_TRUE(j.is_object());
    ASSERT_EQ(j["cells"].size(), 4u);
    EXPECT_EQ(j["cells"][0]["cell"], "f16_resident");
    EXPECT_EQ(j["cells"][0]["available"], true);
    EXPECT_EQ(j["cells"][0]["kl_reference"], true);
    EXPECT_FALSE(j["cells"][0]["niah"].is_null());
    EXPECT_EQ(j["cells"][1]["cell"], "f16_spill");
    EXPECT_EQ(j["cells"][1]["available"], false);
    EXPECT_NE(j["cells"][1]["unavailable_reason"].get<std::string>().find("--device cuda"), std::string::npos) << j["cells"][1];
    EXPECT_TRUE(j["cells"][1]["decode_tok_s"].is_null());
    EXPECT_EQ(j["cells"][2]["cell"], "q8_resident");
    EXPECT_GE(j["cells"][2]["kl_vs_f16_resident"].get<double>(), 0.0);
    EXPECT_EQ(j["cells"][3]["cell"], "auto");
    EXPECT_EQ(j["cells"][3]["available"], true);  // f16/f16 fits: auto runs it on the CPU
    EXPECT_EQ(j["cells"][3]["chosen_tier"], "f16/f16");
    EXPECT_FALSE(j["cells"][3]["niah"].is_null());
    // Auto runs the same cache as f16_resident: its logits are the reference's.
    EXPECT_EQ(j["cells"][3]["kl_vs_f16_resident"].get<double>(), 0.0);
    ASSERT_EQ(j["checks"].size(), 4u);
    EXPECT_EQ(j["checks"][1]["status"], "NOT AVAILABLE");

    // A budget that spills f16 (the tiny model's weights + 1 MiB): auto quantizes or spills,
    // and whatever spills is reported as needing the CUDA engine, never silently run resident.
    const nlohmann::json k = run_json("gate -m " + model_ +
                                      " --cells --tasks single_2 --lengths 320 --depths 1 --max-answer-tokens 4"
                                      " --kl-tokens 128 -b 128 -t 2 --profile " + profile +
                                      " -c 65536 --vram-target 1 --compute-reserve-mib 0 --vram-free-mib 100000 --json");
    ASSERT_TRUE(k.is_object());
    EXPECT_EQ(k["cells"][1]["available"], false);
    EXPECT_GT(k["f16_window"]["spilled_cells"].get<uint64_t>(), 0u);
    if (k["cells"][3]["available"] == false)
        EXPECT_NE(k["cells"][3]["unavailable_reason"].get<std::string>().find("--device cuda"), std::string::npos);
}

TEST_F(GateCommand, ClearErrors) {
    struct Case {
        std::string args, needle;
    };
    const Case cases[] = {
        {"gate -m " + model_, "exactly one of --niah, --kl or --cells"},
        {"gate -m " + model_ + " --kl --tiers f16/q5_1", "unknown KV tier 'f16/q5_1'"},
        {"gate -m " + model_ + " --niah --tasks single_9", "unknown task 'single_9'"},
        {"gate -m " + model_ + " --niah --device cuda", "--device cuda"},
        {"gate --kl", "-m FILE is required"},
    };
    for (const Case& c : cases) {
        const Result r = run(c.args, dir_);
        EXPECT_NE(r.rc, 0) << c.args;
        EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
    }
}
