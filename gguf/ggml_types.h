#pragma once
// ggml tensor types as numbered in GGUF files, with their block geometry.
#include <cstdint>
#include <optional>
#include <string>

namespace spillway {

enum class GgmlType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
    IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40,
};

struct GgmlTypeTraits {
    const char* name;     // as ggml prints it: "f16", "q8_0", "q4_K"
    uint32_t block_size;  // values per block
    uint32_t type_size;   // bytes per block
};

// nullopt for numbers that are not (or no longer) ggml types.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type);
const GgmlTypeTraits& ggml_traits(GgmlType type);  // type must be valid
const char* ggml_type_name(GgmlType type);
// Case-insensitive lookup by name ("f16", "Q8_0", "bf16"); nullopt when unknown.
std::optional<GgmlType> ggml_type_from_name(const std::string& name);

// Bytes of one row of `n_values` values; n_values must be a multiple of the block size.
// Returns nullopt when it is not, or when the result would overflow.
std::optional<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n_values);

}  // namespace spillway
