#include "model/model_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

#include "common/error.h"
#include "gguf/gguf.h"

namespace spillway {

const char* arch_name(Arch arch) {
    switch (arch) {
        case Arch::llama: return "llama";
        case Arch::qwen2: return "qwen2";
    }
    return "?";
}

const char* kv_type_name(KvType type) {
    switch (type) {
        case KvType::f16: return "f16";
        case KvType::q8_0: return "q8_0";
        case KvType::q4_0: return "q4_0";
    }
    return "?";
}

std::optional<KvType> kv_type_from_name(const std::string& name) {
    for (KvType t : {KvType::f16, KvType::q8_0, KvType::q4_0})
        if (name == kv_type_name(t)) return t;
    return std::nullopt;
}

GgmlType kv_ggml_type(KvType type) {
    switch (type) {
        case KvType::f16: return GgmlType::F16;
        case KvType::q8_0: return GgmlType::Q8_0;
        case KvType::q4_0: return GgmlType::Q4_0;
    }
    return GgmlType::F16;
}

uint64_t kv_row_bytes(KvType type, uint64_t n_values) {
    auto bytes = ggml_row_bytes(kv_ggml_type(type), n_values);
    if (!bytes)
        fail(std::string("a KV row of ") + std::to_string(n_values) + " values cannot be stored as " +
             kv_type_name(type) + " (needs a multiple of " +
             std::to_string(ggml_traits(kv_ggml_type(type)).block_size) + " values)");
    return *bytes;
}

namespace {

constexpr uint32_t kMaxLayers = 4096;  // far above any real model; bounds allocations from a hostile file

std::string join(const std::vector<std::string>& items, const char* separator) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
    return out;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
    std::string out = "[";
    for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
}

// Reads `{arch}.*` keys, recording every missing or mistyped key instead of stopping at the
// first, so the user sees all that is wrong with a file in one message.
class MetadataReader {
public:
    MetadataReader(const GgufHeader& header, std::string arch) : header_(header), arch_(std::move(arch)) {}

    std::string key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }
    const GgufValue* find(std::string_view suffix) const { return header_.find(key(suffix)); }

    std::optional<uint32_t> u32(std::string_view suffix, bool required) {
        const GgufValue* v = find(suffix);
        if (!v) {
            if (required) missing.push_back(key(suffix));
            return std::nullopt;
        }
        return to_u32(*v, key(suffix));
    }

    std::optional<float> f32(std::string_view suffix) {
        const GgufValue* v = find(suffix);
        if (!v) return std::nullopt;
        auto f = v->as_float();
        if (!f || !std::isfinite(*f)) {
            bad.push_back(key(suffix) + " must be a finite number (found " + describe(*v) + ")");
            return std::nullopt;
        }
        return (float)*f;
    }

    std::optional<std::string> str(std::string_view suffix) {
        const GgufValue* v = find(suffix);
        if (!v) return std::nullopt;
        if (v->type != GgufValueType::STRING) {
            bad.push_back(key(suffix) + " must be a string (found " + describe(*v) + ")");
            return std::nullopt;
        }
        return v->s;
    }

    // A key that is either one value for all layers or an array with one value per layer.
    // n_layer == 0 means the layer count is unknown (itself missing): only presence is checked.
    std::optional<std::vector<uint32_t>> per_layer(std::string_view suffix, uint32_t n_layer, bool required) {
        const GgufValue* v = find(suffix);
        if (!v) {
            if (required) missing.push_back(key(suffix));
            return std::nullopt;
        }
        if (n_layer == 0) return std::nullopt;
        if (v->type != GgufValueType::ARRAY) {
            auto x = to_u32(*v, key(suffix));
            if (!x) return std::nullopt;
            return std::vector<uint32_t>(n_layer, *x);
        }
        if (v->array.size() != n_layer) {
            bad.push_back(key(suffix) + " has " + std::to_string(v->array.size()) + " per-layer values but block_count is " +
                          std::to_string(n_layer));
            return std::nullopt;
        }
        std::vector<uint32_t> out;
        for (size_t i = 0; i < v->array.size(); ++i) {
            auto x = to_u32(v->array[i], key(suffix) + "[" + std::to_string(i) + "]");
            if (!x) return std::nullopt;
            out.push_back(*x);
        }
        return out;
    }

