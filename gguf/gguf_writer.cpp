// GGUF writer: validates the header with the reader's rules, computes aligned offsets,
// then streams header, tensor bytes and padding through a buffered file descriptor.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_format.h"

namespace spillway {
namespace {

using namespace gguf_format;

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, p, n);
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
    put_bytes(out, &v, sizeof v);  // little-endian host, like the format
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    put_bytes(out, s.data(), s.size());
}

void check_range(bool ok, const std::string& what, const GgufValue& v, const std::string& value_text) {
    if (!ok)
        fail("gguf: " + what + ": value " + value_text + " does not fit " + gguf_value_type_name(v.type));
}

// Serializes the value's payload (not its type tag), checking it fits its declared type.
void put_value(std::vector<uint8_t>& out, const GgufValue& v, const std::string& what, int depth) {
    const uint32_t raw_type = static_cast<uint32_t>(v.type);
    if (!is_known_value_type(raw_type)) fail("gguf: " + what + ": unknown value type " + std::to_string(raw_type));
    const std::string u_text = std::to_string(v.u);
    const std::string i_text = std::to_string(v.i);
    switch (v.type) {
        case GgufValueType::UINT8: check_range(v.u <= UINT8_MAX, what, v, u_text); put<uint8_t>(out, v.u); break;
        case GgufValueType::UINT16: check_range(v.u <= UINT16_MAX, what, v, u_text); put<uint16_t>(out, v.u); break;
        case GgufValueType::UINT32: check_range(v.u <= UINT32_MAX, what, v, u_text); put<uint32_t>(out, v.u); break;
        case GgufValueType::UINT64: put<uint64_t>(out, v.u); break;
        case GgufValueType::INT8:
            check_range(v.i >= INT8_MIN && v.i <= INT8_MAX, what, v, i_text);
            put<int8_t>(out, static_cast<int8_t>(v.i));
            break;
        case GgufValueType::INT16:
            check_range(v.i >= INT16_MIN && v.i <= INT16_MAX, what, v, i_text);
            put<int16_t>(out, static_cast<int16_t>(v.i));
            break;
        case GgufValueType::INT32:
            check_range(v.i >= INT32_MIN && v.i <= INT32_MAX, what, v, i_text);
            put<int32_t>(out, static_cast<int32_t>(v.i));
            break;
        case GgufValueType::INT64: put<int64_t>(out, v.i); break;
        case GgufValueType::FLOAT32: put<float>(out, static_cast<float>(v.f)); break;
        case GgufValueType::FLOAT64: put<double>(out, v.f); break;
        case GgufValueType::BOOL: put<uint8_t>(out, v.b ? 1 : 0); break;
        case GgufValueType::STRING: put_string(out, v.s); break;
        case GgufValueType::ARRAY: {
            if (depth >= kMaxArrayDepth)
                fail("gguf: " + what + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
            const uint32_t element_type = static_cast<uint32_t>(v.array_type);
            if (!is_known_value_type(element_type))
                fail("gguf: " + what + ": unknown array element type " + std::to_string(element_type));
            if (v.array.size() > kMaxArrayElements)
                fail("gguf: " + what + ": array count " + std::to_string(v.array.size()) +
                     " exceeds the limit of " + std::to_string(kMaxArrayElements));
            put<uint32_t>(out, element_type);
            put<uint64_t>(out, v.array.size());
            for (size_t k = 0; k < v.array.size(); ++k) {
                const std::string item = what + "[" + std::to_string(k) + "]";
                if (v.array[k].type != v.array_type)
                    fail("gguf: " + item + ": element of type " + gguf_value_type_name(v.array[k].type) +
                         " in an array of " + gguf_value_type_name(v.array_type));
                put_value(out, v.array[k], item, depth + 1);
            }
            break;
        }
    }
}

// Validates the header, fills alignment key, offsets and sizes, and returns the serialized
// header padded to the start of the data section.
std::vector<uint8_t> serialize_header(GgufHeader& header) {
    if (header.version != 2 && header.version != 3)
        fail("gguf: cannot write version " + std::to_string(header.version) + " (supported: 2, 3)");
    if (!is_power_of_two(header.alignment))
        fail("gguf: alignment " + std::to_string(header.alignment) + " is not a nonzero power of two");
    if (const GgufValue* a = header.find(kAlignmentKey)) {
        auto key_alignment = a->as_uint();
        if (!key_alignment || *key_alignment != header.alignment)
            fail(std::string("gguf: ") + kAlignmentKey + " (" +
                 (key_alignment ? std::to_string(*key_alignment) : gguf_value_type_name(a->type)) +
                 ") disagrees with the header alignment " + std::to_string(header.alignment));
    } else if (header.alignment != kDefaultAlignment) {
        header.set(kAlignmentKey, header.alignment <= UINT32_MAX
                                      ? GgufValue::make_u32(static_cast<uint32_t>(header.alignment))
                                      : GgufValue::make_u64(header.alignment));
    }

    if (header.tensors.size() > kMaxTensors || header.metadata.size() > kMaxMetadataKeys)
        fail("gguf: " + std::to_string(header.tensors.size()) + " tensors and " +
             std::to_string(header.metadata.size()) + " metadata keys exceed the reader's limits (" +
             std::to_string(kMaxTensors) + ", " + std::to_string(kMaxMetadataKeys) + ")");

    std::vector<uint8_t> out;
    put<uint32_t>(out, kMagic);
    put<uint32_t>(out, header.version);
    put<uint64_t>(out, header.tensors.size());
    put<uint64_t>(out, header.metadata.size());

    std::unordered_set<std::string> keys;
    for (const auto& [key, value] : header.metadata) {
        if (!keys.insert(key).second) fail("gguf: duplicate metadata key '" + key + "'");
        put_string(out, key);
        put<uint32_t>(out, static_cast<uint32_t>(value.type));
        put_value(out, value, "key '" + key + "'", 0);
    }

    std::unordered_set<std::string> names;
    uint64_t next_offset = 0;
    for (GgufTensorInfo& t : header.tensors) {
        if (!names.insert(t.name).second) fail("gguf: duplicate tensor name '" + t.name + "'");
        compute_tensor_size(t);
        t.offset = next_offset;
        auto end = next_offset <= UINT64_MAX - t.n_bytes ? align_up(next_offset + t.n_bytes, header.alignment)
                                                         : std::nullopt;
        if (!end) fail("gguf: tensor '" + t.name + "': data offsets overflow");
        next_offset = *end;
        put_string(out, t.name);
        put<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
        for (uint64_t dim : t.shape) put<uint64_t>(out, dim);
        put<uint32_t>(out, static_cast<uint32_t>(t.type));
        put<uint64_t>(out, t.offset);
    }
    out.resize(*align_up(out.size(), header.alignment), 0);
    return out;
}

}  // namespace

