// Writes small valid GGUF files into a directory, as the fuzzer's seed corpus:
//   gguf_fuzz_seeds OUT_DIR [MODEL.gguf]
// With a model (e.g. from `spillway make-model --preset tiny`), two more seeds carry its real
// metadata (tokenizer arrays, chat template): the metadata alone as a valid file, and the
// model's header without its tensor data (invalid: a truncated download).
// Each file exercises a different part of the format (value types, nested arrays, v2,
// alignments, quantized tensor types) and stays small so the fuzzer mutates it quickly.
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"

namespace {

using spillway::GgmlType;
using spillway::GgufHeader;
using spillway::GgufTensorInfo;
using spillway::GgufValue;
using spillway::GgufValueType;

GgufTensorInfo tensor(const std::string& name, GgmlType type, std::vector<uint64_t> shape) {
    GgufTensorInfo t;
    t.name = name;
    t.type = type;
    t.shape = std::move(shape);
    return t;
}

GgufValue scalar(GgufValueType type, uint64_t bits) {
    GgufValue v;
    v.type = type;
    v.u = bits & 0xff;
    v.i = -static_cast<int64_t>(bits & 0x7f);
    v.f = static_cast<double>(bits & 0xffff) / 7.0;
    v.b = bits & 1;
    v.s = "s" + std::to_string(bits);
    return v;
}

void write(const std::string& dir, const std::string& name, const GgufHeader& header, std::mt19937& rng) {
    // Two passes: the writer computes n_bytes, then random bytes of that size are written.
    spillway::GgufWriter writer(dir + "/" + name, header);
    for (const GgufTensorInfo& t : writer.header().tensors) {
        std::vector<uint8_t> bytes(t.n_bytes);
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
        writer.write(bytes.data(), bytes.size());
    }
    writer.finish();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2 && argc != 3) {
        std::fprintf(stderr, "usage: %s OUT_DIR [MODEL.gguf]\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    std::mt19937 rng(12345);  // fixed: the corpus should be reproducible
    try {
        {  // every scalar type and an array of each
            GgufHeader h;
            const GgufValueType types[] = {GgufValueType::UINT8,  GgufValueType::INT8,   GgufValueType::UINT16,
                                           GgufValueType::INT16,  GgufValueType::UINT32, GgufValueType::INT32,
                                           GgufValueType::FLOAT32, GgufValueType::BOOL,  GgufValueType::STRING,
                                           GgufValueType::UINT64, GgufValueType::INT64,  GgufValueType::FLOAT64};
            for (GgufValueType t : types) {
                std::string name = spillway::gguf_value_type_name(t);
                h.set("scalar." + name, scalar(t, rng()));
                h.set("array." + name, GgufValue::make_array(t, {scalar(t, rng()), scalar(t, rng())}));
            }
            write(dir, "all_value_types.gguf", h, rng);
        }
        {  // nested arrays
            GgufHeader h;
            GgufValue inner = GgufValue::make_array(GgufValueType::STRING, {GgufValue::make_string("a")});
            GgufValue mid = GgufValue::make_array(GgufValueType::ARRAY, {inner, inner});
            h.set("nested", GgufValue::make_array(GgufValueType::ARRAY, {mid}));
            h.set("empty", GgufValue::make_array(GgufValueType::ARRAY, {}));
            h.tensors = {tensor("w", GgmlType::F32, {4, 2})};
            write(dir, "nested_arrays.gguf", h, rng);
        }
        {  // a tiny llama-shaped file, v3, default alignment
            GgufHeader h;
            h.set("general.architecture", GgufValue::make_string("llama"));
            h.set("llama.block_count", GgufValue::make_u32(1));
            h.set("llama.embedding_length", GgufValue::make_u32(32));
            h.set("llama.attention.head_count", GgufValue::make_u32(2));
            h.set("llama.attention.layer_norm_rms_epsilon", GgufValue::make_f32(1e-5f));
            h.set("tokenizer.ggml.model", GgufValue::make_string("gpt2"));
            std::vector<GgufValue> tokens;
            for (int k = 0; k < 8; ++k) tokens.push_back(GgufValue::make_string(std::string(1, 'a' + k)));
            h.set("tokenizer.ggml.tokens", GgufValue::make_array(GgufValueType::STRING, tokens));
            h.tensors = {tensor("token_embd.weight", GgmlType::F16, {32, 8}),
                         tensor("blk.0.attn_q.weight", GgmlType::Q8_0, {32, 32}),
                         tensor("blk.0.attn_norm.weight", GgmlType::F32, {32}),
                         tensor("blk.0.ffn_down.weight", GgmlType::Q4_0, {32, 4})};
            write(dir, "tiny_llama.gguf", h, rng);
        }
        {  // version 2, alignment 64, K-quants and bf16
            GgufHeader h;
            h.version = 2;
            h.alignment = 64;
            h.tensors = {tensor("k4", GgmlType::Q4_K, {256}), tensor("k6", GgmlType::Q6_K, {256}),
                         tensor("b", GgmlType::BF16, {3, 1, 1, 2})};
            write(dir, "v2_align64.gguf", h, rng);
        }
        {  // alignment 1 (no padding at all) and odd-sized tensors
            GgufHeader h;
            h.alignment = 1;
            h.tensors = {tensor("a", GgmlType::I8, {3}), tensor("b", GgmlType::F16, {5}),
                         tensor("c", GgmlType::MXFP4, {32})};
            write(dir, "align1.gguf", h, rng);
        }
        {  // metadata only
            GgufHeader h;
            h.set("general.name", GgufValue::make_string("no tensors"));
            write(dir, "metadata_only.gguf", h, rng);
        }
        if (argc == 3) {
            auto model = spillway::GgufFile::open(argv[2]);
            GgufHeader h = model->header();
            h.tensors.clear();
            write(dir, "model_metadata.gguf", h, rng);
            std::ifstream in(argv[2], std::ios::binary);
            std::vector<char> head(model->data_offset());
            in.read(head.data(), static_cast<std::streamsize>(head.size()));
            std::ofstream(dir + "/model_header_only.gguf", std::ios::binary).write(head.data(), in.gcount());
        }
    } catch (const spillway::Error& e) {
        std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