    std::vector<std::string> missing;
    std::vector<std::string> bad;

private:
    static std::string describe(const GgufValue& v) {
        if (v.type == GgufValueType::STRING) return "string \"" + v.s.substr(0, 40) + "\"";
        if (v.type == GgufValueType::ARRAY) return "array of " + std::to_string(v.array.size());
        if (auto i = v.as_int()) return std::string(gguf_value_type_name(v.type)) + " " + std::to_string(*i);
        if (auto f = v.as_float()) return std::string(gguf_value_type_name(v.type)) + " " + std::to_string(*f);
        return gguf_value_type_name(v.type);
    }

    std::optional<uint32_t> to_u32(const GgufValue& v, const std::string& name) {
        auto x = v.as_uint();
        if (!x || *x > std::numeric_limits<uint32_t>::max()) {
            bad.push_back(name + " must be an unsigned 32-bit integer (found " + describe(v) + ")");
            return std::nullopt;
        }
        return (uint32_t)*x;
    }

    const GgufHeader& header_;
    std::string arch_;
};

// Layer index of a "blk.N.*" tensor name; nullopt for non-layer tensors.
std::optional<uint64_t> layer_of(const std::string& name) {
    if (name.rfind("blk.", 0) != 0) return std::nullopt;
    const char* begin = name.data() + 4;
    const char* end = name.data() + name.size();
    uint64_t n = 0;
    auto [ptr, ec] = std::from_chars(begin, end, n);
    if (ec != std::errc() || ptr == begin || ptr == end || *ptr != '.') return std::nullopt;
    return n;
}

// Which layers use the sliding window. llama.cpp's convention for a scalar pattern p:
// layer i is local unless it is the last of each group of p (p = 0: all local; 1: none).
std::vector<bool> local_layers(const GgufValue* pattern, uint32_t n_layer, const std::string& key,
                               std::vector<std::string>& bad) {
    std::vector<bool> local(n_layer, true);
    if (!pattern) return local;
    if (pattern->type == GgufValueType::ARRAY) {
        if (pattern->array.size() != n_layer) {
            bad.push_back(key + " has " + std::to_string(pattern->array.size()) + " entries but block_count is " +
                          std::to_string(n_layer));
            return local;
        }
        for (uint32_t i = 0; i < n_layer; ++i) {
            const GgufValue& e = pattern->array[i];
            if (e.type == GgufValueType::BOOL) local[i] = e.b;
            else if (auto x = e.as_uint(); x && *x <= 1) local[i] = *x == 1;
            else {
                bad.push_back(key + "[" + std::to_string(i) + "] must be a bool");
                return local;
            }
        }
        return local;
    }
    auto period = pattern->as_uint();
    if (!period || *period > n_layer + 1ull) {
        bad.push_back(key + " must be a layer period (unsigned integer <= block_count) or a per-layer bool array");
        return local;
    }
    for (uint32_t i = 0; i < n_layer; ++i) local[i] = *period == 0 || (i % *period) < *period - 1;
    return local;
}

struct ExpectedTensor {
    std::string name;
    std::vector<uint64_t> shape;
    bool required;
};