struct GgufWriter::Impl {
    std::string path;
    std::string tmp_path;
    int fd = -1;
    std::vector<uint8_t> buffer;  // coalesces small writes; large ones go straight through
    size_t tensor_index = 0;
    uint64_t tensor_written = 0;
    bool finished = false;

    static constexpr size_t kBufferBytes = size_t{4} << 20;

    [[noreturn]] void io_fail(const std::string& action, int err) const {
        fail("gguf: cannot " + action + " '" + tmp_path + "': " + std::strerror(err));
    }

    void write_all(const uint8_t* p, size_t n) {
        while (n > 0) {
            ssize_t w = ::write(fd, p, n);
            if (w < 0) {
                if (errno == EINTR) continue;
                io_fail("write", errno);
            }
            if (w == 0) io_fail("write", EIO);
            p += w;
            n -= static_cast<size_t>(w);
        }
    }

    void flush() {
        write_all(buffer.data(), buffer.size());
        buffer.clear();
    }

    void emit(const uint8_t* p, size_t n) {
        if (buffer.size() + n > kBufferBytes) flush();
        if (n >= kBufferBytes) {
            write_all(p, n);
        } else {
            buffer.insert(buffer.end(), p, p + n);
        }
    }

    void emit_zeros(size_t n) {
        static const uint8_t zeros[256] = {};
        while (n > 0) {
            size_t k = std::min(n, sizeof zeros);
            emit(zeros, k);
            n -= k;
        }
    }
};

