// Regression corpus: every file under tests/data/gguf_corpus (fuzzer seeds, minimised
// fuzzer finds, any input that once crashed) must parse or throw spillway::Error.
#include <filesystem>

#include "gguf_test_util.h"

namespace spillway {
namespace {

TEST(GgufCorpus, EveryFileParsesOrThrowsError) {
    const std::filesystem::path dir = std::filesystem::path(SPILLWAY_SOURCE_DIR) / "tests/data/gguf_corpus";
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    size_t files = 0, accepted = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (!entry.is_regular_file()) continue;
        ++files;
        SCOPED_TRACE(entry.path().string());
        // An exact-size heap copy, so an ASan build catches any read past the end.
        const std::vector<uint8_t> bytes = test::read_bytes(entry.path().string());
        std::vector<uint8_t> exact(bytes);
        exact.shrink_to_fit();
        try {
            test::parse(exact);
            ++accepted;
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()).rfind("gguf: ", 0), 0u) << e.what();
        }
    }
    EXPECT_GT(files, 0u);
    EXPECT_GT(accepted, 0u);  // the seeds are valid files
    std::printf("gguf corpus: %zu files, %zu accepted\n", files, accepted);
}

// Files written by a different writer (tools/hf-fixtures' Python exporter) read back with
// the metadata and tensors a model loader needs. (Cross-checked once by hand against the
// @huggingface/gguf parser from npm, which agreed on every key, tensor info and offset.)
TEST(GgufCorpus, FilesFromAnotherWriterParse) {
    const std::filesystem::path dir = std::filesystem::path(SPILLWAY_SOURCE_DIR) / "tests/data/hf";
    size_t files = 0;
    if (std::filesystem::is_directory(dir)) {
        for (const auto& entry : std::filesystem::directory_iterator(dir)) {
            if (entry.path().extension() != ".gguf") continue;
            ++files;
            auto file = GgufFile::open(entry.path().string());
            const GgufValue* arch = file->header().find("general.architecture");
            ASSERT_NE(arch, nullptr) << entry.path();
            EXPECT_EQ(arch->type, GgufValueType::STRING);
            EXPECT_FALSE(file->header().tensors.empty());
            const GgufTensorInfo* embd = file->header().find_tensor("token_embd.weight");
            ASSERT_NE(embd, nullptr) << entry.path();
            EXPECT_EQ(embd->shape.size(), 2u);
            // Every tensor lies inside the mapping: touch its first and last byte.
            uint64_t sum = 0;
            for (const GgufTensorInfo& t : file->header().tensors)
                sum += file->tensor_data(t)[0] + file->tensor_data(t)[t.n_bytes - 1];
            (void)sum;
        }
    }
    if (files == 0) GTEST_SKIP() << "no .gguf files under " << dir;
}

}  // namespace
}  // namespace spillway