// Tensor shapes implied by the metadata (ggml order: contiguous dimension first).
std::vector<ExpectedTensor> expected_tensors(const ModelSpec& s, const std::vector<uint32_t>& n_ff_per_layer) {
    const uint64_t e = s.n_embd;
    std::vector<ExpectedTensor> out = {
        {"token_embd.weight", {e, s.n_vocab}, true},
        {"output_norm.weight", {e}, true},
        {"output.weight", {e, s.n_vocab}, false},
    };
    for (uint32_t il = 0; il < s.n_layer; ++il) {
        const LayerSpec& l = s.layers[il];
        const uint64_t q = (uint64_t)l.n_head * s.head_dim_k, k = (uint64_t)l.n_head_kv * s.head_dim_k,
                       v = (uint64_t)l.n_head_kv * s.head_dim_v, o = (uint64_t)l.n_head * s.head_dim_v,
                       ff = n_ff_per_layer[il];
        const std::string p = "blk." + std::to_string(il) + ".";
        out.push_back({p + "attn_norm.weight", {e}, true});
        out.push_back({p + "attn_q.weight", {e, q}, true});
        out.push_back({p + "attn_k.weight", {e, k}, true});
        out.push_back({p + "attn_v.weight", {e, v}, true});
        out.push_back({p + "attn_output.weight", {o, e}, true});
        out.push_back({p + "attn_q.bias", {q}, s.has_qkv_bias});
        out.push_back({p + "attn_k.bias", {k}, s.has_qkv_bias});
        out.push_back({p + "attn_v.bias", {v}, s.has_qkv_bias});
        out.push_back({p + "ffn_norm.weight", {e}, true});
        out.push_back({p + "ffn_gate.weight", {e, ff}, true});
        out.push_back({p + "ffn_up.weight", {e, ff}, true});
        out.push_back({p + "ffn_down.weight", {ff, e}, true});
    }
    return out;
}

void check_tensors(const GgufHeader& header, const ModelSpec& spec, const std::vector<uint32_t>& n_ff_per_layer,
                   std::vector<std::string>& bad) {
    std::vector<std::string> absent;
    for (const ExpectedTensor& t : expected_tensors(spec, n_ff_per_layer)) {
        const GgufTensorInfo* info = header.find_tensor(t.name);
        if (!info) {
            if (t.required) absent.push_back(t.name);
            continue;
        }
        if (info->shape != t.shape)
            bad.push_back("tensor " + t.name + " has shape " + shape_text(info->shape) + " but the metadata implies " +
                          shape_text(t.shape));
    }
    if (!absent.empty()) {
        const size_t shown = std::min<size_t>(absent.size(), 8);
        std::vector<std::string> list(absent.begin(), absent.begin() + shown);
        std::string more = absent.size() > shown ? " and " + std::to_string(absent.size() - shown) + " more" : "";
        bad.push_back("missing tensors: " + join(list, ", ") + more);
    }
    for (const GgufTensorInfo& t : header.tensors) {
        auto layer = layer_of(t.name);
        if (layer && *layer >= spec.n_layer)
            bad.push_back("tensor " + t.name + " belongs to layer " + std::to_string(*layer) + " but block_count is " +
                          std::to_string(spec.n_layer));
    }
}

void fill_weight_bytes(const GgufHeader& header, ModelSpec& spec) {
    for (const GgufTensorInfo& t : header.tensors) {
        spec.weight_bytes_total += t.n_bytes;
        spec.weight_bytes_by_type[t.type] += t.n_bytes;
        spec.tensor_count_by_type[t.type] += 1;
        auto layer = layer_of(t.name);
        if (layer && *layer < spec.layers.size()) spec.layers[*layer].weight_bytes += t.n_bytes;
        else spec.weight_bytes_non_layer += t.n_bytes;
        if (t.name == "token_embd.weight") spec.weight_bytes_token_embd = t.n_bytes;
    }
}

