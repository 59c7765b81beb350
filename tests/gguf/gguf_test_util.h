#pragma once
// Helpers for the GGUF tests: a raw byte builder for hand-made (often corrupt) files, a
// temporary directory, and value comparison.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"

namespace spillway::test {

// Appends little-endian fields; `pos()` lets a test remember where a field sits to patch it.
struct RawGguf {
    std::vector<uint8_t> bytes;

    size_t pos() const { return bytes.size(); }
    template <typename T>
    RawGguf& put(T v) {
        const size_t at = bytes.size();
        bytes.resize(at + sizeof v);
        std::memcpy(bytes.data() + at, &v, sizeof v);
        return *this;
    }
    RawGguf& u8(uint8_t v) { return put(v); }
    RawGguf& u32(uint32_t v) { return put(v); }
    RawGguf& u64(uint64_t v) { return put(v); }
    RawGguf& str(const std::string& s) {
        u64(s.size());
        bytes.insert(bytes.end(), s.begin(), s.end());
        return *this;
    }
    // "GGUF", version, tensor count, kv count.
    RawGguf& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
    }
    RawGguf& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
    // A tensor info: name, dims, type, offset.
    RawGguf& tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(dims.size()));
        for (uint64_t d : dims) u64(d);
        return u32(type).u64(offset);
    }
    RawGguf& pad_to(size_t alignment) {
        while (bytes.size() % alignment != 0) bytes.push_back(0);
        return *this;
    }
    RawGguf& zeros(size_t n) {
        bytes.resize(bytes.size() + n, 0);
        return *this;
    }
    template <typename T>
    void patch(size_t at, T v) {
        std::memcpy(bytes.data() + at, &v, sizeof v);
    }
};

inline GgufHeader parse(const std::vector<uint8_t>& bytes) { return parse_gguf(bytes.data(), bytes.size()); }

// Expects parse_gguf to throw spillway::Error whose message contains `needle`.
#define EXPECT_GGUF_ERROR(bytes, needle)                                                          \
    do {                                                                                          \
        try {                                                                                     \
            (void)::spillway::test::parse(bytes);                                                 \
            ADD_FAILURE() << "parse_gguf accepted the file; expected an error containing \""      \
                          << (needle) << "\"";                                                    \
        } catch (const ::spillway::Error& e) {                                                    \
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)                      \
                << "message: " << e.what() << "\nexpected to contain: " << (needle);              \
        }                                                                                         \
    } while (0)

// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "spillway_gguf_XXXXXX").string();
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
        path = buf.data();
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Empty when equal, else a description of the first difference.
inline std::string value_difference(const GgufValue& a, const GgufValue& b, const std::string& where) {
    if (a.type != b.type)
        return where + ": type " + gguf_value_type_name(a.type) + " vs " + gguf_value_type_name(b.type);
    switch (a.type) {
        case GgufValueType::UINT8: case GgufValueType::UINT16: case GgufValueType::UINT32: case GgufValueType::UINT64:
            if (a.u != b.u) return where + ": " + std::to_string(a.u) + " vs " + std::to_string(b.u);
            return {};
        case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32: case GgufValueType::INT64:
            if (a.i != b.i) return where + ": " + std::to_string(a.i) + " vs " + std::to_string(b.i);
            return {};
        case GgufValueType::FLOAT32: case GgufValueType::FLOAT64:
            if (std::memcmp(&a.f, &b.f, sizeof a.f) != 0)
                return where + ": " + std::to_string(a.f) + " vs " + std::to_string(b.f);
            return {};
        case GgufValueType::BOOL:
            if (a.b != b.b) return where + ": bool differs";
            return {};
        case GgufValueType::STRING:
            if (a.s != b.s) return where + ": '" + a.s + "' vs '" + b.s + "'";
            return {};
        case GgufValueType::ARRAY:
            if (a.array_type != b.array_type) return where + ": array element type differs";
            if (a.array.size() != b.array.size())
                return where + ": array size " + std::to_string(a.array.size()) + " vs " + std::to_string(b.array.size());
            for (size_t k = 0; k < a.array.size(); ++k) {
                std::string d = value_difference(a.array[k], b.array[k], where + "[" + std::to_string(k) + "]");
                if (!d.empty()) return d;
            }
            return {};
    }
    return where + ": unknown type";
}

inline uint64_t fresh_seed() {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace spillway::test
