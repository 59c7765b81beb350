#pragma once
// Builds GGUF headers (metadata + tensor table, no data) for a model shape, independently
// of model/presets.cpp, so ModelSpec is checked against hand computation, not against itself.
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace spillway::test {

struct Shape {
    std::string arch = "qwen2";
    uint32_t n_layer = 4;
    uint32_t n_embd = 256;
    uint32_t n_head = 4;
    uint32_t n_head_kv = 2;
    uint32_t n_ff = 512;
    uint32_t n_vocab = 1000;
    uint32_t n_ctx = 4096;
    float rope_base = 10000.0f;
    bool qkv_bias = true;
    bool tied = false;
    bool with_tokens = false;  // tokenizer.ggml.tokens array (else vocab from token_embd)
    bool with_tensors = true;
    GgmlType wtype = GgmlType::Q8_0;
};

inline GgufTensorInfo tensor_info(const std::string& name, std::vector<uint64_t> shape, GgmlType type) {
    GgufTensorInfo t;
    t.name = name;
    t.shape = std::move(shape);
    t.type = type;
    t.n_elements = 1;
    for (uint64_t d : t.shape) t.n_elements *= d;
    t.n_bytes = *ggml_row_bytes(type, t.n_elements);
    return t;
}

inline GgufHeader make_header(const Shape& s) {
    GgufHeader h;
    const std::string a = s.arch;
    h.set("general.architecture", GgufValue::make_string(a));
    h.set("general.name", GgufValue::make_string("test model"));
    h.set(a + ".block_count", GgufValue::make_u32(s.n_layer));
    h.set(a + ".embedding_length", GgufValue::make_u32(s.n_embd));
    h.set(a + ".attention.head_count", GgufValue::make_u32(s.n_head));
    h.set(a + ".attention.head_count_kv", GgufValue::make_u32(s.n_head_kv));
    h.set(a + ".feed_forward_length", GgufValue::make_u32(s.n_ff));
    h.set(a + ".context_length", GgufValue::make_u32(s.n_ctx));
    h.set(a + ".rope.freq_base", GgufValue::make_f32(s.rope_base));
    h.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::make_f32(1e-6f));
    if (s.with_tokens) {
        std::vector<GgufValue> tokens;
        for (uint32_t i = 0; i < s.n_vocab; ++i) tokens.push_back(GgufValue::make_string("t" + std::to_string(i)));
        h.set("tokenizer.ggml.tokens", GgufValue::make_array(GgufValueType::STRING, std::move(tokens)));
    }
    if (!s.with_tensors) return h;
    const uint64_t e = s.n_embd, hd = s.n_embd / s.n_head, q = s.n_head * hd, kv = s.n_head_kv * hd;
    const GgmlType w = s.wtype, f = GgmlType::F32;
    h.tensors.push_back(tensor_info("token_embd.weight", {e, s.n_vocab}, w));
    for (uint32_t il = 0; il < s.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        h.tensors.push_back(tensor_info(p + "attn_norm.weight", {e}, f));
        h.tensors.push_back(tensor_info(p + "attn_q.weight", {e, q}, w));
        h.tensors.push_back(tensor_info(p + "attn_k.weight", {e, kv}, w));
        h.tensors.push_back(tensor_info(p + "attn_v.weight", {e, kv}, w));
        if (s.qkv_bias) {
            h.tensors.push_back(tensor_info(p + "attn_q.bias", {q}, f));
            h.tensors.push_back(tensor_info(p + "attn_k.bias", {kv}, f));
            h.tensors.push_back(tensor_info(p + "attn_v.bias", {kv}, f));
        }
        h.tensors.push_back(tensor_info(p + "attn_output.weight", {q, e}, w));
        h.tensors.push_back(tensor_info(p + "ffn_norm.weight", {e}, f));
        h.tensors.push_back(tensor_info(p + "ffn_gate.weight", {e, s.n_ff}, w));
        h.tensors.push_back(tensor_info(p + "ffn_up.weight", {e, s.n_ff}, w));
        h.tensors.push_back(tensor_info(p + "ffn_down.weight", {s.n_ff, e}, w));
    }
    h.tensors.push_back(tensor_info("output_norm.weight", {e}, f));
    if (!s.tied) h.tensors.push_back(tensor_info("output.weight", {e, s.n_vocab}, w));
    return h;
}

inline void erase_key(GgufHeader& h, const std::string& key) {
    for (auto it = h.metadata.begin(); it != h.metadata.end(); ++it)
        if (it->first == key) {
            h.metadata.erase(it);
            return;
        }
}

inline GgufTensorInfo* find_tensor(GgufHeader& h, const std::string& name) {
    for (GgufTensorInfo& t : h.tensors)
        if (t.name == name) return &t;
    return nullptr;
}

inline GgufValue u32_array(const std::vector<uint32_t>& values) {
    std::vector<GgufValue> items;
    for (uint32_t v : values) items.push_back(GgufValue::make_u32(v));
    return GgufValue::make_array(GgufValueType::UINT32, std::move(items));
}

}  // namespace spillway::test