RopeSpec read_rope(MetadataReader& meta, Arch arch, uint32_t head_dim_k, uint32_t n_ctx_train) {
    RopeSpec rope;
    rope.type = arch == Arch::qwen2 ? RopeType::neox : RopeType::normal;
    if (auto base = meta.f32("rope.freq_base")) {
        if (*base <= 0) meta.bad.push_back(meta.key("rope.freq_base") + " must be positive");
        else rope.freq_base = *base;
    }
    rope.n_dims = meta.u32("rope.dimension_count", false).value_or(head_dim_k);
    if (rope.n_dims == 0 || rope.n_dims > head_dim_k || rope.n_dims % 2 != 0)
        meta.bad.push_back(meta.key("rope.dimension_count") + " = " + std::to_string(rope.n_dims) +
                           " must be even, non-zero and at most the key head dim " + std::to_string(head_dim_k));

    // As llama.cpp: a factor without a type means linear; rope.scale_linear is the older key.
    std::optional<float> factor = meta.f32("rope.scaling.factor");
    if (!factor) factor = meta.f32("rope.scale_linear");
    std::string type = meta.str("rope.scaling.type").value_or(factor && *factor != 1.0f ? "linear" : "none");
    if (type == "none") rope.scaling = RopeScaling::none;
    else if (type == "linear") rope.scaling = RopeScaling::linear;
    else if (type == "yarn") rope.scaling = RopeScaling::yarn;
    else meta.bad.push_back("unsupported " + meta.key("rope.scaling.type") + " '" + type + "' (supported: none, linear, yarn)");
    if (rope.scaling != RopeScaling::none) {
        rope.scaling_factor = factor.value_or(1.0f);
        if (rope.scaling_factor <= 0)
            meta.bad.push_back(meta.key("rope.scaling.factor") + " must be positive for " + type + " scaling");
    }
    rope.original_context = meta.u32("rope.scaling.original_context_length", false).value_or(n_ctx_train);
    if (auto x = meta.f32("rope.scaling.yarn_ext_factor")) rope.yarn_ext_factor = *x;
    if (auto x = meta.f32("rope.scaling.attn_factor")) rope.yarn_attn_factor = *x;
    if (auto x = meta.f32("rope.scaling.yarn_attn_factor")) rope.yarn_attn_factor = *x;
    if (auto x = meta.f32("rope.scaling.yarn_beta_fast")) rope.yarn_beta_fast = *x;
    if (auto x = meta.f32("rope.scaling.yarn_beta_slow")) rope.yarn_beta_slow = *x;
    if (auto x = meta.f32("rope.scaling.yarn_log_multiplier")) rope.yarn_log_multiplier = *x;
    return rope;
}

uint32_t vocab_size(const GgufHeader& header, std::vector<std::string>& missing, std::vector<std::string>& bad) {
    const GgufValue* tokens = header.find("tokenizer.ggml.tokens");
    const GgufTensorInfo* embd = header.find_tensor("token_embd.weight");
    std::optional<uint64_t> from_tokens, from_embd;
    if (tokens) {
        if (tokens->type != GgufValueType::ARRAY || tokens->array_type != GgufValueType::STRING)
            bad.push_back("tokenizer.ggml.tokens must be an array of strings");
        else from_tokens = tokens->array.size();
    }
    if (embd && embd->shape.size() == 2) from_embd = embd->shape[1];
    if (!from_tokens && !from_embd) {
        if (!tokens) missing.push_back("tokenizer.ggml.tokens (or a token_embd.weight tensor)");
        return 0;
    }
    if (from_tokens && from_embd && *from_tokens != *from_embd)
        bad.push_back("tokenizer.ggml.tokens has " + std::to_string(*from_tokens) +
                      " tokens but token_embd.weight has " + std::to_string(*from_embd) + " rows");
    const uint64_t n = from_embd ? *from_embd : *from_tokens;
    if (n == 0 || n > std::numeric_limits<uint32_t>::max()) {
        bad.push_back("vocabulary size " + std::to_string(n) + " is out of range");
        return 0;
    }
    return (uint32_t)n;
}

}  // namespace

