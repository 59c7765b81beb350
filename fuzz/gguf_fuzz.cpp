// libFuzzer entry for the GGUF reader: any input must parse or throw spillway::Error; any
// other exception, sanitizer report or broken invariant below is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/error.h"
#include "gguf/gguf.h"

namespace {

// What a caller relies on once parse_gguf returns: every tensor's bytes lie inside the
// input, aligned, without overlapping the next one in the file.
void check_invariants(const spillway::GgufHeader& header, uint64_t data_offset, size_t size) {
    if (header.alignment == 0 || (header.alignment & (header.alignment - 1)) != 0) std::abort();
    if (!header.tensors.empty() && data_offset > size) std::abort();
    if (data_offset % header.alignment != 0) std::abort();
    for (const spillway::GgufTensorInfo& t : header.tensors) {
        if (t.offset % header.alignment != 0) std::abort();
        if (t.offset > size - data_offset || t.n_bytes > size - data_offset - t.offset) std::abort();
        if (t.shape.empty() || t.shape.size() > 4 || t.n_bytes == 0) std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        uint64_t data_offset = 0;
        spillway::GgufHeader header = spillway::parse_gguf(data, size, &data_offset);
        check_invariants(header, data_offset, size);
    } catch (const spillway::Error&) {
        // The expected outcome for malformed input.
    }
    return 0;
}
