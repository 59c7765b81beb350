// The CPU forward pass against HF transformers (tests/data/hf, made by
// tools/hf-fixtures/make_fixtures.py: tiny random-weight Qwen2 and Llama models, HF run in
// float64). Covers GQA, QKV bias, tied embeddings, head_dim != n_embd/n_head, llama's
// permuted Q/K with normal RoPE, qwen2's NeoX RoPE, non-default RoPE bases.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/cpu/forward.h"
#include "engine/cpu/sampler.h"
#include "test_util.h"

namespace spillway {
namespace {

const std::string kDir = std::string(SPILLWAY_SOURCE_DIR) + "/tests/data/hf/";

std::vector<float> read_f32_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << path;
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
    return v;
}

// Tolerance (the issue's): relative error <= 1e-4 per logits row, f32 weights and the exact
// f32 KV cache against float64. The f16 tier alone moves logits by ~1e-3, so it gets its
// own, looser bound, and must still give the same greedy tokens here.
constexpr double kLogitsTol = 1e-4;
constexpr double kLogitsTolF16Kv = 5e-3;

struct FixtureCase {
    const char* name;
    bool exact_kv;
};

class HfFixture : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(HfFixture, LogitsAndGreedyTokensMatchTransformers) {
    const std::string name = GetParam().name;
    const bool exact_kv = GetParam().exact_kv;
    const double tol = exact_kv ? kLogitsTol : kLogitsTolF16Kv;
    std::ifstream meta_in(kDir + name + ".json");
    ASSERT_TRUE(meta_in.good()) << kDir + name + ".json";
    const nlohmann::json meta = nlohmann::json::parse(meta_in);
    const auto ref = read_f32_file(kDir + name + ".logits.bin");
    const CpuModel model = load_cpu_model_file(kDir + name + ".gguf");
    const uint32_t V = meta["vocab_size"];
    ASSERT_EQ(model.spec.n_vocab, V);

    ThreadPool pool(2);
    double worst = 0;
    for (const auto& p : meta["prompts"]) {
        const std::vector<int32_t> prompt = p["prompt"];
        const std::vector<int32_t> expected = p["generated"];
        const size_t row0 = p["logits_row_offset"];
        KvCache cache = exact_kv ? make_kv_cache_f32(model.spec, 128) : make_kv_cache(model.spec, 128, KvType::f16, KvType::f16);
        CpuForwardState st = make_forward_state(model, (uint32_t)prompt.size(), true, pool.size());
        forward_cpu(model, cache, st, pool, prompt.data(), (uint32_t)prompt.size(), 0);
        for (size_t i = 0; i < prompt.size(); ++i) {
            const double err = test::rel_error(st.logits.data() + i * V, ref.data() + (row0 + i) * V, V);
            worst = std::max(worst, err);
            EXPECT_LE(err, tol) << name << " prompt position " << i;
        }
        // Greedy decode, one token at a time, compared step by step.
        std::vector<int32_t> generated = {argmax(st.logits.data() + (prompt.size() - 1) * V, V)};
        uint32_t pos = (uint32_t)prompt.size();
        while (generated.size() < expected.size()) {
            forward_cpu(model, cache, st, pool, &generated.back(), 1, pos);
            const double err = test::rel_error(st.logits.data(), ref.data() + (row0 + pos) * V, V);
            worst = std::max(worst, err);
            EXPECT_LE(err, tol) << name << " decode position " << pos;
            generated.push_back(argmax(st.logits.data(), V));
            ++pos;
        }
        EXPECT_EQ(generated, expected) << name;
    }
    std::printf("[ %s, %s KV ] worst relative logits error vs HF: %.3g\n", name.c_str(), exact_kv ? "f32" : "f16", worst);
}

INSTANTIATE_TEST_SUITE_P(Models, HfFixture,
                         ::testing::Values(FixtureCase{"qwen2_tiny", true}, FixtureCase{"llama_tiny", true},
                                           FixtureCase{"qwen2_tiny", false}, FixtureCase{"llama_tiny", false}));

}  // namespace
}  // namespace spillway