ModelSpec model_spec_from_gguf(const GgufHeader& header) {
    const GgufValue* arch_value = header.find("general.architecture");
    if (!arch_value) fail("missing required key general.architecture (supported architectures: llama, qwen2)");
    if (arch_value->type != GgufValueType::STRING) fail("general.architecture must be a string");
    ModelSpec spec;
    if (arch_value->s == "llama") spec.arch = Arch::llama;
    else if (arch_value->s == "qwen2") spec.arch = Arch::qwen2;
    else fail("unsupported architecture '" + arch_value->s + "' (supported: llama, qwen2)");
    if (const GgufValue* name = header.find("general.name"); name && name->type == GgufValueType::STRING)
        spec.name = name->s;

    MetadataReader meta(header, arch_value->s);
    // Missing keys first, all at once: until they are there nothing else can be checked.
    auto n_layer = meta.u32("block_count", true);
    auto n_embd = meta.u32("embedding_length", true);
    auto n_ctx_train = meta.u32("context_length", true);
    auto norm_eps = meta.f32("attention.layer_norm_rms_epsilon");
    if (!meta.find("attention.layer_norm_rms_epsilon")) meta.missing.push_back(meta.key("attention.layer_norm_rms_epsilon"));
    if (n_layer && (*n_layer == 0 || *n_layer > kMaxLayers)) {
        meta.bad.push_back(meta.key("block_count") + " = " + std::to_string(*n_layer) + " is out of range (1.." +
                           std::to_string(kMaxLayers) + ")");
        n_layer.reset();
    }
    const uint32_t layers_known = n_layer.value_or(0);
    auto heads = meta.per_layer("attention.head_count", layers_known, true);
    auto heads_kv = meta.per_layer("attention.head_count_kv", layers_known, false);
    auto n_ff = meta.per_layer("feed_forward_length", layers_known, true);
    spec.n_vocab = vocab_size(header, meta.missing, meta.bad);
    if (!meta.missing.empty()) {
        std::string message = "missing required keys for " + arch_value->s + ": " + join(meta.missing, ", ");
        if (!meta.bad.empty()) message += "; also: " + join(meta.bad, "; ");
        fail(message);
    }
    if (!meta.bad.empty() || !heads || !n_ff) fail("invalid model metadata: " + join(meta.bad, "; "));

    spec.n_layer = layers_known;
    spec.n_embd = n_embd.value_or(0);
    spec.n_ctx_train = n_ctx_train.value_or(0);
    spec.n_head = (*heads)[0];
    spec.n_ff = *std::max_element(n_ff->begin(), n_ff->end());
    std::vector<std::string>& bad = meta.bad;
    if (spec.n_embd == 0) bad.push_back(meta.key("embedding_length") + " is 0");
    if (spec.n_ctx_train == 0) bad.push_back(meta.key("context_length") + " is 0");
    spec.norm_eps = norm_eps.value_or(0.0f);
    if (spec.norm_eps <= 0 || spec.norm_eps >= 1)
        bad.push_back(meta.key("attention.layer_norm_rms_epsilon") + " = " + std::to_string(spec.norm_eps) +
                      " is not in (0, 1)");

    if (!heads_kv) heads_kv = *heads;  // absent: no GQA
    // With scalar keys every layer is alike: check one and report without a layer number.
    auto is_array = [&](const char* suffix) {
        const GgufValue* v = meta.find(suffix);
        return v && v->type == GgufValueType::ARRAY;
    };
    const bool varies = is_array("attention.head_count") || is_array("attention.head_count_kv") ||
                        is_array("feed_forward_length");
    spec.layers.resize(spec.n_layer);
    for (uint32_t il = 0; il < spec.n_layer; ++il) {
        LayerSpec& l = spec.layers[il];
        l.n_head = (*heads)[il];
        l.n_head_kv = (*heads_kv)[il];
        if (il > 0 && !varies) continue;
        const std::string at = varies ? " in layer " + std::to_string(il) : "";
        if (l.n_head == 0) bad.push_back(meta.key("attention.head_count") + " is 0" + at);
        else if (l.n_head_kv == 0) bad.push_back(meta.key("attention.head_count_kv") + " is 0" + at);
        else if (l.n_head % l.n_head_kv != 0)
            bad.push_back(std::to_string(l.n_head) + " query heads are not a multiple of " + std::to_string(l.n_head_kv) +
                          " KV heads" + at);
        if ((*n_ff)[il] == 0) bad.push_back(meta.key("feed_forward_length") + " is 0" + at);
        if (bad.size() > 16) break;  // one line per layer would drown the message
    }
    // Head dims: explicit keys win; otherwise n_embd must split evenly into the query heads.
    auto key_length = meta.u32("attention.key_length", false);
    auto value_length = meta.u32("attention.value_length", false);
    if ((!key_length || !value_length) && spec.n_head != 0 && spec.n_embd % spec.n_head != 0)
        bad.push_back(meta.key("embedding_length") + " = " + std::to_string(spec.n_embd) +
                      " is not divisible by the " + std::to_string(spec.n_head) + " query heads");
    const uint32_t derived_head_dim = spec.n_head ? spec.n_embd / spec.n_head : 0;
    spec.head_dim_k = key_length.value_or(derived_head_dim);
    spec.head_dim_v = value_length.value_or(derived_head_dim);
    if (spec.head_dim_k == 0 || spec.head_dim_v == 0) bad.push_back("head dim is 0");
    if (!bad.empty()) fail("invalid model metadata: " + join(bad, "; "));

    spec.rope = read_rope(meta, spec.arch, spec.head_dim_k, spec.n_ctx_train);

    spec.swa_window = meta.u32("attention.sliding_window", false).value_or(0);
    if (spec.swa_window > 0) {
        const std::string pattern_key = meta.key("attention.sliding_window_pattern");
        std::vector<bool> local = local_layers(header.find(pattern_key), spec.n_layer, pattern_key, bad);
        for (uint32_t il = 0; il < spec.n_layer; ++il) spec.layers[il].is_local = local[il];
    }

    spec.tied_embeddings = header.find_tensor("output.weight") == nullptr;
    spec.has_qkv_bias = header.find_tensor("blk.0.attn_q.bias") != nullptr;
    // A metadata-only header (planning from a spec, tests) has no tensor table to check.
    if (!header.tensors.empty()) check_tensors(header, spec, *n_ff, bad);
    if (!bad.empty()) fail("invalid model: " + join(bad, "; "));

    fill_weight_bytes(header, spec);

    for (KvType t : {KvType::q8_0, KvType::q4_0}) {
        if (!kv_type_fits(spec, t)) {
            spec.notes.push_back("head dims " + std::to_string(spec.head_dim_k) + "/" + std::to_string(spec.head_dim_v) +
                                 " are not multiples of 32: the q8_0 and q4_0 KV tiers are unavailable");
            break;
        }
    }
    return spec;
}

