#pragma once
// GGUF v2/v3 reader (mmap, validated before use) and streaming writer.
// Nothing read from a file is trusted: counts, lengths, offsets and types are checked
// against the file size and the ggml type table, and every failure names the field.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gguf/ggml_types.h"

namespace spillway {

enum class GgufValueType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
    BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_value_type_name(GgufValueType type);

// One metadata value. Scalars keep their declared type so a file round-trips exactly.
struct GgufValue {
    GgufValueType type = GgufValueType::UINT32;
    uint64_t u = 0;       // UINT8..UINT64
    int64_t i = 0;        // INT8..INT64
    double f = 0;         // FLOAT32, FLOAT64
    bool b = false;       // BOOL
    std::string s;        // STRING
    GgufValueType array_type = GgufValueType::UINT8;  // ARRAY: element type
    std::vector<GgufValue> array;                     // ARRAY: elements (may nest)

    static GgufValue make_u32(uint32_t v);
    static GgufValue make_u64(uint64_t v);
    static GgufValue make_i32(int32_t v);
    static GgufValue make_f32(float v);
    static GgufValue make_bool(bool v);
    static GgufValue make_string(std::string v);
    static GgufValue make_array(GgufValueType element_type, std::vector<GgufValue> items);

    // Numeric views across integer widths; nullopt when the type does not fit the view
    // (e.g. a negative INT32 asked as unsigned, or a string).
    std::optional<uint64_t> as_uint() const;
    std::optional<int64_t> as_int() const;
    std::optional<double> as_float() const;  // any numeric type
};

struct GgufTensorInfo {
    std::string name;
    std::vector<uint64_t> shape;  // ne[0] first (the contiguous dimension), as in ggml
    GgmlType type = GgmlType::F32;
    uint64_t offset = 0;          // from the start of the data section
    uint64_t n_elements = 0;      // derived, validated
    uint64_t n_bytes = 0;         // derived, validated
};

struct GgufHeader {
    uint32_t version = 3;
    uint64_t alignment = 32;  // general.alignment, default 32
    std::vector<std::pair<std::string, GgufValue>> metadata;  // file order
    std::vector<GgufTensorInfo> tensors;                      // file order

    const GgufValue* find(std::string_view key) const;
    const GgufTensorInfo* find_tensor(std::string_view name) const;
    // Adds or replaces a key.
    void set(const std::string& key, GgufValue value);
};

// Parses and validates a whole GGUF image in memory. `data_offset` receives the start of
// the tensor data section. Throws spillway::Error on any defect. Pure: the fuzzer calls it.
GgufHeader parse_gguf(const uint8_t* data, size_t size, uint64_t* data_offset = nullptr);

// A read-only mmap of a GGUF file with its parsed header.
class GgufFile {
public:
    static std::unique_ptr<GgufFile> open(const std::string& path);
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    const std::string& path() const { return path_; }
    const GgufHeader& header() const { return header_; }
    uint64_t file_size() const { return size_; }
    uint64_t data_offset() const { return data_offset_; }
    // Pointer to a tensor's bytes inside the mapping (extent validated at open).
    const uint8_t* tensor_data(const GgufTensorInfo& tensor) const;

private:
    GgufFile() = default;
    std::string path_;
    const uint8_t* map_ = nullptr;
    uint64_t size_ = 0;
    uint64_t data_offset_ = 0;
    GgufHeader header_;
};

// Streaming writer: the header (with offsets computed from shapes and types) is written
// first, then each tensor's bytes in header order, in as many write() calls as wanted, so
// a 14B model never needs to be in memory. Writes to `path + ".tmp"` and renames on
// finish(), so an interrupted write never leaves a truncated file under the final name.
class GgufWriter {
public:
    GgufWriter(const std::string& path, GgufHeader header);  // tensor offsets are (re)computed
    ~GgufWriter();  // without finish(): removes the temporary file
    GgufWriter(const GgufWriter&) = delete;
    GgufWriter& operator=(const GgufWriter&) = delete;

    const GgufHeader& header() const { return header_; }
    // Appends bytes of the current tensor; moves on to the next once one is complete.
    void write(const void* bytes, size_t n);
    // Checks every tensor was written completely, flushes, renames into place.
    void finish();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    GgufHeader header_;
};

// Convenience for tests: writes a header and whole tensors held in memory.
void write_gguf(const std::string& path, const GgufHeader& header,
                const std::vector<std::vector<uint8_t>>& tensor_bytes);

}  // namespace spillway
