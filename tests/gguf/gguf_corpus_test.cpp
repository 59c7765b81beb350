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

}  // namespace
}  // namespace spillway
