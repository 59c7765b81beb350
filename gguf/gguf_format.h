#pragma once
// Internal to gguf/: the limits and size rules shared by the reader and the writer, so the
// writer can never produce a file the reader rejects.
#include <cstdint>
#include <optional>
#include <string>

#include "gguf/gguf.h"

namespace spillway::gguf_format {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr const char* kAlignmentKey = "general.alignment";
inline constexpr uint32_t kMaxDims = 4;
// Arrays of arrays are legal GGUF but nothing real nests deeply; the bound keeps the
// recursive reader's stack small whatever the file says.
inline constexpr int kMaxArrayDepth = 8;
// Each decoded element costs ~100 bytes of memory for 1-8 bytes of file, so counts are
// capped as well as bounded by the file size: a corrupt count in a 15 GB model must not
// turn into gigabytes of allocation. Real files stay far below: vocabularies and merge
// lists are < 1M entries, tensor counts a few thousand, metadata keys a few hundred.
inline constexpr uint64_t kMaxArrayElements = uint64_t{1} << 22;
inline constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
inline constexpr uint64_t kMaxMetadataKeys = uint64_t{1} << 20;
// Vectors are reserved up to this many entries from a count read from the file; beyond
// it they grow only as entries are actually parsed.
inline constexpr uint64_t kMaxReserve = uint64_t{1} << 16;

// Bytes a scalar of this type occupies in the file; nullopt for STRING, ARRAY and unknown.
std::optional<uint64_t> scalar_size(uint32_t raw_type);
// Smallest number of bytes any value of this type can occupy (string: its length field;
// array: element type and count). Zero for unknown types.
uint64_t min_value_size(uint32_t raw_type);
bool is_known_value_type(uint32_t raw_type);

// Fills n_elements and n_bytes from shape and type, checking the dims count, each dim,
// overflow and the block-size rule. `what` names the tensor in messages.
void compute_tensor_size(GgufTensorInfo& tensor);

bool is_power_of_two(uint64_t v);
// nullopt on overflow.
std::optional<uint64_t> align_up(uint64_t v, uint64_t alignment);

}  // namespace spillway::gguf_format
