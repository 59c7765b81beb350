// make-model and info, driven through the built binary (as a user runs them) and through
// the library functions behind them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/quants.h"
#include "model/make_model.h"
#include "model/model_spec.h"
#include "tokenizer/tokenizer.h"

using namespace spillway;
namespace fs = std::filesystem;

namespace {

struct RunResult {
    int exit_code = -1;
    std::string out, err;
};

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

class AppModel : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("spillway_app_model_" + std::to_string(::getpid()) + "_" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    RunResult run(const std::string& args) {
        const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
        const std::string command =
            quote(SPILLWAY_BINARY) + " " + args + " >" + quote(out.string()) + " 2>" + quote(err.string());
        const int status = std::system(command.c_str());
        RunResult r;
        r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        r.out = read_file(out);
        r.err = read_file(err);
        return r;
    }

    std::string make(const std::string& name, const std::string& wtype, uint64_t seed) {
        const std::string path = (dir_ / name).string();
        RunResult r = run("make-model --preset tiny --wtype " + wtype + " --seed " + std::to_string(seed) + " -o " +
                          quote(path));
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return path;
    }

    fs::path dir_;
};

size_t count_lines(const std::string& s) { return (size_t)std::count(s.begin(), s.end(), '\n'); }

}  // namespace

TEST_F(AppModel, MakeModelTinyThenInfoJson) {
    const std::string path = make("tiny.gguf", "f16", 42);
    RunResult r = run("info -m " + quote(path) + " -c 1000 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["model"]["arch"], "qwen2");
    EXPECT_EQ(j["model"]["n_layer"], 4);
    EXPECT_EQ(j["model"]["n_embd"], 256);
    EXPECT_EQ(j["model"]["n_head"], 4);
    EXPECT_EQ(j["model"]["n_head_kv"], 2);
    EXPECT_EQ(j["model"]["head_dim_k"], 64);
    EXPECT_EQ(j["model"]["n_vocab"], 768);
    EXPECT_EQ(j["model"]["rope"]["type"], "neox");
    EXPECT_EQ(j["model"]["has_qkv_bias"], true);
    EXPECT_EQ(j["model"]["tied_embeddings"], false);
    EXPECT_EQ(j["file_bytes"], fs::file_size(path));
    // 4 layers x (K + V) x 2 KV heads x 64 dims.
    const auto& tiers = j["kv"]["tiers"];
    ASSERT_EQ(tiers.size(), 6u);
    EXPECT_EQ(j["kv"]["n_ctx"], 1000);
    for (const auto& t : tiers) {
        const auto bytes = [](const std::string& type) { return type == "f16" ? 128 * 2 : type == "q8_0" ? 4 * 34 : 4 * 18; };
        const uint64_t per_cell = 4 * (bytes(t["k"]) + bytes(t["v"]));
        EXPECT_EQ(t["bytes_per_cell"], per_cell) << t.dump();
        EXPECT_EQ(t["total_bytes"], per_cell * 1000) << t.dump();
    }
    EXPECT_EQ(tiers[0]["bytes_per_cell"], 2048);
    // Tensor summary: f16 matrices (7 per layer + embeddings + head), f32 norms and biases.
    EXPECT_EQ(j["weights"]["by_type"]["f16"]["count"], 4 * 7 + 2);
    EXPECT_EQ(j["weights"]["by_type"]["f32"]["count"], 4 * 5 + 1);
    EXPECT_EQ(j["weights"]["tensor_count"], 4 * 12 + 3);
    uint64_t sum = 0;
    for (const auto& [name, t] : j["weights"]["by_type"].items()) sum += t["bytes"].get<uint64_t>();
    EXPECT_EQ(sum, j["weights"]["total_bytes"].get<uint64_t>());
    EXPECT_LT(j["weights"]["total_bytes"].get<uint64_t>(), fs::file_size(path));

    // The human-readable form prints the same facts.
    r = run("info -m " + quote(path) + " -c 1000");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("KV cache at context 1000"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("2.0 KiB"), std::string::npos) << r.out;  // f16/f16 per cell
    EXPECT_NE(r.out.find("q4_0"), std::string::npos) << r.out;
}

TEST_F(AppModel, MakeModelJsonOutput) {
    const std::string path = (dir_ / "m.gguf").string();
    RunResult r = run("make-model --preset tiny --wtype q8_0 --seed 3 -o " + quote(path) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["preset"], "tiny");
    EXPECT_EQ(j["wtype"], "q8_0");
    EXPECT_EQ(j["seed"], 3);
    EXPECT_EQ(j["file_bytes"], fs::file_size(path));
    EXPECT_EQ(j["tensors"], 51);
    EXPECT_GT(j["parameters"].get<uint64_t>(), 1000000u);
    EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST_F(AppModel, SameSeedSameBytesDifferentSeedDifferentBytes) {
    const std::string a = make("a.gguf", "q8_0", 7), b = make("b.gguf", "q8_0", 7), c = make("c.gguf", "q8_0", 8);
    const std::string bytes_a = read_file(a);
    EXPECT_GT(bytes_a.size(), 1000000u);
    EXPECT_TRUE(bytes_a == read_file(b)) << "same seed gave different files";
    const std::string bytes_c = read_file(c);
    ASSERT_EQ(bytes_a.size(), bytes_c.size());
    EXPECT_FALSE(bytes_a == bytes_c) << "different seeds gave the same file";
}

// The written values are the generator's, and have the intended scale: matrices ~N(0, 0.02²),
// norms ~1, through every weight type.
TEST_F(AppModel, WeightsHaveSensibleScaleInEveryType) {
    for (const char* wtype : {"f32", "f16", "bf16", "q8_0"}) {
        SCOPED_TRACE(wtype);
        const std::string path = make(std::string("w_") + wtype + ".gguf", wtype, 11);
        auto file = GgufFile::open(path);
        const GgufHeader& h = file->header();
        for (size_t ti = 0; ti < h.tensors.size(); ++ti) {
            const GgufTensorInfo& t = h.tensors[ti];
            std::vector<float> got(t.n_elements), want(t.n_elements);
            dequantize_row(t.type, file->tensor_data(t), got.data(), t.n_elements);
            const WeightInit init = weight_init_for(t.name);
            synthetic_values(11, ti, init, 0, want.data(), t.n_elements);
            double sum = 0, sum_sq = 0, max_err = 0, max_abs = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                sum += got[i];
                sum_sq += got[i] * got[i];
                max_err = std::max(max_err, (double)std::fabs(got[i] - want[i]));
                max_abs = std::max(max_abs, (double)std::fabs(want[i]));
            }
            const double mean = sum / got.size(), sd = std::sqrt(sum_sq / got.size() - mean * mean);
            if (std::string(wtype) == "f32") ASSERT_EQ(max_err, 0.0) << t.name;
            else ASSERT_LE(max_err, max_abs / 100) << t.name;  // q8_0: half a step of amax/127
            if (init == WeightInit::norm) {
                EXPECT_NEAR(mean, 1.0, 0.02) << t.name;
                EXPECT_NEAR(sd, 0.05, 0.01) << t.name;
            } else if (t.n_elements >= 4096) {
                EXPECT_NEAR(mean, 0.0, 0.003) << t.name;
                EXPECT_NEAR(sd, 0.02, 0.002) << t.name;
            }
        }
        // The file is a complete, loadable model: spec and tokenizer both come up.
        ModelSpec spec = model_spec_from_gguf(h);
        EXPECT_EQ(spec.n_vocab, 768u);
        Tokenizer tok(h);
        EXPECT_EQ(tok.decode(tok.encode("hello world", {.add_special = false})), "hello world");
    }
}

TEST(SyntheticValues, IndependentOfChunking) {
    const uint64_t seed = std::random_device{}();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const size_t n = 100003;
    std::vector<float> whole(n), pieces(n);
    synthetic_values(seed, 5, WeightInit::matrix, 0, whole.data(), n);
    std::mt19937 rng((uint32_t)seed);
    for (size_t first = 0; first < n;) {
        size_t len = std::min<size_t>(n - first, 1 + rng() % 5000);
        synthetic_values(seed, 5, WeightInit::matrix, first, pieces.data() + first, len);
        first += len;
    }
    EXPECT_EQ(whole, pieces);
    std::vector<float> other(n);
    synthetic_values(seed, 6, WeightInit::matrix, 0, other.data(), n);
    EXPECT_NE(whole, other);  // another tensor draws other values
    EXPECT_EQ(weight_init_for("blk.3.attn_norm.weight"), WeightInit::norm);
    EXPECT_EQ(weight_init_for("output_norm.weight"), WeightInit::norm);
    EXPECT_EQ(weight_init_for("blk.0.attn_q.bias"), WeightInit::bias);
    EXPECT_EQ(weight_init_for("token_embd.weight"), WeightInit::matrix);
}

// ---- bad arguments: non-zero exit, one line on stderr that says what is wrong ----------

TEST_F(AppModel, MakeModelBadArguments) {
    const std::string out = quote((dir_ / "x.gguf").string());
    struct Case {
        std::string args, message;
    };
    const Case cases[] = {
        {"make-model --preset gpt5 -o " + out, "unknown preset 'gpt5'"},
        {"make-model --preset tiny --wtype q4_K -o " + out, "unsupported weight type 'q4_K'"},
        {"make-model --preset tiny --wtype f8 -o " + out, "unsupported weight type 'f8'"},
        {"make-model --preset tiny", "-o FILE is required"},
        {"make-model -o " + out, "--preset is required"},
        {"make-model --preset tiny --seed -1 -o " + out, "--seed"},
        {"make-model --preset tiny --seed abc -o " + out, "--seed"},
        {"make-model --preset tiny --bogus -o " + out, "unknown option '--bogus'"},
        {"make-model --preset tiny -o", "needs a value"},
        {"make-model --preset tiny -o " + quote((dir_ / "no_such_dir" / "x.gguf").string()), "cannot"},
    };
    for (const Case& c : cases) {
        RunResult r = run(c.args);
        EXPECT_NE(r.exit_code, 0) << c.args;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << " -> " << r.err;
        EXPECT_EQ(count_lines(r.err), 1u) << c.args << " -> " << r.err;
    }
    EXPECT_FALSE(fs::exists(dir_ / "x.gguf"));
    EXPECT_FALSE(fs::exists(dir_ / "x.gguf.tmp"));
}

TEST_F(AppModel, InfoBadArguments) {
    const std::string junk = (dir_ / "junk.gguf").string();
    std::ofstream(junk) << "this is not a gguf file at all, just some text";
    struct Case {
        std::string args, message;
    };
    const Case cases[] = {
        {"info", "-m FILE is required"},
        {"info -m " + quote((dir_ / "missing.gguf").string()), "missing.gguf"},
        {"info -m " + quote(junk), "junk.gguf"},
        {"info -m " + quote(junk) + " -c 0", ""},
        {"info -m x -c many", "-c"},
        {"info --frobnicate", "unknown option"},
    };
    for (const Case& c : cases) {
        RunResult r = run(c.args);
        EXPECT_NE(r.exit_code, 0) << c.args;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << " -> " << r.err;
        EXPECT_EQ(count_lines(r.err), 1u) << c.args << " -> " << r.err;
    }
}

TEST_F(AppModel, HelpWorksForBothCommands) {
    for (const char* command : {"make-model --help", "info --help", "make-model -h", "info -h"}) {
        RunResult r = run(command);
        EXPECT_EQ(r.exit_code, 0) << command;
        EXPECT_NE(r.out.find("usage: spillway"), std::string::npos) << r.out;
        EXPECT_TRUE(r.err.empty()) << r.err;
    }
    RunResult r = run("make-model --help");
    EXPECT_NE(r.out.find("qwen2.5-14b"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--wtype"), std::string::npos) << r.out;
    r = run("info --help");
    EXPECT_NE(r.out.find("-c, --ctx-size"), std::string::npos) << r.out;
}
