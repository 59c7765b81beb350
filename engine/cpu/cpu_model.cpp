#include "engine/cpu/cpu_model.h"

#include <string>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/quants.h"
#include "kv/kv_codec.h"

namespace spillway {
namespace {

std::string shape_text(const std::vector<uint64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

const GgufTensorInfo& require_tensor(const GgufFile& file, const std::string& name,
                                     std::vector<uint64_t> shape) {
    const GgufTensorInfo* t = file.header().find_tensor(name);
    if (!t) fail("model has no tensor " + name);
    // GGUF may drop trailing 1s; compare after padding.
    std::vector<uint64_t> have = t->shape;
    while (have.size() < shape.size()) have.push_back(1);
    while (shape.size() < have.size()) shape.push_back(1);
    if (have != shape)
        fail("tensor " + name + " has shape " + shape_text(t->shape) + ", expected " + shape_text(shape));
    return *t;
}

WeightMatrix bind_matrix(const GgufFile& file, const std::string& name, uint32_t n_in, uint32_t n_out) {
    const GgufTensorInfo& t = require_tensor(file, name, {n_in, n_out});
    if (!find_weight_kernels(t.type))
        fail("tensor " + name + " has type " + ggml_type_name(t.type) + ", which the CPU engine does not support");
    return make_weight_matrix(t.type, file.tensor_data(t), n_in, n_out);
}

std::vector<float> load_vector(const GgufFile& file, const std::string& name, uint32_t n) {
    const GgufTensorInfo& t = require_tensor(file, name, {n});
    if (!is_dequantizable(t.type)) fail("tensor " + name + " has unsupported type " + ggml_type_name(t.type));
    std::vector<float> v(n);
    dequantize_row(t.type, file.tensor_data(t), v.data(), n);
    return v;
}

void check_matrix(const WeightMatrix& w, const char* what, uint32_t n_in, uint32_t n_out) {
    if (!w.data || !w.kernels || w.n_in != n_in || w.n_out != n_out)
        fail(std::string("CPU model: ") + what + " has the wrong shape or is missing");
}

}  // namespace

void finish_cpu_model(CpuModel& m) {
    const ModelSpec& s = m.spec;
    if (s.n_layer == 0 || s.layers.size() != s.n_layer || m.layers.size() != s.n_layer)
        fail("CPU model: layer count mismatch");
    m.n_head_kv = s.layers[0].n_head_kv;
    for (const LayerSpec& l : s.layers)
        if (l.n_head != s.n_head || l.n_head_kv != m.n_head_kv)
            fail("CPU model: per-layer head counts that vary are not supported");
    if (m.n_head_kv == 0 || s.n_head % m.n_head_kv != 0) fail("CPU model: n_head must be a multiple of n_head_kv");
    const uint32_t q_dim = s.n_head * s.head_dim_k, kv_dim_k = m.n_head_kv * s.head_dim_k,
                   kv_dim_v = m.n_head_kv * s.head_dim_v, attn_dim = s.n_head * s.head_dim_v;
    check_matrix(m.token_embd, "token_embd", s.n_embd, s.n_vocab);
    check_matrix(m.output, "output", s.n_embd, s.n_vocab);
    if (m.output_norm.size() != s.n_embd) fail("CPU model: output_norm has the wrong size");
    for (const CpuLayerWeights& l : m.layers) {
        check_matrix(l.wq, "attn_q", s.n_embd, q_dim);
        check_matrix(l.wk, "attn_k", s.n_embd, kv_dim_k);
        check_matrix(l.wv, "attn_v", s.n_embd, kv_dim_v);
        check_matrix(l.wo, "attn_output", attn_dim, s.n_embd);
        check_matrix(l.ffn_gate, "ffn_gate", s.n_embd, s.n_ff);
        check_matrix(l.ffn_up, "ffn_up", s.n_embd, s.n_ff);
        check_matrix(l.ffn_down, "ffn_down", s.n_ff, s.n_embd);
        if (l.attn_norm.size() != s.n_embd || l.ffn_norm.size() != s.n_embd) fail("CPU model: norm size mismatch");
        if (!l.bq.empty() && (l.bq.size() != q_dim || l.bk.size() != kv_dim_k || l.bv.size() != kv_dim_v))
            fail("CPU model: QKV bias size mismatch");
    }
    m.rope = make_rope_tables(s.rope, s.head_dim_k);
}

CpuModel load_cpu_model(std::shared_ptr<const GgufFile> file, const ModelSpec& spec) {
    CpuModel m;
    m.spec = spec;
    m.file = file;
    const GgufFile& f = *file;
    const uint32_t n_head_kv = spec.layers.empty() ? 0 : spec.layers[0].n_head_kv;
    m.token_embd = bind_matrix(f, "token_embd.weight", spec.n_embd, spec.n_vocab);
    m.output_norm = load_vector(f, "output_norm.weight", spec.n_embd);
    m.output = f.header().find_tensor("output.weight") ? bind_matrix(f, "output.weight", spec.n_embd, spec.n_vocab)
                                                       : m.token_embd;
    for (uint32_t i = 0; i < spec.n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        CpuLayerWeights l;
        l.attn_norm = load_vector(f, p + "attn_norm.weight", spec.n_embd);
        l.wq = bind_matrix(f, p + "attn_q.weight", spec.n_embd, spec.n_head * spec.head_dim_k);
        l.wk = bind_matrix(f, p + "attn_k.weight", spec.n_embd, n_head_kv * spec.head_dim_k);
        l.wv = bind_matrix(f, p + "attn_v.weight", spec.n_embd, n_head_kv * spec.head_dim_v);
        l.wo = bind_matrix(f, p + "attn_output.weight", spec.n_head * spec.head_dim_v, spec.n_embd);
        if (f.header().find_tensor(p + "attn_q.bias")) {
            l.bq = load_vector(f, p + "attn_q.bias", spec.n_head * spec.head_dim_k);
            l.bk = load_vector(f, p + "attn_k.bias", n_head_kv * spec.head_dim_k);
            l.bv = load_vector(f, p + "attn_v.bias", n_head_kv * spec.head_dim_v);
        }
        l.ffn_norm = load_vector(f, p + "ffn_norm.weight", spec.n_embd);
        l.ffn_gate = bind_matrix(f, p + "ffn_gate.weight", spec.n_embd, spec.n_ff);
        l.ffn_up = bind_matrix(f, p + "ffn_up.weight", spec.n_embd, spec.n_ff);
        l.ffn_down = bind_matrix(f, p + "ffn_down.weight", spec.n_ff, spec.n_embd);
        m.layers.push_back(std::move(l));
    }
    finish_cpu_model(m);
    return m;
}

uint64_t decode_bytes_per_token(const CpuModel& m, uint64_t n_cells, KvType k_type, KvType v_type) {
    // One embedding row plus every matrix; the head is read whole each step.
    uint64_t bytes = m.token_embd.row_bytes + m.output.bytes();
    for (const CpuLayerWeights& l : m.layers)
        bytes += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.ffn_gate.bytes() +
                 l.ffn_up.bytes() + l.ffn_down.bytes();
    const uint64_t kv_cell = kv_bytes(k_type, (uint64_t)m.n_head_kv * m.spec.head_dim_k) +
                             kv_bytes(v_type, (uint64_t)m.n_head_kv * m.spec.head_dim_v);
    return bytes + kv_cell * m.spec.n_layer * n_cells;
}

}  // namespace spillway

namespace spillway {

CpuModel load_cpu_model_file(const std::string& path) {
    std::shared_ptr<const GgufFile> file = GgufFile::open(path);
    return load_cpu_model(file, model_spec_from_gguf(file->header()));
}

}  // namespace spillway