bool kv_type_fits(const ModelSpec& spec, KvType type) {
    const uint32_t block = ggml_traits(kv_ggml_type(type)).block_size;
    // Per head, not per row: the kernels quantize each head's slice on its own.
    return spec.head_dim_k % block == 0 && spec.head_dim_v % block == 0;
}

uint64_t layer_kv_bytes_per_cell(const ModelSpec& spec, uint32_t layer, KvType k, KvType v) {
    if (layer >= spec.layers.size())
        fail("layer " + std::to_string(layer) + " out of range (model has " + std::to_string(spec.layers.size()) + ")");
    const uint64_t kv_heads = spec.layers[layer].n_head_kv;
    return kv_row_bytes(k, kv_heads * spec.head_dim_k) + kv_row_bytes(v, kv_heads * spec.head_dim_v);
}

uint64_t kv_bytes_per_cell(const ModelSpec& spec, KvType k, KvType v) {
    uint64_t total = 0;
    for (uint32_t il = 0; il < spec.layers.size(); ++il) total += layer_kv_bytes_per_cell(spec, il, k, v);
    return total;
}

uint64_t kv_cache_bytes(const ModelSpec& spec, uint64_t n_ctx, KvType k, KvType v) {
    uint64_t total = 0;
    for (uint32_t il = 0; il < spec.layers.size(); ++il) {
        const uint64_t cells = spec.layers[il].is_local ? std::min<uint64_t>(n_ctx, spec.swa_window) : n_ctx;
        total += cells * layer_kv_bytes_per_cell(spec, il, k, v);
    }
    return total;
}

}  // namespace spillway
