// One hand-built corrupt file per validation rule of the reader, each checked for the
// specific message; plus truncation at every byte and byte flips of a valid file.
#include "gguf_test_util.h"

namespace spillway {
namespace {

using test::RawGguf;
using test::TempDir;

constexpr uint32_t kF32 = 0, kQ8_0 = 8, kF64 = 28;
constexpr uint32_t kTypeU8 = 0, kTypeU32 = 4, kTypeBool = 7, kTypeString = 8, kTypeArray = 9;

// One f32 tensor of `n` values at offset 0, default alignment, data present.
RawGguf one_tensor_file(uint64_t n = 8, uint32_t type = kF32, uint64_t offset = 0, uint64_t data_bytes = 32) {
    RawGguf r;
    r.header(1, 0).tensor("w", {n}, type, offset).pad_to(32).zeros(data_bytes);
    return r;
}

TEST(GgufValidation, AcceptsTheMinimalFilesBelow) {
    // The corrupt variants below differ from these in exactly one field.
    EXPECT_NO_THROW(test::parse(one_tensor_file().bytes));
    RawGguf r;
    r.header(0, 1).kv_u32("general.alignment", 64);
    EXPECT_EQ(test::parse(r.bytes).alignment, 64u);
}

TEST(GgufValidation, EmptyInput) {
    EXPECT_GGUF_ERROR(std::vector<uint8_t>{}, "magic: needs 4 bytes at offset 0 but the file has only 0 left");
    EXPECT_THROW(parse_gguf(nullptr, 0), Error);
}

TEST(GgufValidation, BadMagic) {
    RawGguf r = one_tensor_file();
    r.bytes[3] = 'X';
    EXPECT_GGUF_ERROR(r.bytes, "bad magic 0x58554747");
}

TEST(GgufValidation, Version1IsRejectedClearly) {
    RawGguf r = one_tensor_file();
    r.patch<uint32_t>(4, 1);
    EXPECT_GGUF_ERROR(r.bytes, "version 1 is not supported");
}

TEST(GgufValidation, UnknownVersion) {
    RawGguf r = one_tensor_file();
    r.patch<uint32_t>(4, 4);
    EXPECT_GGUF_ERROR(r.bytes, "unsupported version 4 (supported: 2, 3)");
}

TEST(GgufValidation, BigEndianFile) {
    RawGguf r = one_tensor_file();
    r.patch<uint32_t>(4, 0x03000000);
    EXPECT_GGUF_ERROR(r.bytes, "big-endian");
}

TEST(GgufValidation, Version2IsAccepted) {
    RawGguf r = one_tensor_file();
    r.patch<uint32_t>(4, 2);
    EXPECT_EQ(test::parse(r.bytes).version, 2u);
}

TEST(GgufValidation, HugeKvCountIsRejectedBeforeAllocating) {
    RawGguf r = one_tensor_file();
    r.patch<uint64_t>(16, uint64_t{1} << 60);
    EXPECT_GGUF_ERROR(r.bytes, "metadata_kv_count 1152921504606846976 cannot fit in the");
}

TEST(GgufValidation, HugeTensorCountIsRejectedBeforeAllocating) {
    RawGguf r = one_tensor_file();
    r.patch<uint64_t>(8, ~uint64_t{0});
    EXPECT_GGUF_ERROR(r.bytes, "tensor_count 18446744073709551615 cannot fit in the");
}

TEST(GgufValidation, CountsAboveTheLimitsInALargeFile) {
    // Big enough that the byte bound alone would allow these counts.
    RawGguf r;
    r.header((uint64_t{1} << 20) + 1, 0).zeros(40u << 20);
    EXPECT_GGUF_ERROR(r.bytes, "tensor_count 1048577 exceeds the limit of 1048576");
    r.patch<uint64_t>(8, 0);
    r.patch<uint64_t>(16, (uint64_t{1} << 20) + 1);
    EXPECT_GGUF_ERROR(r.bytes, "metadata_kv_count 1048577 exceeds the limit of 1048576");
}

TEST(GgufValidation, TensorCountLargerThanTheInfosPresent) {
    RawGguf r = one_tensor_file();
    r.patch<uint64_t>(8, 2);  // fits the byte bound, but the second info runs into the data
    EXPECT_THROW(test::parse(r.bytes), Error);
}

TEST(GgufValidation, HugeKeyLength) {
    RawGguf r;
    r.header(0, 1).u64(uint64_t{1} << 62).u32(kTypeU32).u32(1);
    EXPECT_GGUF_ERROR(r.bytes, "key of metadata entry 0: string length 4611686018427387904 at offset 24 exceeds");
}

TEST(GgufValidation, HugeStringValueLength) {
    RawGguf r;
    r.header(0, 1).str("name").u32(kTypeString).u64(1000).zeros(10);
    EXPECT_GGUF_ERROR(r.bytes, "key 'name': string length 1000");
}

TEST(GgufValidation, HugeArrayCountIsRejectedBeforeReserving) {
    RawGguf r;
    r.header(0, 1).str("tokens").u32(kTypeArray).u32(kTypeString).u64(uint64_t{1} << 60).zeros(64);
    EXPECT_GGUF_ERROR(r.bytes, "key 'tokens': array count 1152921504606846976 of string needs at least");
    RawGguf u64s;
    u64s.header(0, 1).str("a").u32(kTypeArray).u32(10).u64(~uint64_t{0}).zeros(64);
    EXPECT_GGUF_ERROR(u64s.bytes, "needs at least 2^64 bytes");
}

TEST(GgufValidation, ArrayCountAboveTheElementLimit) {
    // Every element is present in the file, but 4M+1 decoded values is over the cap.
    const uint64_t n = (uint64_t{1} << 22) + 1;
    RawGguf r;
    r.header(0, 1).str("bytes").u32(kTypeArray).u32(kTypeU8).u64(n).zeros(n);
    EXPECT_GGUF_ERROR(r.bytes, "key 'bytes': array count 4194305 exceeds the limit of 4194304");
}

TEST(GgufValidation, ArrayElementsTruncated) {
    RawGguf r;
    r.header(0, 1).str("a").u32(kTypeArray).u32(kTypeU32).u64(3).u32(1).u32(2);
    EXPECT_GGUF_ERROR(r.bytes, "array count 3 of uint32 needs at least 12 bytes but the file has only 8 left");
}

TEST(GgufValidation, UnknownValueType) {
    RawGguf r;
    r.header(0, 1).str("k").u32(13).u32(0);
    EXPECT_GGUF_ERROR(r.bytes, "key 'k': unknown value type 13");
}

TEST(GgufValidation, UnknownArrayElementType) {
    RawGguf r;
    r.header(0, 1).str("k").u32(kTypeArray).u32(99).u64(1).u32(0);
    EXPECT_GGUF_ERROR(r.bytes, "key 'k': unknown array element type 99");
}

TEST(GgufValidation, BoolOtherThanZeroOrOne) {
    RawGguf r;
    r.header(0, 1).str("flag").u32(kTypeBool).u8(2);
    EXPECT_GGUF_ERROR(r.bytes, "key 'flag': bool value 2 is not 0 or 1");
}

TEST(GgufValidation, NestingDepthIsBounded) {
    auto nested = [](int levels) {
        RawGguf r;
        r.header(0, 1).str("deep").u32(kTypeArray);
        for (int d = 1; d < levels; ++d) r.u32(kTypeArray).u64(1);
        r.u32(kTypeU8).u64(1).u8(7);
        return r;
    };
    EXPECT_NO_THROW(test::parse(nested(8).bytes));
    EXPECT_GGUF_ERROR(nested(9).bytes, "nested deeper than 8");
    // Far deeper than the bound: must fail cleanly, not exhaust the stack.
    EXPECT_GGUF_ERROR(nested(100000).bytes, "nested deeper than 8");
}

TEST(GgufValidation, NestedArrayNamesThePath) {
    RawGguf r;
    r.header(0, 1).str("m").u32(kTypeArray).u32(kTypeArray).u64(2);
    r.u32(kTypeU8).u64(1).u8(1);
    r.u32(kTypeBool).u64(1).u8(5);
    EXPECT_GGUF_ERROR(r.bytes, "key 'm'[1][0]: bool value 5");
}

TEST(GgufValidation, DuplicateKey) {
    RawGguf r;
    r.header(0, 2).kv_u32("general.x", 1).kv_u32("general.x", 2);
    EXPECT_GGUF_ERROR(r.bytes, "duplicate metadata key 'general.x'");
}

TEST(GgufValidation, AlignmentZero) {
    RawGguf r;
    r.header(0, 1).kv_u32("general.alignment", 0);
    EXPECT_GGUF_ERROR(r.bytes, "general.alignment 0 is not a nonzero power of two");
}

TEST(GgufValidation, AlignmentNotPowerOfTwo) {
    RawGguf r;
    r.header(0, 1).kv_u32("general.alignment", 48);
    EXPECT_GGUF_ERROR(r.bytes, "general.alignment 48 is not a nonzero power of two");
}

TEST(GgufValidation, AlignmentOfWrongType) {
    RawGguf r;
    r.header(0, 1).str("general.alignment").u32(kTypeString).str("32");
    EXPECT_GGUF_ERROR(r.bytes, "general.alignment has type string, expected an unsigned integer");
}

TEST(GgufValidation, HugeAlignmentPutsDataPastTheEnd) {
    RawGguf r;
    r.header(1, 1).str("general.alignment").u32(10).u64(uint64_t{1} << 63).tensor("w", {8}, kF32, 0);
    EXPECT_GGUF_ERROR(r.bytes, "data section starts at 9223372036854775808, past the end of the file");
}

TEST(GgufValidation, TooManyDims) {
    RawGguf r;
    r.header(1, 0).tensor("w", {8, 1, 1, 1, 1}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_GGUF_ERROR(r.bytes, "tensor 'w': n_dims 5 is outside 1..4");
}

TEST(GgufValidation, ZeroDims) {
    RawGguf r;
    r.header(1, 0).tensor("w", {}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_GGUF_ERROR(r.bytes, "tensor 'w': n_dims 0 is outside 1..4");
}

TEST(GgufValidation, HugeDimsCountDoesNotAllocate) {
    RawGguf r;
    r.header(1, 0).str("w").u32(0xffffffff).zeros(64);
    EXPECT_GGUF_ERROR(r.bytes, "n_dims 4294967295 is outside 1..4");
}

TEST(GgufValidation, ZeroDim) {
    RawGguf r;
    r.header(1, 0).tensor("w", {8, 0}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_GGUF_ERROR(r.bytes, "tensor 'w': dim 1 is 0 (must be 1..");
}

TEST(GgufValidation, DimAboveInt64) {
    RawGguf r;
    r.header(1, 0).tensor("w", {uint64_t{1} << 63}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_GGUF_ERROR(r.bytes, "tensor 'w': dim 0 is 9223372036854775808");
}

TEST(GgufValidation, ElementCountOverflow) {
    RawGguf r;
    r.header(1, 0).tensor("w", {uint64_t{1} << 32, uint64_t{1} << 32}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_GGUF_ERROR(r.bytes, "tensor 'w': element count overflows at dim 1 (4294967296 x 4294967296)");
}

TEST(GgufValidation, ByteSizeOverflow) {
    RawGguf r;
    r.header(1, 0).tensor("w", {uint64_t{1} << 62}, kF64, 0).pad_to(32).zeros(32);
    EXPECT_GGUF_ERROR(r.bytes, "tensor 'w': byte size overflows");
}

TEST(GgufValidation, RowNotAMultipleOfTheBlockSize) {
    EXPECT_GGUF_ERROR(one_tensor_file(33, kQ8_0, 0, 64).bytes,
                      "tensor 'w': row of 33 values is not a multiple of the q8_0 block size 32");
}

TEST(GgufValidation, UnknownGgmlType) {
    EXPECT_GGUF_ERROR(one_tensor_file(8, 4).bytes, "tensor 'w': unknown ggml type 4");  // removed Q4_2
    EXPECT_GGUF_ERROR(one_tensor_file(8, 31).bytes, "tensor 'w': unknown ggml type 31");
    EXPECT_GGUF_ERROR(one_tensor_file(8, 1000).bytes, "tensor 'w': unknown ggml type 1000");
}

TEST(GgufValidation, MisalignedOffset) {
    EXPECT_GGUF_ERROR(one_tensor_file(8, kF32, 16, 64).bytes,
                      "tensor 'w': offset 16 is not a multiple of the alignment 32");
}

TEST(GgufValidation, ExtentPastTheDataSection) {
    EXPECT_GGUF_ERROR(one_tensor_file(1024, kF32, 0, 2000).bytes,
                      "tensor 'w': offset 0 + 4096 bytes exceeds data section (2000 bytes)");
    // An offset so large that offset + size would wrap around.
    EXPECT_GGUF_ERROR(one_tensor_file(8, kF32, ~uint64_t{31}, 32).bytes,
                      "tensor 'w': offset 18446744073709551584 + 32 bytes exceeds data section (32 bytes)");
}

TEST(GgufValidation, DataSectionStartsPastTheEnd) {
    RawGguf r;
    r.header(1, 0).tensor("w", {8}, kF32, 0);  // no padding, no data
    EXPECT_GGUF_ERROR(r.bytes, "data section starts at 64, past the end of the file (");
}

TEST(GgufValidation, OverlappingTensors) {
    RawGguf r;
    r.header(3, 0)
        .tensor("a", {8}, kF32, 0)
        .tensor("b", {16}, kF32, 64)   // 64..128
        .tensor("c", {8}, kF32, 96)    // 96..128: inside b
        .pad_to(32)
        .zeros(128);
    EXPECT_GGUF_ERROR(r.bytes, "tensors 'b' (offset 64, 64 bytes) and 'c' (offset 96) overlap");
}

TEST(GgufValidation, TwoTensorsAtTheSameOffset) {
    RawGguf r;
    r.header(2, 0).tensor("a", {8}, kF32, 0).tensor("b", {8}, kF32, 0).pad_to(32).zeros(32);
    EXPECT_GGUF_ERROR(r.bytes, "overlap");
}

TEST(GgufValidation, DuplicateTensorName) {
    RawGguf r;
    r.header(2, 0).tensor("a", {8}, kF32, 0).tensor("a", {8}, kF32, 32).pad_to(32).zeros(64);
    EXPECT_GGUF_ERROR(r.bytes, "duplicate tensor name 'a'");
}

TEST(GgufValidation, TensorInfoTruncated) {
    RawGguf r;
    r.header(1, 0).str("blk.0.attn_q.weight").u32(2).u64(8);
    EXPECT_GGUF_ERROR(r.bytes, "tensor 'blk.0.attn_q.weight' dim 1: needs 8 bytes");
}

// A small valid file made by the writer whose last tensor ends exactly at the end of the
// file, so every strict prefix of it is invalid.
std::vector<uint8_t> small_valid_file(const TempDir& dir) {
    GgufHeader h;
    h.set("general.architecture", GgufValue::make_string("llama"));
    h.set("llama.block_count", GgufValue::make_u32(2));
    h.set("tokenizer.ggml.tokens",
          GgufValue::make_array(GgufValueType::STRING, {GgufValue::make_string("a"), GgufValue::make_string("bc")}));
    h.set("nested", GgufValue::make_array(GgufValueType::ARRAY,
                                          {GgufValue::make_array(GgufValueType::INT32, {GgufValue::make_i32(-1)})}));
    h.set("flag", GgufValue::make_bool(true));
    GgufTensorInfo q;
    q.name = "q";
    q.type = GgmlType::Q8_0;
    q.shape = {32, 2};  // 68 bytes, padded to 96
    GgufTensorInfo f;
    f.name = "f";
    f.type = GgmlType::F32;
    f.shape = {8};  // 32 bytes: ends the file with no padding
    h.tensors = {q, f};
    std::mt19937_64 rng(test::fresh_seed());
    std::vector<uint8_t> qb(68), fb(32);
    for (uint8_t& b : qb) b = static_cast<uint8_t>(rng());
    for (uint8_t& b : fb) b = static_cast<uint8_t>(rng());
    write_gguf(dir.file("small.gguf"), h, {qb, fb});
    return test::read_bytes(dir.file("small.gguf"));
}

TEST(GgufValidation, TruncationAtEveryByteIsAnError) {
    TempDir dir;
    const std::vector<uint8_t> full = small_valid_file(dir);
    ASSERT_NO_THROW(test::parse(full));
    for (size_t n = 0; n < full.size(); ++n) {
        // A copy of exactly n bytes, so ASan would catch a read past the end.
        std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
        try {
            test::parse(prefix);
            ADD_FAILURE() << "a " << n << "-byte prefix of a " << full.size() << "-byte file was accepted";
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()).rfind("gguf: ", 0), 0u) << e.what();
        }
    }
}

TEST(GgufValidation, ByteFlipsNeverCrash) {
    // Every header byte flipped three ways: the parser must either accept the file or throw
    // spillway::Error (under the ASan build this also checks for out-of-bounds reads).
    TempDir dir;
    const std::vector<uint8_t> full = small_valid_file(dir);
    const uint64_t header_bytes = full.size() - 96 - 32;
    size_t rejected = 0;
    for (size_t at = 0; at < header_bytes; ++at) {
        for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
            std::vector<uint8_t> bytes = full;
            bytes[at] ^= mask;
            try {
                test::parse(bytes);
            } catch (const Error&) {
                ++rejected;
            }
        }
    }
    EXPECT_GT(rejected, header_bytes);  // most flips are caught
}

TEST(GgufFileOpen, MissingFileNamesThePath) {
    try {
        GgufFile::open("/nonexistent/model.gguf");
        ADD_FAILURE() << "opened a missing file";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf: cannot open: No such file"), std::string::npos)
            << e.what();
    }
}

TEST(GgufFileOpen, ParseErrorsArePrefixedWithThePath) {
    TempDir dir;
    test::write_bytes(dir.file("empty.gguf"), {});
    test::write_bytes(dir.file("bad.gguf"), one_tensor_file(8, kF32, 16, 64).bytes);
    for (const auto& [name, needle] : {std::pair<std::string, std::string>{"empty.gguf", ": gguf: magic: needs 4 bytes"},
                                       {"bad.gguf", ": gguf: tensor 'w': offset 16 is not a multiple"}}) {
        try {
            GgufFile::open(dir.file(name));
            ADD_FAILURE() << name << " was accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(dir.file(name) + needle), std::string::npos) << e.what();
        }
    }
    EXPECT_THROW(GgufFile::open(dir.path.string()), Error);  // a directory
}

}  // namespace
}  // namespace spillway