GgufWriter::GgufWriter(const std::string& path, GgufHeader header) : impl_(std::make_unique<Impl>()) {
    std::vector<uint8_t> head = serialize_header(header);
    header_ = std::move(header);
    impl_->path = path;
    impl_->tmp_path = path + ".tmp";
    impl_->fd = ::open(impl_->tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (impl_->fd < 0) impl_->io_fail("create", errno);
    impl_->buffer.reserve(Impl::kBufferBytes);
    impl_->emit(head.data(), head.size());
}

GgufWriter::~GgufWriter() {
    if (!impl_ || impl_->finished) return;
    if (impl_->fd >= 0) {
        ::close(impl_->fd);
        ::unlink(impl_->tmp_path.c_str());
    }
}

void GgufWriter::write(const void* bytes, size_t n) {
    Impl& w = *impl_;
    if (w.finished) fail("gguf: write to '" + w.path + "' after finish()");
    const uint8_t* p = static_cast<const uint8_t*>(bytes);
    while (n > 0) {
        if (w.tensor_index >= header_.tensors.size())
            fail("gguf: '" + w.path + "': " + std::to_string(n) + " bytes written past the last tensor");
        const GgufTensorInfo& t = header_.tensors[w.tensor_index];
        const uint64_t take = std::min<uint64_t>(n, t.n_bytes - w.tensor_written);
        w.emit(p, static_cast<size_t>(take));
        p += take;
        n -= static_cast<size_t>(take);
        w.tensor_written += take;
        if (w.tensor_written == t.n_bytes) {
            // Pad to the next tensor's offset (the last tensor is padded too, like ggml's writer).
            const uint64_t end = t.offset + t.n_bytes;
            w.emit_zeros(static_cast<size_t>(*gguf_format::align_up(end, header_.alignment) - end));
            ++w.tensor_index;
            w.tensor_written = 0;
        }
    }
}

void GgufWriter::finish() {
    Impl& w = *impl_;
    if (w.finished) fail("gguf: finish() called twice for '" + w.path + "'");
    if (w.tensor_index < header_.tensors.size()) {
        const GgufTensorInfo& t = header_.tensors[w.tensor_index];
        fail("gguf: '" + w.path + "': tensor '" + t.name + "' has " + std::to_string(w.tensor_written) + " of " +
             std::to_string(t.n_bytes) + " bytes written (" + std::to_string(header_.tensors.size() - w.tensor_index) +
             " tensors incomplete)");
    }
    w.flush();
    // Durable before it appears under the final name, so a crash never leaves a torn file there.
    if (::fsync(w.fd) != 0) w.io_fail("sync", errno);
    int fd = w.fd;
    w.fd = -1;
    if (::close(fd) != 0) {
        int err = errno;
        ::unlink(w.tmp_path.c_str());
        w.io_fail("close", err);
    }
    if (::rename(w.tmp_path.c_str(), w.path.c_str()) != 0) {
        int err = errno;
        ::unlink(w.tmp_path.c_str());
        fail("gguf: cannot rename '" + w.tmp_path + "' to '" + w.path + "': " + std::strerror(err));
    }
    w.finished = true;
}

void write_gguf(const std::string& path, const GgufHeader& header,
                const std::vector<std::vector<uint8_t>>& tensor_bytes) {
    if (tensor_bytes.size() != header.tensors.size())
        fail("gguf: write_gguf('" + path + "'): " + std::to_string(tensor_bytes.size()) + " tensor buffers for " +
             std::to_string(header.tensors.size()) + " tensors");
    GgufWriter writer(path, header);
    for (size_t k = 0; k < tensor_bytes.size(); ++k) {
        const GgufTensorInfo& t = writer.header().tensors[k];
        if (tensor_bytes[k].size() != t.n_bytes)
            fail("gguf: write_gguf('" + path + "'): tensor '" + t.name + "' has " +
                 std::to_string(tensor_bytes[k].size()) + " bytes, expected " + std::to_string(t.n_bytes));
        writer.write(tensor_bytes[k].data(), tensor_bytes[k].size());
    }
    writer.finish();
}

}  // namespace spillway
