#include "gguf/ggml_types.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "common/error.h"

namespace spillway {
namespace {

struct Entry {
    uint32_t id;
    GgmlTypeTraits traits;
};

// Block geometry from GGUF's own block layouts (blocks of 32 for the legacy quants,
// 256 for the K and most IQ quants). Checked against ggml-common.h's block structs
// (e.g. q8_K = f32 d + 256 qs + 16 i16 bsums = 292; tq1_0 = 48 qs + 4 qh + f16 d = 54;
// nvfp4 = 4 e4m3 scales + 32 qs per 64 values). Ids 4, 5, 31-33 and 36-38 were removed
// from ggml and are rejected.
constexpr std::array<Entry, 33> kTypes = {{
    {0, {"f32", 1, 4}},        {1, {"f16", 1, 2}},        {2, {"q4_0", 32, 18}},
    {3, {"q4_1", 32, 20}},     {6, {"q5_0", 32, 22}},     {7, {"q5_1", 32, 24}},
    {8, {"q8_0", 32, 34}},     {9, {"q8_1", 32, 36}},     {10, {"q2_K", 256, 84}},
    {11, {"q3_K", 256, 110}},  {12, {"q4_K", 256, 144}},  {13, {"q5_K", 256, 176}},
    {14, {"q6_K", 256, 210}},  {15, {"q8_K", 256, 292}},  {16, {"iq2_xxs", 256, 66}},
    {17, {"iq2_xs", 256, 74}}, {18, {"iq3_xxs", 256, 98}}, {19, {"iq1_s", 256, 50}},
    {20, {"iq4_nl", 32, 18}},  {21, {"iq3_s", 256, 110}}, {22, {"iq2_s", 256, 82}},
    {23, {"iq4_xs", 256, 136}}, {24, {"i8", 1, 1}},       {25, {"i16", 1, 2}},
    {26, {"i32", 1, 4}},       {27, {"i64", 1, 8}},       {28, {"f64", 1, 8}},
    {29, {"iq1_m", 256, 56}},  {30, {"bf16", 1, 2}},      {34, {"tq1_0", 256, 54}},
    {35, {"tq2_0", 256, 66}},  {39, {"mxfp4", 32, 17}},
    {40, {"nvfp4", 64, 36}},
}};

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type) {
    for (const Entry& e : kTypes)
        if (e.id == raw_type) return e.traits;
    return std::nullopt;
}

const GgmlTypeTraits& ggml_traits(GgmlType type) {
    for (const Entry& e : kTypes)
        if (e.id == static_cast<uint32_t>(type)) return e.traits;
    fail("unknown ggml type " + std::to_string(static_cast<uint32_t>(type)));
}

const char* ggml_type_name(GgmlType type) { return ggml_traits(type).name; }

std::optional<GgmlType> ggml_type_from_name(const std::string& name) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const Entry& e : kTypes) {
        std::string candidate = e.traits.name;
        std::transform(candidate.begin(), candidate.end(), candidate.begin(),
                       [](unsigned char c) { return std::tolower(c); });
        if (candidate == lower) return static_cast<GgmlType>(e.id);
    }
    return std::nullopt;
}

std::optional<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n_values) {
    auto traits = ggml_type_traits(static_cast<uint32_t>(type));
    if (!traits || n_values % traits->block_size != 0) return std::nullopt;
    uint64_t blocks = n_values / traits->block_size;
    if (blocks > UINT64_MAX / traits->type_size) return std::nullopt;
    return blocks * traits->type_size;
}

}  // namespace spillway
