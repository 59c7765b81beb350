// Metadata values, header lookups, and the size rules shared by gguf_reader.cpp and
// gguf_writer.cpp.
#include "gguf/gguf.h"

#include <limits>

#include "common/error.h"
#include "gguf/gguf_format.h"

namespace spillway {

const char* gguf_value_type_name(GgufValueType type) {
    switch (type) {
        case GgufValueType::UINT8: return "uint8";
        case GgufValueType::INT8: return "int8";
        case GgufValueType::UINT16: return "uint16";
        case GgufValueType::INT16: return "int16";
        case GgufValueType::UINT32: return "uint32";
        case GgufValueType::INT32: return "int32";
        case GgufValueType::FLOAT32: return "float32";
        case GgufValueType::BOOL: return "bool";
        case GgufValueType::STRING: return "string";
        case GgufValueType::ARRAY: return "array";
        case GgufValueType::UINT64: return "uint64";
        case GgufValueType::INT64: return "int64";
        case GgufValueType::FLOAT64: return "float64";
    }
    return "unknown";
}

GgufValue GgufValue::make_u32(uint32_t v) {
    GgufValue value;
    value.type = GgufValueType::UINT32;
    value.u = v;
    return value;
}

GgufValue GgufValue::make_u64(uint64_t v) {
    GgufValue value;
    value.type = GgufValueType::UINT64;
    value.u = v;
    return value;
}

GgufValue GgufValue::make_i32(int32_t v) {
    GgufValue value;
    value.type = GgufValueType::INT32;
    value.i = v;
    return value;
}

GgufValue GgufValue::make_f32(float v) {
    GgufValue value;
    value.type = GgufValueType::FLOAT32;
    value.f = v;
    return value;
}

GgufValue GgufValue::make_bool(bool v) {
    GgufValue value;
    value.type = GgufValueType::BOOL;
    value.b = v;
    return value;
}

GgufValue GgufValue::make_string(std::string v) {
    GgufValue value;
    value.type = GgufValueType::STRING;
    value.s = std::move(v);
    return value;
}

GgufValue GgufValue::make_array(GgufValueType element_type, std::vector<GgufValue> items) {
    GgufValue value;
    value.type = GgufValueType::ARRAY;
    value.array_type = element_type;
    value.array = std::move(items);
    return value;
}

namespace {

bool is_unsigned(GgufValueType t) {
    return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
           t == GgufValueType::UINT64;
}

bool is_signed(GgufValueType t) {
    return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
           t == GgufValueType::INT64;
}

}  // namespace

std::optional<uint64_t> GgufValue::as_uint() const {
    if (is_unsigned(type)) return u;
    if (is_signed(type) && i >= 0) return static_cast<uint64_t>(i);
    return std::nullopt;
}

std::optional<int64_t> GgufValue::as_int() const {
    if (is_signed(type)) return i;
    if (is_unsigned(type) && u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return static_cast<int64_t>(u);
    return std::nullopt;
}

std::optional<double> GgufValue::as_float() const {
    if (type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64) return f;
    if (is_unsigned(type)) return static_cast<double>(u);
    if (is_signed(type)) return static_cast<double>(i);
    return std::nullopt;
}

const GgufValue* GgufHeader::find(std::string_view key) const {
    for (const auto& [k, v] : metadata)
        if (k == key) return &v;
    return nullptr;
}

const GgufTensorInfo* GgufHeader::find_tensor(std::string_view name) const {
    for (const GgufTensorInfo& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

void GgufHeader::set(const std::string& key, GgufValue value) {
    for (auto& [k, v] : metadata) {
        if (k == key) {
            v = std::move(value);
            return;
        }
    }
    metadata.emplace_back(key, std::move(value));
}

namespace gguf_format {

std::optional<uint64_t> scalar_size(uint32_t raw_type) {
    switch (static_cast<GgufValueType>(raw_type)) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL: return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16: return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32: return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64: return 8;
        case GgufValueType::STRING:
        case GgufValueType::ARRAY: break;
    }
    return std::nullopt;
}

bool is_known_value_type(uint32_t raw_type) { return raw_type <= static_cast<uint32_t>(GgufValueType::FLOAT64); }

uint64_t min_value_size(uint32_t raw_type) {
    if (auto size = scalar_size(raw_type)) return *size;
    if (raw_type == static_cast<uint32_t>(GgufValueType::STRING)) return 8;
    if (raw_type == static_cast<uint32_t>(GgufValueType::ARRAY)) return 12;
    return 0;
}

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::optional<uint64_t> align_up(uint64_t v, uint64_t alignment) {
    uint64_t rem = v % alignment;
    if (rem == 0) return v;
    uint64_t pad = alignment - rem;
    if (v > std::numeric_limits<uint64_t>::max() - pad) return std::nullopt;
    return v + pad;
}

void compute_tensor_size(GgufTensorInfo& tensor) {
    const std::string what = "gguf: tensor '" + tensor.name + "': ";
    if (tensor.shape.empty() || tensor.shape.size() > kMaxDims)
        fail(what + "n_dims " + std::to_string(tensor.shape.size()) + " is outside 1.." +
             std::to_string(kMaxDims));
    auto traits = ggml_type_traits(static_cast<uint32_t>(tensor.type));
    if (!traits) fail(what + "unknown ggml type " + std::to_string(static_cast<uint32_t>(tensor.type)));

    // ggml keeps dims and element counts in int64_t, so both must fit there.
    constexpr uint64_t kMaxCount = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    uint64_t n = 1;
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
        uint64_t dim = tensor.shape[d];
        if (dim == 0 || dim > kMaxCount)
            fail(what + "dim " + std::to_string(d) + " is " + std::to_string(dim) + " (must be 1.." +
                 std::to_string(kMaxCount) + ")");
        if (n > kMaxCount / dim)
            fail(what + "element count overflows at dim " + std::to_string(d) + " (" +
                 std::to_string(n) + " x " + std::to_string(dim) + ")");
        n *= dim;
    }
    const uint64_t row_values = tensor.shape[0];
    if (row_values % traits->block_size != 0)
        fail(what + "row of " + std::to_string(row_values) + " values is not a multiple of the " +
             traits->name + " block size " + std::to_string(traits->block_size));
    const uint64_t rows = n / row_values;
    const uint64_t blocks_per_row = row_values / traits->block_size;
    constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
    if (blocks_per_row > kMaxU64 / traits->type_size ||
        rows > kMaxU64 / (blocks_per_row * traits->type_size))
        fail(what + "byte size overflows (" + std::to_string(n) + " " + traits->name + " values)");
    const uint64_t row_bytes = blocks_per_row * traits->type_size;
    tensor.n_elements = n;
    tensor.n_bytes = rows * row_bytes;
}

}  // namespace gguf_format
}  // namespace spillway
