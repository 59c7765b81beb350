// GGUF reader. Every count, length and offset comes from an untrusted file, so each is
// checked against the bytes that remain before anything is allocated or dereferenced.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_format.h"

namespace spillway {
namespace {

using namespace gguf_format;

std::string hex32(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

// A bounds-checked little-endian cursor over the file image. `what` is a callable that
// names the field; it is only called to build an error message, so the happy path never
// pays for string building (a vocabulary has ~10^5 elements).
class Cursor {
public:
    Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return size_ - pos_; }

    template <typename Name>
    void need(uint64_t n, const Name& what) const {
        if (n > remaining())
            fail("gguf: " + what() + ": needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                 " but the file has only " + std::to_string(remaining()) + " left (truncated file?)");
    }

    template <typename T, typename Name>
    T read(const Name& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));  // the format is little-endian, like every host we run on
        pos_ += sizeof(T);
        return v;
    }

    template <typename Name>
    std::string read_string(const Name& what) {
        uint64_t len = read<uint64_t>([&] { return what() + " length"; });
        if (len > remaining())
            fail("gguf: " + what() + ": string length " + std::to_string(len) + " at offset " +
                 std::to_string(pos_ - 8) + " exceeds the " + std::to_string(remaining()) +
                 " bytes left in the file");
        std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
        pos_ += len;
        return s;
    }

private:
    const uint8_t* data_;
    uint64_t size_;
    uint64_t pos_ = 0;
};

// Names a value in messages: "key 'x'" or, inside arrays, "key 'x'[3][0]".
struct ValuePath {
    const std::string& key;
    std::vector<uint64_t> indices;

