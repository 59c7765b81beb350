// Writer -> reader round trips with random metadata and random tensor data (fresh seeds,
// printed on failure), plus the writer's own error handling.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "gguf_test_util.h"

namespace spillway {
namespace {

using test::RawGguf;
using test::TempDir;

constexpr GgufValueType kScalarTypes[] = {
    GgufValueType::UINT8,   GgufValueType::INT8,   GgufValueType::UINT16, GgufValueType::INT16,
    GgufValueType::UINT32,  GgufValueType::INT32,  GgufValueType::FLOAT32, GgufValueType::BOOL,
    GgufValueType::STRING,  GgufValueType::UINT64, GgufValueType::INT64,  GgufValueType::FLOAT64,
};

GgufValue random_scalar(GgufValueType type, std::mt19937_64& rng) {
    GgufValue v;
    v.type = type;
    auto bits = [&](int n) { return n == 64 ? rng() : rng() & ((uint64_t{1} << n) - 1); };
    auto sbits = [&](int n) {  // sign-extend an n-bit random value
        uint64_t u = bits(n);
        if (n < 64 && (u >> (n - 1)) & 1) u |= ~((uint64_t{1} << n) - 1);
        return static_cast<int64_t>(u);
    };
    switch (type) {
        case GgufValueType::UINT8: v.u = bits(8); break;
        case GgufValueType::UINT16: v.u = bits(16); break;
        case GgufValueType::UINT32: v.u = bits(32); break;
        case GgufValueType::UINT64: v.u = bits(64); break;
        case GgufValueType::INT8: v.i = sbits(8); break;
        case GgufValueType::INT16: v.i = sbits(16); break;
        case GgufValueType::INT32: v.i = sbits(32); break;
        case GgufValueType::INT64: v.i = sbits(64); break;
        case GgufValueType::FLOAT32:
            v.f = std::uniform_real_distribution<float>(-1e6f, 1e6f)(rng);
            break;
        case GgufValueType::FLOAT64: v.f = std::uniform_real_distribution<double>(-1e300, 1e300)(rng); break;
        case GgufValueType::BOOL: v.b = rng() & 1; break;
        case GgufValueType::STRING: {
            size_t n = rng() % 40;
            for (size_t k = 0; k < n; ++k) v.s.push_back(static_cast<char>(rng() & 0xff));  // any bytes, NUL too
            break;
        }
        case GgufValueType::ARRAY: break;
    }
    return v;
}

// An array nested `depth` levels deep whose innermost elements are of `leaf` type.
GgufValue random_nested(int depth, GgufValueType leaf, std::mt19937_64& rng) {
    std::vector<GgufValue> items;
    size_t n = 1 + rng() % 3;
    for (size_t k = 0; k < n; ++k)
        items.push_back(depth == 1 ? random_scalar(leaf, rng) : random_nested(depth - 1, leaf, rng));
    return GgufValue::make_array(depth == 1 ? leaf : GgufValueType::ARRAY, std::move(items));
}

struct TensorSpec {
    GgmlType type;
    std::vector<uint64_t> shape;
};

GgufHeader random_header(std::mt19937_64& rng, uint32_t version, uint64_t alignment) {
    GgufHeader h;
    h.version = version;
    h.alignment = alignment;
    h.set("general.architecture", GgufValue::make_string("llama"));
    for (GgufValueType t : kScalarTypes) {
        h.set(std::string("scalar.") + gguf_value_type_name(t), random_scalar(t, rng));
        std::vector<GgufValue> items;
        size_t n = rng() % 50;
        for (size_t k = 0; k < n; ++k) items.push_back(random_scalar(t, rng));
        h.set(std::string("array.") + gguf_value_type_name(t), GgufValue::make_array(t, std::move(items)));
    }
    // Extremes that a sloppy width conversion would lose.
    h.set("edge.u64_max", GgufValue::make_u64(std::numeric_limits<uint64_t>::max()));
    h.set("edge.i32_min", GgufValue::make_i32(std::numeric_limits<int32_t>::min()));
    GgufValue i8;
    i8.type = GgufValueType::INT8;
    i8.i = -128;
    h.set("edge.i8_min", i8);
    h.set("edge.f32_inf", GgufValue::make_f32(std::numeric_limits<float>::infinity()));
    h.set("edge.f32_neg_zero", GgufValue::make_f32(-0.0f));
    h.set("edge.empty_string", GgufValue::make_string(""));
    h.set("edge.empty_array", GgufValue::make_array(GgufValueType::INT32, {}));
    h.set("edge.empty_nested", GgufValue::make_array(GgufValueType::ARRAY, {}));
    h.set("nested.2_strings", random_nested(2, GgufValueType::STRING, rng));
    h.set("nested.3_f32", random_nested(3, GgufValueType::FLOAT32, rng));
    h.set("nested.8_u8", random_nested(8, GgufValueType::UINT8, rng));  // the deepest the reader accepts

    const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                              GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::I8,   GgmlType::F64,  GgmlType::MXFP4};
    size_t n_tensors = 1 + rng() % 8;
    for (size_t k = 0; k < n_tensors; ++k) {
        GgufTensorInfo t;
        t.name = "blk." + std::to_string(k) + ".weight";
        t.type = types[rng() % std::size(types)];
        const uint64_t block = ggml_traits(t.type).block_size;
        size_t n_dims = 1 + rng() % 4;
        t.shape.push_back(block * (1 + rng() % 3));
        for (size_t d = 1; d < n_dims; ++d) t.shape.push_back(1 + rng() % 5);
        h.tensors.push_back(t);
    }
    return h;
}

void expect_same_header(const GgufHeader& want, const GgufHeader& got) {
    EXPECT_EQ(got.version, want.version);
    EXPECT_EQ(got.alignment, want.alignment);
    ASSERT_EQ(got.metadata.size(), want.metadata.size());
    for (size_t k = 0; k < want.metadata.size(); ++k) {
        EXPECT_EQ(got.metadata[k].first, want.metadata[k].first);
        std::string diff = test::value_difference(want.metadata[k].second, got.metadata[k].second,
                                                  want.metadata[k].first);
        EXPECT_TRUE(diff.empty()) << diff;
    }
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (size_t k = 0; k < want.tensors.size(); ++k) {
        const GgufTensorInfo& a = want.tensors[k];
        const GgufTensorInfo& b = got.tensors[k];
        EXPECT_EQ(b.name, a.name);
        EXPECT_EQ(b.shape, a.shape);
        EXPECT_EQ(b.type, a.type);
        EXPECT_EQ(b.offset, a.offset);
        EXPECT_EQ(b.n_elements, a.n_elements);
        EXPECT_EQ(b.n_bytes, a.n_bytes);
    }
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<uint32_t, uint64_t>> {};

TEST_P(RoundTrip, RandomMetadataAndTensorsSurviveStreamingWriteAndMmapRead) {
    const auto [version, alignment] = GetParam();
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    TempDir dir;
    const std::string path = dir.file("model.gguf");

    for (int round = 0; round < 5; ++round) {
        GgufHeader header = random_header(rng, version, alignment);
        std::vector<std::vector<uint8_t>> data;
        GgufHeader written;
        {
            GgufWriter writer(path, header);
            written = writer.header();
            for (const GgufTensorInfo& t : written.tensors) {
                std::vector<uint8_t> bytes(t.n_bytes);
                for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
                // Random chunking: the writer must not care how the bytes arrive.
                size_t at = 0;
                while (at < bytes.size()) {
                    size_t n = std::min<size_t>(bytes.size() - at, 1 + rng() % 100);
                    writer.write(bytes.data() + at, n);
                    at += n;
                }
                data.push_back(std::move(bytes));
            }
            EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
            writer.finish();
        }
        EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

        auto file = GgufFile::open(path);
        expect_same_header(written, file->header());
        EXPECT_EQ(file->data_offset() % alignment, 0u);
        if (alignment != 32) {
            ASSERT_NE(file->header().find("general.alignment"), nullptr);
            EXPECT_EQ(file->header().find("general.alignment")->as_uint(), alignment);
        }
        for (size_t k = 0; k < data.size(); ++k) {
            const GgufTensorInfo& t = file->header().tensors[k];
            EXPECT_EQ(t.offset % alignment, 0u) << t.name;
            EXPECT_EQ(std::memcmp(file->tensor_data(t), data[k].data(), data[k].size()), 0) << t.name;
        }
        EXPECT_EQ(file->file_size() % alignment, 0u);  // the last tensor is padded too

        // Re-writing what was read reproduces the file byte for byte.
        const std::string copy = dir.file("copy.gguf");
        std::vector<std::vector<uint8_t>> read_back;
        for (const GgufTensorInfo& t : file->header().tensors)
            read_back.emplace_back(file->tensor_data(t), file->tensor_data(t) + t.n_bytes);
        write_gguf(copy, file->header(), read_back);
        EXPECT_EQ(test::read_bytes(copy), test::read_bytes(path));
    }
}

INSTANTIATE_TEST_SUITE_P(VersionsAndAlignments, RoundTrip,
                         ::testing::Combine(::testing::Values(2u, 3u), ::testing::Values(uint64_t{32}, uint64_t{64})),
                         [](const auto& info) {
                             return "v" + std::to_string(std::get<0>(info.param)) + "_align" +
                                    std::to_string(std::get<1>(info.param));
                         });

TEST(GgufRoundTrip, AlignmentOneAndLargeAlignment) {
    TempDir dir;
    for (uint64_t alignment : {uint64_t{1}, uint64_t{4096}}) {
        GgufHeader h;
        h.alignment = alignment;
        GgufTensorInfo t;
        t.name = "x";
        t.type = GgmlType::F16;
        t.shape = {3};
        h.tensors = {t, t};
        h.tensors[1].name = "y";
        const std::string path = dir.file("a" + std::to_string(alignment) + ".gguf");
        write_gguf(path, h, {{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}});
        auto file = GgufFile::open(path);
        EXPECT_EQ(file->header().alignment, alignment);
        EXPECT_EQ(file->header().tensors[1].offset, alignment == 1 ? 6u : 4096u);
        EXPECT_EQ(file->tensor_data(file->header().tensors[1])[5], 12);
    }
}

TEST(GgufRoundTrip, FileWithoutTensors) {
    TempDir dir;
    GgufHeader h;
    h.set("general.name", GgufValue::make_string("only metadata"));
    write_gguf(dir.file("m.gguf"), h, {});
    auto file = GgufFile::open(dir.file("m.gguf"));
    EXPECT_TRUE(file->header().tensors.empty());
    EXPECT_EQ(file->header().find("general.name")->s, "only metadata");
}

TEST(GgufValue, NumericViews) {
    EXPECT_EQ(GgufValue::make_u32(7).as_uint(), 7u);
    EXPECT_EQ(GgufValue::make_u32(7).as_int(), 7);
    EXPECT_EQ(GgufValue::make_i32(-3).as_uint(), std::nullopt);
    EXPECT_EQ(GgufValue::make_i32(-3).as_int(), -3);
    EXPECT_EQ(GgufValue::make_i32(5).as_uint(), 5u);
    EXPECT_EQ(GgufValue::make_u64(std::numeric_limits<uint64_t>::max()).as_int(), std::nullopt);
    EXPECT_EQ(GgufValue::make_f32(1.5f).as_float(), 1.5);
    EXPECT_EQ(GgufValue::make_f32(1.5f).as_uint(), std::nullopt);
    EXPECT_EQ(GgufValue::make_i32(-2).as_float(), -2.0);
    EXPECT_EQ(GgufValue::make_string("3").as_uint(), std::nullopt);
    EXPECT_EQ(GgufValue::make_bool(true).as_int(), std::nullopt);
}

TEST(GgufHeader, SetReplacesInPlaceAndFindLooksUp) {
    GgufHeader h;
    h.set("a", GgufValue::make_u32(1));
    h.set("b", GgufValue::make_u32(2));
    h.set("a", GgufValue::make_string("x"));
    ASSERT_EQ(h.metadata.size(), 2u);
    EXPECT_EQ(h.metadata[0].first, "a");
    EXPECT_EQ(h.find("a")->s, "x");
    EXPECT_EQ(h.find("c"), nullptr);
    GgufTensorInfo t;
    t.name = "w";
    h.tensors.push_back(t);
    EXPECT_NE(h.find_tensor("w"), nullptr);
    EXPECT_EQ(h.find_tensor("v"), nullptr);
}

// ---- writer errors ----

GgufHeader one_f32_tensor(uint64_t n) {
    GgufHeader h;
    GgufTensorInfo t;
    t.name = "w";
    t.type = GgmlType::F32;
    t.shape = {n};
    h.tensors.push_back(t);
    return h;
}

std::string writer_error(const std::function<void()>& body) {
    try {
        body();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(GgufWriterErrors, DestructorWithoutFinishRemovesTmpFile) {
    TempDir dir;
    const std::string path = dir.file("w.gguf");
    {
        GgufWriter writer(path, one_f32_tensor(8));
        float half[4] = {1, 2, 3, 4};
        writer.write(half, sizeof half);
        EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
    }
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(GgufWriterErrors, UnwritablePathNamesPathAndErrno) {
    std::string msg = writer_error([] { GgufWriter w("/nonexistent-dir/x/m.gguf", one_f32_tensor(8)); });
    EXPECT_NE(msg.find("/nonexistent-dir/x/m.gguf.tmp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

TEST(GgufWriterErrors, FileSizeLimitIsReportedWithErrnoText) {
    // RLIMIT_FSIZE makes write() fail with EFBIG, like a full disk makes it fail with ENOSPC.
    TempDir dir;
    const std::string path = dir.file("big.gguf");
    struct rlimit old {};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    auto old_handler = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 1 << 16;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    std::string msg = writer_error([&] {
        const uint64_t n = 1 << 20;  // 4 MiB of f32: far past the limit, and past the write buffer
        GgufWriter writer(path, one_f32_tensor(n));
        std::vector<float> data(n, 1.0f);
        writer.write(data.data(), data.size() * sizeof(float));
        writer.finish();
    });
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    EXPECT_NE(msg.find(path + ".tmp"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(GgufWriterErrors, IncompleteAndExcessTensorBytes) {
    TempDir dir;
    const std::string path = dir.file("w.gguf");
    std::string msg = writer_error([&] {
        GgufWriter writer(path, one_f32_tensor(8));
        float part[3] = {};
        writer.write(part, sizeof part);
        writer.finish();
    });
    EXPECT_NE(msg.find("tensor 'w' has 12 of 32 bytes written"), std::string::npos) << msg;
    EXPECT_FALSE(std::filesystem::exists(path));

    msg = writer_error([&] {
        GgufWriter writer(path, one_f32_tensor(8));
        float all[9] = {};
        writer.write(all, sizeof all);
    });
    EXPECT_NE(msg.find("4 bytes written past the last tensor"), std::string::npos) << msg;

    msg = writer_error([&] { write_gguf(path, one_f32_tensor(8), {std::vector<uint8_t>(31)}); });
    EXPECT_NE(msg.find("tensor 'w' has 31 bytes, expected 32"), std::string::npos) << msg;
}

TEST(GgufWriterErrors, InvalidHeadersAreRejectedBeforeWriting) {
    TempDir dir;
    const std::string path = dir.file("w.gguf");
    auto attempt = [&](GgufHeader h) { return writer_error([&] { GgufWriter w(path, std::move(h)); }); };

    GgufHeader h = one_f32_tensor(8);
    GgufValue too_big;
    too_big.type = GgufValueType::UINT8;
    too_big.u = 300;
    h.set("k", too_big);
    EXPECT_NE(attempt(h).find("key 'k': value 300 does not fit uint8"), std::string::npos);

    h = one_f32_tensor(8);
    h.set("arr", GgufValue::make_array(GgufValueType::INT32, {GgufValue::make_i32(1), GgufValue::make_u32(2)}));
    EXPECT_NE(attempt(h).find("key 'arr'[1]: element of type uint32 in an array of int32"), std::string::npos);

    h = one_f32_tensor(8);
    h.metadata.emplace_back("dup", GgufValue::make_u32(1));
    h.metadata.emplace_back("dup", GgufValue::make_u32(2));
    EXPECT_NE(attempt(h).find("duplicate metadata key 'dup'"), std::string::npos);

    h = one_f32_tensor(8);
    h.tensors.push_back(h.tensors[0]);
    EXPECT_NE(attempt(h).find("duplicate tensor name 'w'"), std::string::npos);

    h = one_f32_tensor(8);
    h.alignment = 48;
    EXPECT_NE(attempt(h).find("alignment 48 is not a nonzero power of two"), std::string::npos);

    h = one_f32_tensor(8);
    h.set("general.alignment", GgufValue::make_u32(64));
    EXPECT_NE(attempt(h).find("general.alignment (64) disagrees with the header alignment 32"), std::string::npos);

    h = one_f32_tensor(8);
    h.version = 1;
    EXPECT_NE(attempt(h).find("cannot write version 1"), std::string::npos);

    h = one_f32_tensor(8);
    h.tensors[0].type = GgmlType::Q8_0;
    h.tensors[0].shape = {33};
    EXPECT_NE(attempt(h).find("row of 33 values is not a multiple of the q8_0 block size 32"), std::string::npos);

    GgufValue deep = GgufValue::make_array(GgufValueType::UINT8, {});
    for (int d = 0; d < 8; ++d) deep = GgufValue::make_array(GgufValueType::ARRAY, {deep});
    h = one_f32_tensor(8);
    h.set("deep", deep);
    EXPECT_NE(attempt(h).find("nested deeper than 8"), std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace spillway
