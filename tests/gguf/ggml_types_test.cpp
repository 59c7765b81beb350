// The ggml type table against block sizes worked out from ggml's block structs.
#include <gtest/gtest.h>

#include "gguf/ggml_types.h"

namespace spillway {
namespace {

struct Expected {
    GgmlType type;
    const char* name;
    uint32_t block_size, type_size;
};

TEST(GgmlTypes, BlockGeometry) {
    // Sizes from the struct layouts: e.g. q4_K = 2 halves + 12 scale bytes + 128 nibble bytes;
    // q6_K = 128 ql + 64 qh + 16 scales + 1 half; iq4_xs = half + u16 + 4 + 128.
    const Expected expected[] = {
        {GgmlType::F32, "f32", 1, 4},          {GgmlType::F16, "f16", 1, 2},
        {GgmlType::BF16, "bf16", 1, 2},        {GgmlType::Q4_0, "q4_0", 32, 18},
        {GgmlType::Q4_1, "q4_1", 32, 20},      {GgmlType::Q5_0, "q5_0", 32, 22},
        {GgmlType::Q5_1, "q5_1", 32, 24},      {GgmlType::Q8_0, "q8_0", 32, 34},
        {GgmlType::Q8_1, "q8_1", 32, 36},      {GgmlType::Q2_K, "q2_K", 256, 84},
        {GgmlType::Q3_K, "q3_K", 256, 110},    {GgmlType::Q4_K, "q4_K", 256, 144},
        {GgmlType::Q5_K, "q5_K", 256, 176},    {GgmlType::Q6_K, "q6_K", 256, 210},
        {GgmlType::Q8_K, "q8_K", 256, 292},    {GgmlType::IQ2_XXS, "iq2_xxs", 256, 66},
        {GgmlType::IQ2_XS, "iq2_xs", 256, 74}, {GgmlType::IQ3_XXS, "iq3_xxs", 256, 98},
        {GgmlType::IQ1_S, "iq1_s", 256, 50},   {GgmlType::IQ4_NL, "iq4_nl", 32, 18},
        {GgmlType::IQ3_S, "iq3_s", 256, 110},  {GgmlType::IQ2_S, "iq2_s", 256, 82},
        {GgmlType::IQ4_XS, "iq4_xs", 256, 136}, {GgmlType::I8, "i8", 1, 1},
        {GgmlType::I16, "i16", 1, 2},          {GgmlType::I32, "i32", 1, 4},
        {GgmlType::I64, "i64", 1, 8},          {GgmlType::F64, "f64", 1, 8},
        {GgmlType::IQ1_M, "iq1_m", 256, 56},   {GgmlType::TQ1_0, "tq1_0", 256, 54},
        {GgmlType::TQ2_0, "tq2_0", 256, 66},   {GgmlType::MXFP4, "mxfp4", 32, 17},
        {GgmlType::NVFP4, "nvfp4", 64, 36},
    };
    for (const Expected& e : expected) {
        auto traits = ggml_type_traits(static_cast<uint32_t>(e.type));
        ASSERT_TRUE(traits) << e.name;
        EXPECT_STREQ(traits->name, e.name);
        EXPECT_EQ(traits->block_size, e.block_size) << e.name;
        EXPECT_EQ(traits->type_size, e.type_size) << e.name;
        EXPECT_EQ(ggml_type_from_name(e.name), e.type);
    }
}

TEST(GgmlTypes, RemovedAndUnknownIdsAreRejected) {
    for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 41u, 1000u, 0xffffffffu})
        EXPECT_FALSE(ggml_type_traits(id)) << id;
    EXPECT_FALSE(ggml_type_from_name("q4_2"));
    EXPECT_EQ(ggml_type_from_name("Q8_0"), GgmlType::Q8_0);
}

TEST(GgmlTypes, RowBytes) {
    EXPECT_EQ(ggml_row_bytes(GgmlType::Q8_0, 4096), 4096u / 32 * 34);
    EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_K, 5120), 20u * 144);
    EXPECT_EQ(ggml_row_bytes(GgmlType::F16, 3), 6u);
    EXPECT_FALSE(ggml_row_bytes(GgmlType::Q8_0, 33));
    EXPECT_FALSE(ggml_row_bytes(GgmlType::F64, uint64_t{1} << 62));  // overflows
}

}  // namespace
}  // namespace spillway