    std::string operator()() const {
        std::string s = "key '" + key + "'";
        for (uint64_t k : indices) {
            s += '[';
            s += std::to_string(k);
            s += ']';
        }
        return s;
    }
};

// Reads one value of `raw_type`; `path` names it and tracks the array nesting depth.
GgufValue read_value(Cursor& in, uint32_t raw_type, ValuePath& path) {
    const ValuePath& what = path;
    if (!is_known_value_type(raw_type))
        fail("gguf: " + what() + ": unknown value type " + std::to_string(raw_type));
    GgufValue v;
    v.type = static_cast<GgufValueType>(raw_type);
    switch (v.type) {
        case GgufValueType::UINT8: v.u = in.read<uint8_t>(what); break;
        case GgufValueType::UINT16: v.u = in.read<uint16_t>(what); break;
        case GgufValueType::UINT32: v.u = in.read<uint32_t>(what); break;
        case GgufValueType::UINT64: v.u = in.read<uint64_t>(what); break;
        case GgufValueType::INT8: v.i = in.read<int8_t>(what); break;
        case GgufValueType::INT16: v.i = in.read<int16_t>(what); break;
        case GgufValueType::INT32: v.i = in.read<int32_t>(what); break;
        case GgufValueType::INT64: v.i = in.read<int64_t>(what); break;
        case GgufValueType::FLOAT32: v.f = in.read<float>(what); break;
        case GgufValueType::FLOAT64: v.f = in.read<double>(what); break;
        case GgufValueType::BOOL: {
            uint8_t b = in.read<uint8_t>(what);
            if (b > 1) fail("gguf: " + what() + ": bool value " + std::to_string(b) + " is not 0 or 1");
            v.b = b != 0;
            break;
        }
        case GgufValueType::STRING: v.s = in.read_string(what); break;
        case GgufValueType::ARRAY: {
            if (path.indices.size() >= static_cast<size_t>(kMaxArrayDepth))
                fail("gguf: " + what() + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
            uint32_t element_type = in.read<uint32_t>([&] { return what() + " array type"; });
            if (!is_known_value_type(element_type))
                fail("gguf: " + what() + ": unknown array element type " + std::to_string(element_type));
            v.array_type = static_cast<GgufValueType>(element_type);
            uint64_t count = in.read<uint64_t>([&] { return what() + " array count"; });
            // Bound the count by what the remaining bytes could hold before reserving.
            uint64_t min_size = min_value_size(element_type);
            if (count > in.remaining() / min_size)
                fail("gguf: " + what() + ": array count " + std::to_string(count) + " of " +
                     gguf_value_type_name(v.array_type) + " needs at least " +
                     (count > UINT64_MAX / min_size ? std::string("2^64") : std::to_string(count * min_size)) +
                     " bytes but the file has only " + std::to_string(in.remaining()) + " left");
            if (count > kMaxArrayElements)
                fail("gguf: " + what() + ": array count " + std::to_string(count) + " exceeds the limit of " +
                     std::to_string(kMaxArrayElements));
            v.array.reserve(static_cast<size_t>(std::min(count, kMaxReserve)));
            path.indices.push_back(0);
            for (uint64_t k = 0; k < count; ++k) {
                path.indices.back() = k;
                v.array.push_back(read_value(in, element_type, path));
            }
            path.indices.pop_back();
            break;
        }
    }
    return v;
}

// Minimum bytes of one tensor info: name length, n_dims, one dim, type, offset.
constexpr uint64_t kMinTensorInfoSize = 8 + 4 + 8 + 4 + 8;
// Minimum bytes of one key/value pair: key length, value type, a one-byte value.
constexpr uint64_t kMinKvSize = 8 + 4 + 1;

}  // namespace

GgufHeader parse_gguf(const uint8_t* data, size_t size, uint64_t* data_offset) {
    Cursor in(data, data ? size : 0);
    GgufHeader header;

    uint32_t magic = in.read<uint32_t>([] { return std::string("magic"); });
    if (magic != kMagic)
        fail("gguf: bad magic " + hex32(magic) + " (expected " + hex32(kMagic) + ", \"GGUF\"): not a GGUF file");
    uint32_t version = in.read<uint32_t>([] { return std::string("version"); });
    if (version == 1)
        fail("gguf: version 1 is not supported (32-bit counts; re-convert the model to GGUF v2 or v3)");
    if (version == 0x02000000 || version == 0x03000000)
        fail("gguf: version " + hex32(version) + " looks like a big-endian GGUF file, which is not supported");
    if (version != 2 && version != 3)
        fail("gguf: unsupported version " + std::to_string(version) + " (supported: 2, 3)");
    header.version = version;

    uint64_t n_tensors = in.read<uint64_t>([] { return std::string("tensor_count"); });
    uint64_t n_kv = in.read<uint64_t>([] { return std::string("metadata_kv_count"); });
    // Each entry takes some minimum number of bytes, so counts the file cannot hold are
    // rejected here, before anything is reserved.
    if (n_kv > in.remaining() / kMinKvSize)
        fail("gguf: metadata_kv_count " + std::to_string(n_kv) + " cannot fit in the " +
             std::to_string(in.remaining()) + " bytes after the header");
    if (n_tensors > in.remaining() / kMinTensorInfoSize)
        fail("gguf: tensor_count " + std::to_string(n_tensors) + " cannot fit in the " +
             std::to_string(in.remaining()) + " bytes after the header");

    if (n_kv > kMaxMetadataKeys)
        fail("gguf: metadata_kv_count " + std::to_string(n_kv) + " exceeds the limit of " +
             std::to_string(kMaxMetadataKeys));
    if (n_tensors > kMaxTensors)
        fail("gguf: tensor_count " + std::to_string(n_tensors) + " exceeds the limit of " +
             std::to_string(kMaxTensors));
    header.metadata.reserve(static_cast<size_t>(std::min(n_kv, kMaxReserve)));
    std::unordered_set<std::string> keys;
    for (uint64_t k = 0; k < n_kv; ++k) {
        std::string key = in.read_string([&] { return "key of metadata entry " + std::to_string(k); });
        if (!keys.insert(key).second) fail("gguf: duplicate metadata key '" + key + "'");
        ValuePath path{key, {}};
        uint32_t type = in.read<uint32_t>([&] { return path() + " value type"; });
        GgufValue value = read_value(in, type, path);
        header.metadata.emplace_back(std::move(key), std::move(value));
    }

    if (const GgufValue* a = header.find(kAlignmentKey)) {
        auto alignment = a->as_uint();
        if (!alignment)
            fail(std::string("gguf: ") + kAlignmentKey + " has type " + gguf_value_type_name(a->type) +
                 ", expected an unsigned integer");
        if (!is_power_of_two(*alignment))
            fail(std::string("gguf: ") + kAlignmentKey + " " + std::to_string(*alignment) +
                 " is not a nonzero power of two");
        header.alignment = *alignment;
    } else {
        header.alignment = kDefaultAlignment;
    }

    header.tensors.reserve(static_cast<size_t>(std::min(n_tensors, kMaxReserve)));
    std::unordered_set<std::string> names;
    for (uint64_t t = 0; t < n_tensors; ++t) {
        GgufTensorInfo info;
        info.name = in.read_string([&] { return "name of tensor " + std::to_string(t); });
        auto what = [&] { return "tensor '" + info.name + "'"; };
        if (!names.insert(info.name).second) fail("gguf: duplicate tensor name '" + info.name + "'");
        uint32_t n_dims = in.read<uint32_t>([&] { return what() + " n_dims"; });
        if (n_dims == 0 || n_dims > kMaxDims)
            fail("gguf: " + what() + ": n_dims " + std::to_string(n_dims) + " is outside 1.." +
                 std::to_string(kMaxDims));
        info.shape.resize(n_dims);
        for (uint32_t d = 0; d < n_dims; ++d)
            info.shape[d] = in.read<uint64_t>([&] { return what() + " dim " + std::to_string(d); });
        uint32_t raw_type = in.read<uint32_t>([&] { return what() + " type"; });
        if (!ggml_type_traits(raw_type))
            fail("gguf: " + what() + ": unknown ggml type " + std::to_string(raw_type));
        info.type = static_cast<GgmlType>(raw_type);
        info.offset = in.read<uint64_t>([&] { return what() + " offset"; });
        compute_tensor_size(info);
        if (info.offset % header.alignment != 0)
            fail("gguf: " + what() + ": offset " + std::to_string(info.offset) + " is not a multiple of the alignment " +
                 std::to_string(header.alignment));
        header.tensors.push_back(std::move(info));
    }

    auto data_start = align_up(in.pos(), header.alignment);
    if (!data_start) fail("gguf: data section offset overflows with alignment " + std::to_string(header.alignment));
    const uint64_t file_size = in.pos() + in.remaining();
    // A file without tensors may end right after its tensor infos, unpadded.
    if (*data_start > file_size && !header.tensors.empty())
        fail("gguf: data section starts at " + std::to_string(*data_start) + ", past the end of the file (" +
             std::to_string(file_size) + " bytes)");
    const uint64_t data_bytes = *data_start > file_size ? 0 : file_size - *data_start;

    for (const GgufTensorInfo& t : header.tensors) {
        if (t.offset > data_bytes || t.n_bytes > data_bytes - t.offset)
            fail("gguf: tensor '" + t.name + "': offset " + std::to_string(t.offset) + " + " +
                 std::to_string(t.n_bytes) + " bytes exceeds data section (" + std::to_string(data_bytes) +
                 " bytes)");
    }
    // Overlap check on offsets sorted ascending; extents are already in bounds so no overflow.
    std::vector<const GgufTensorInfo*> by_offset;
    by_offset.reserve(header.tensors.size());
    for (const GgufTensorInfo& t : header.tensors) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < by_offset.size(); ++k) {
        const GgufTensorInfo& prev = *by_offset[k - 1];
        const GgufTensorInfo& next = *by_offset[k];
        if (prev.offset + prev.n_bytes > next.offset)
            fail("gguf: tensors '" + prev.name + "' (offset " + std::to_string(prev.offset) + ", " +
                 std::to_string(prev.n_bytes) + " bytes) and '" + next.name + "' (offset " +
                 std::to_string(next.offset) + ") overlap");
    }

