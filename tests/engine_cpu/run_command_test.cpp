// `spillway run` end to end through the binary: generation with --json, the logits file,
// and the clear errors the issue asks for.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli_run.h"

namespace {

struct Result {
    int rc;
    std::string out;  // stdout and stderr together
};

Result run(const std::string& args) {
    const spillway::cli_test::CommandRun c = spillway::cli_test::run_command(std::string(SPILLWAY_BINARY) + " " + args + " 2>&1");
    return {c.status, c.out};
}

class RunCommand : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = std::filesystem::temp_directory_path() / ("spillway_run_test_" + std::to_string(::getpid()));
        std::filesystem::create_directories(dir_);
        model_ = (dir_ / "tiny.gguf").string();
        ASSERT_EQ(run("make-model --preset tiny --seed 3 -o " + model_).rc, 0);
    }
    static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
    static inline std::filesystem::path dir_;
    static inline std::string model_;
};

TEST_F(RunCommand, GreedyJsonIsDeterministicAndLogitsFileIsComplete) {
    const std::string logits = (dir_ / "logits.bin").string();
    const std::string args = "run -m " + model_ + " -p \"the cat sat on the mat\" -n 12 --temp 0 -t 2 --json";
    Result a = run(args + " --logits-out " + logits);
    ASSERT_EQ(a.rc, 0) << a.out;
    Result b = run(args + " -ctk f16 -b 2");
    ASSERT_EQ(b.rc, 0) << b.out;
    const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
    EXPECT_EQ(ja["generated_tokens"], jb["generated_tokens"]);  // chunk size does not change greedy output
    const size_t n_prompt = ja["prompt_tokens"].size(), n_gen = ja["generated_tokens"].size();
    EXPECT_GT(n_prompt, 0u);
    EXPECT_GT(ja["timings"]["decode_tok_s"].get<double>(), 0.0);

    std::ifstream in(logits, std::ios::binary);
    std::string header_line;
    std::getline(in, header_line);
    const auto header = nlohmann::json::parse(header_line);
    EXPECT_EQ(header["format"], "spillway-logits");
    const uint32_t V = header["n_vocab"];
    const auto header_bytes = header_line.size() + 1;
    const auto size = std::filesystem::file_size(logits);
    // The last generated token is never evaluated unless generation stopped on EOS.
    const size_t records = (size - header_bytes) / (8 + 4 * (size_t)V);
    EXPECT_EQ((size - header_bytes) % (8 + 4 * (size_t)V), 0u);
    EXPECT_EQ(records, n_prompt + n_gen - 1);
    int32_t token = -1, pos = -1;
    in.read(reinterpret_cast<char*>(&token), 4);
    in.read(reinterpret_cast<char*>(&pos), 4);
    EXPECT_EQ(token, ja["prompt_tokens"][0].get<int32_t>());
    EXPECT_EQ(pos, 0);
}

// -n past the context and -n -1 stop at a full context and say why (stderr; "stop" in --json);
// -n within it stops at -n. The tiny model's greedy text from this prompt never reaches its end
// token within the context, so each reason is known.
TEST_F(RunCommand, SaysWhyGenerationStopped) {
    const std::string base = "run -m " + model_ + " -p \"hello world\" -c 12 --temp 0 -t 2";
    for (const char* n : {"-n 50", "-n -1"}) {
        Result r = run(base + " " + n + " --json");
        ASSERT_EQ(r.rc, 0) << r.out;
        const auto j = nlohmann::json::parse(r.out);
        EXPECT_EQ(j["stop"], "context_full") << n;
        EXPECT_EQ(j["generated_tokens"].size() + j["prompt_tokens"].size(), 12u) << n;
    }
    Result text = run(base + " -n 50");
    ASSERT_EQ(text.rc, 0) << text.out;
    EXPECT_NE(text.out.find("the context (-c 12) is full"), std::string::npos) << text.out;
    Result few = run(base + " -n 3 --json");
    ASSERT_EQ(few.rc, 0) << few.out;
    const auto j = nlohmann::json::parse(few.out);
    EXPECT_EQ(j["stop"], "n_predict");
    EXPECT_EQ(j["generated_tokens"].size(), 3u);
    Result quiet = run(base + " -n 3");
    EXPECT_EQ(quiet.out.find("is full"), std::string::npos) << quiet.out;
    EXPECT_NE(run(base + " -n -2").out.find("--n-predict"), std::string::npos);
}

TEST_F(RunCommand, ClearErrors) {
    struct Case { std::string args, needle; };
    const Case cases[] = {
        {"run -m " + model_ + " -p \"\"", "empty"},
        {"run -m " + model_ + " -p \"a b c d e f g h\" -c 3", "context"},
        {"run -m " + model_ + " -p hi --device tpu", "unknown device"},
        {"run -m " + model_ + " -p hi --device cuda", "cuda"},
        {"run -m /nonexistent/model.gguf -p hi", "/nonexistent/model.gguf"},
        {"run -m " + model_ + " -f /nonexistent/prompt.txt", "prompt file"},
        {"run -m " + model_ + " -p hi -ctk q5_9", "-ctk"},
        {"run -m " + model_ + " -p hi -ctv fp8", "-ctv"},
        {"run -p hi", "-m"},
    };
    for (const Case& c : cases) {
        Result r = run(c.args);
        EXPECT_NE(r.rc, 0) << c.args;
        EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << "\n" << r.out;
        EXPECT_NE(r.out.find("error"), std::string::npos) << c.args << "\n" << r.out;
    }
}

}  // namespace
