// The trained niah test model (tests/data/trained/niah-llama.gguf, docs/test-model.md) on the
// CPU engine: it must retrieve single needles from prompts it has never seen (a fresh seed per
// run), and its answer must come from the context (a needle value swapped for a fresh random
// one is the value it writes). Short prompts keep it fast under ASan; the long-context numbers
// are the model card's. Skips with a message when the file is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>

#include "engine/cpu/cpu_model.h"
#include "gguf/gguf.h"
#include "quality/logits_backend.h"
#include "quality/niah_runner.h"
#include "tokenizer/tokenizer.h"

using namespace spillway;

namespace {

const std::string kModel = std::string(SPILLWAY_SOURCE_DIR) + "/tests/data/trained/niah-llama.gguf";
constexpr uint32_t kCtx = 384;

struct Loaded {
    CpuModel model;
    std::unique_ptr<Tokenizer> tokenizer;
    TextCodec codec;
    std::unique_ptr<LogitsBackend> backend;
};

std::unique_ptr<Loaded> load_trained() {
    auto m = std::make_unique<Loaded>();
    m->model = load_cpu_model_file(kModel);
    m->tokenizer = std::make_unique<Tokenizer>(m->model.file->header());
    const Tokenizer* tok = m->tokenizer.get();
    m->codec.encode = [tok](const std::string& text) { return tok->encode(text); };
    m->codec.decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
    m->codec.is_end = [tok](int32_t id) { return tok->is_end_of_generation(id); };
    m->backend = make_cpu_logits_backend(m->model, *parse_gate_kv("f16/f16"), kCtx);
    return m;
}

uint64_t fresh_seed() {
    std::random_device rd;
    return ((uint64_t)rd() << 32) ^ rd();
}

#define SKIP_WITHOUT_MODEL()                                                                           \
    if (!std::filesystem::exists(kModel))                                                              \
    GTEST_SKIP() << kModel << " is missing: the trained test model is made by tools/train-niah "      \
                               "(docs/test-model.md)"

TEST(TrainedNiahModel, RetrievesSingleNeedlesFromUnseenPrompts) {
    SKIP_WITHOUT_MODEL();
    auto m = load_trained();
    NiahRunConfig config;
    config.tasks = {NiahTask::single_1, NiahTask::single_2, NiahTask::single_3};
    config.lengths = {kCtx};
    config.n_depths = 2;  // needle at the start and at the end of the haystack
    config.seed = fresh_seed();
    const NiahReport report = run_niah(*m->backend, m->codec, config);
    SCOPED_TRACE("seed " + std::to_string(config.seed) + "\n" + format_niah_table(report));
    ASSERT_EQ(report.cases.size(), 6u);
    // The model card measures 100% at every length up to 8k; allow one miss in six here.
    EXPECT_GE(report.score, 83.0);
    for (const NiahGroup& g : report.by_task) EXPECT_GE(g.score, 50.0) << g.name;
}

TEST(TrainedNiahModel, AnswerIsTheValueInTheContext) {
    SKIP_WITHOUT_MODEL();
    auto m = load_trained();
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    const TokenCounter count = [&](const std::string& text) { return m->codec.encode(text).size(); };
    NiahSample s = make_niah_sample({NiahTask::single_2, kCtx - 64, std::uniform_real_distribution<double>(0, 1)(rng), seed},
                                    count);
    ASSERT_EQ(s.expected.size(), 1u);
    // Swap the needle's value in the prompt for another random 7-digit number: an answer read
    // from the context must follow; one remembered from training cannot.
    std::string value;
    do value = std::to_string(std::uniform_int_distribution<int>(1000000, 9999999)(rng));
    while (value == s.expected[0]);
    const size_t at = s.prompt.find(s.expected[0]);
    ASSERT_NE(at, std::string::npos);
    s.prompt.replace(at, value.size(), value);
    ASSERT_EQ(s.prompt.find(s.expected[0]), std::string::npos);

    const GreedyAnswer a = generate_greedy(*m->backend, m->codec, m->codec.encode(s.prompt + s.answer_prefix), {});
    SCOPED_TRACE("seed " + std::to_string(seed) + ", answer '" + a.text + "'");
    EXPECT_NE(a.text.find(value), std::string::npos) << "expected " << value;
    EXPECT_EQ(a.text.find(s.expected[0]), std::string::npos);
}

}  // namespace