    if (data_offset) *data_offset = *data_start;
    return header;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        fail(path + ": cannot stat: " + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(path + ": not a regular file");
    }
    std::unique_ptr<GgufFile> file(new GgufFile());
    file->path_ = path;
    file->size_ = static_cast<uint64_t>(st.st_size);
    if (file->size_ > 0) {
        void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            fail(path + ": cannot mmap " + std::to_string(file->size_) + " bytes: " + std::strerror(err));
        }
        file->map_ = static_cast<const uint8_t*>(map);
    }
    ::close(fd);  // the mapping keeps the file alive
    try {
        file->header_ = parse_gguf(file->map_, file->size_, &file->data_offset_);
    } catch (const Error& e) {
        fail(path + ": " + e.what());  // `file` unmaps on the way out
    }
    return file;
}

GgufFile::~GgufFile() {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

const uint8_t* GgufFile::tensor_data(const GgufTensorInfo& tensor) const {
    // Extents were validated at open; a tensor info from another file would not be.
    if (data_offset_ > size_ || tensor.offset > size_ - data_offset_ || tensor.n_bytes > size_ - data_offset_ - tensor.offset)
        fail(path_ + ": tensor '" + tensor.name + "' is not inside this file's data section");
    return map_ + data_offset_ + tensor.offset;
}

}  // namespace spillway
