#include "model/presets.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string_view>

#include "common/error.h"

namespace spillway {
namespace {

struct PresetShape {
    const char* name;
    const char* arch;           // "qwen2" or "llama"
    const char* display_name;   // general.name
    uint32_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_base;
    float norm_eps;
    bool qkv_bias;
    bool tied_embeddings;
};

// Shapes as published in each model's config.json (Qwen2.5 0.5B/7B instruct, Qwen2.5-14B-
// Instruct-1M, Meta-Llama-3-8B-Instruct); the vocab is the padded embedding row count.
constexpr PresetShape kPresets[] = {
    {"tiny", "qwen2", "spillway tiny", 4, 256, 4, 2, 768, 768, 32768, 1000000.0f, 1e-6f, true, false},
    {"qwen2.5-0.5b", "qwen2", "Qwen2.5 0.5B Instruct (synthetic)", 24, 896, 14, 2, 4864, 151936, 32768, 1000000.0f,
     1e-6f, true, true},
    {"qwen2.5-7b", "qwen2", "Qwen2.5 7B Instruct (synthetic)", 28, 3584, 28, 4, 18944, 152064, 32768, 1000000.0f,
     1e-6f, true, false},
    {"qwen2.5-14b", "qwen2", "Qwen2.5 14B Instruct 1M (synthetic)", 48, 5120, 40, 8, 13824, 152064, 1010000,
     10000000.0f, 1e-5f, true, false},
    {"llama3-8b", "llama", "Meta Llama 3 8B Instruct (synthetic)", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f,
     1e-5f, false, false},
};

// ---- a small byte-level BPE vocabulary --------------------------------------------------

// Original text the merges are learned from: common English words and suffixes, so that
// ordinary prompts tokenize into a few tokens per word rather than one per byte.
constexpr std::string_view kMergeCorpus = R"(
A spillway is the part of a dam that lets water pass when the reservoir is full. When the
river rises after a long rain, the gates open and the water flows over the concrete lip and
down a steep channel into the river below. Engineers design the spillway so that the largest
flood they expect can pass without the water ever reaching the top of the dam itself.
The same idea guides how we run a large language model on a single graphics card. The model
keeps a cache of keys and values for every token it has already read, and that cache grows
with the length of the context. When it no longer fits in the memory of the card, we can
either store each value with fewer bits, or we can let the oldest part of the cache spill
into the memory of the host and stream it back over the bus for every new token.
Both choices have a cost. Fewer bits make the numbers less precise, which may change the
answers the model gives. Streaming from the host is exact, but it is slower, because the bus
moves data far more slowly than the memory on the card. The right choice depends on the
model, the length of the context, the card, and the machine it is plugged into.
So the program measures before it decides. It reads the shape of the model from the file,
counts how many bytes each token of context will take at each precision, asks the card how
much memory is free, and times how fast data moves from the host to the card. Then it walks
down a short ladder of formats, from the most precise to the most compact, and takes the
first one that fits, allowing a small spill when the measured slowdown stays under the
target that the user has set.
Here are some questions people often ask. How long can the context be? What happens when the
prompt is longer than that? Does the answer change when part of the cache is on the host?
Which format should I use for a model with eight heads of one hundred and twenty eight
dimensions? Why is the first token slower than the rest? The short answers are in the
documentation, and the long answers are in the tests, which compare every kernel with a
simple reference written for the processor.
Numbers matter too: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 32, 64, 128, 256, 512, 1024, 2048,
4096, 8192, 32768, 65536, 131072, 1000000. Temperatures were 21.5 degrees in the morning
and 30 in the afternoon; the train left at 09:45 and arrived at 13:20.
def main(): print("hello, world") # return 0 if everything is fine, else 1
for (int i = 0; i < n; ++i) { sum += x[i] * y[i]; } // the dot product of two vectors
The quick brown fox jumps over the lazy dog. She said that they would meet again next week,
near the old bridge by the mill, where the water is deep and calm and the children play.
We were walking through the garden, talking about nothing in particular, and thinking about
everything. They are working, reading, writing, learning, building, testing, and shipping.
It was the beginning of something new: a better, faster, simpler, and more reliable system.
)";

// GPT-2's reversible map from bytes to printable code points: printable Latin-1 bytes map to
// themselves, the rest to 256 + n in byte order. The first 256 token ids follow this list.
std::vector<uint32_t> byte_codepoints_in_token_order(std::vector<uint8_t>* bytes_out) {
    std::vector<uint8_t> bytes;
    for (int b = '!'; b <= '~'; ++b) bytes.push_back((uint8_t)b);
    for (int b = 0xA1; b <= 0xAC; ++b) bytes.push_back((uint8_t)b);
    for (int b = 0xAE; b <= 0xFF; ++b) bytes.push_back((uint8_t)b);
    std::vector<uint32_t> codepoints(bytes.begin(), bytes.end());
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
        if (std::find(bytes.begin(), bytes.end(), (uint8_t)b) != bytes.end()) continue;
        bytes.push_back((uint8_t)b);
        codepoints.push_back(next++);
    }
    if (bytes_out) *bytes_out = bytes;
    return codepoints;
}

std::string utf8(uint32_t cp) {
    std::string out;
    if (cp < 0x80) out += (char)cp;
    else if (cp < 0x800) {
        out += (char)(0xC0 | (cp >> 6));
        out += (char)(0x80 | (cp & 0x3F));
    } else {
        out += (char)(0xE0 | (cp >> 12));
        out += (char)(0x80 | ((cp >> 6) & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    }
    return out;
}

// Pieces as a GPT-2-style pre-tokenizer splits ASCII text: letters with one optional
// leading space, single digits (Qwen splits numbers digit by digit), punctuation runs with
// one optional leading space, and whitespace. Merges never cross these boundaries.
std::vector<std::string> pretokenize_ascii(std::string_view text) {
    std::vector<std::string> pieces;
    size_t i = 0;
    auto kind = [](char c) {
        if (std::isalpha((unsigned char)c)) return 0;
        if (std::isdigit((unsigned char)c)) return 1;
        if (std::isspace((unsigned char)c)) return 2;
        return 3;
    };
    while (i < text.size()) {
        size_t start = i;
        if (text[i] == ' ' && i + 1 < text.size() && (kind(text[i + 1]) == 0 || kind(text[i + 1]) == 3)) ++i;
        const int k = kind(text[i]);
        if (k == 1) ++i;
        else
            while (i < text.size() && kind(text[i]) == k) ++i;
        pieces.emplace_back(text.substr(start, i - start));
    }
    return pieces;
}

struct ByteBpe {
    std::vector<std::string> base_tokens;  // 256, in GPT-2 token order
    std::vector<std::string> merges;       // "left right", in rank order
    std::vector<std::string> merged_tokens;
};

// Learns `n_merges` merges: repeatedly join the most frequent adjacent pair of symbols,
// ties broken by the pair's text, so the result depends on nothing but the corpus.
ByteBpe train_byte_bpe(size_t n_merges) {
    ByteBpe bpe;
    std::vector<uint8_t> bytes;
    const std::vector<uint32_t> codepoints = byte_codepoints_in_token_order(&bytes);
    std::string symbol_of_byte[256];
    for (size_t i = 0; i < 256; ++i) {
        bpe.base_tokens.push_back(utf8(codepoints[i]));
        symbol_of_byte[bytes[i]] = bpe.base_tokens.back();
    }
    std::map<std::string, uint64_t> piece_counts;
    for (const std::string& piece : pretokenize_ascii(kMergeCorpus)) ++piece_counts[piece];
    std::vector<std::pair<std::vector<std::string>, uint64_t>> words;
    for (const auto& [piece, count] : piece_counts) {
        std::vector<std::string> symbols;
        for (char c : piece) symbols.push_back(symbol_of_byte[(uint8_t)c]);
        words.emplace_back(std::move(symbols), count);
    }
    while (bpe.merges.size() < n_merges) {
        std::map<std::pair<std::string, std::string>, uint64_t> pair_counts;
        for (const auto& [symbols, count] : words)
            for (size_t i = 0; i + 1 < symbols.size(); ++i) pair_counts[{symbols[i], symbols[i + 1]}] += count;
        if (pair_counts.empty()) break;
        auto best = pair_counts.begin();
        for (auto it = pair_counts.begin(); it != pair_counts.end(); ++it)
            if (it->second > best->second) best = it;  // map order breaks ties
        const auto [left, right] = best->first;
        bpe.merges.push_back(left + " " + right);
        bpe.merged_tokens.push_back(left + right);
        for (auto& [symbols, count] : words) {
            std::vector<std::string> joined;
            for (size_t i = 0; i < symbols.size(); ++i) {
                if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
                    joined.push_back(left + right);
                    ++i;
                } else {
                    joined.push_back(symbols[i]);
                }
            }
            symbols = std::move(joined);
        }
    }
    return bpe;
}

// 256 bytes + 509 merges + 3 specials = 768 tokens: the tiny preset's whole vocabulary.
constexpr size_t kMerges = 509;

const ByteBpe& preset_bpe() {
    static const ByteBpe bpe = train_byte_bpe(kMerges);
    return bpe;
}

constexpr int32_t kTypeNormal = 1, kTypeControl = 3, kTypeUnused = 5;

struct SpecialToken {
    uint32_t id;
    std::string text;
};

// Where the named control tokens sit: at the real models' ids, so that prompts, stop
// tokens and the chat template behave as they would with the real vocabulary.
struct TokenizerPlan {
    std::string pre;
    std::vector<SpecialToken> specials;
    uint32_t bos, eos, pad;
    bool add_bos;
    std::string chat_template;
    // Ids in [control_begin, control_end) that are not named are reserved control tokens.
    uint32_t control_begin = 0, control_end = 0;
};

constexpr const char* kChatmlTemplate =
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

constexpr const char* kLlama3Template =
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

TokenizerPlan tokenizer_plan(const PresetShape& p, uint32_t first_free_id) {
    TokenizerPlan plan;
    if (std::string_view(p.arch) == "llama") {
        // Llama 3: 128000.. are 256 control tokens, most of them reserved.
        const uint32_t base = p.n_vocab - 256;
        plan.pre = "llama-bpe";
        plan.specials = {{base + 0, "<|begin_of_text|>"}, {base + 1, "<|end_of_text|>"},
                         {base + 6, "<|start_header_id|>"}, {base + 7, "<|end_header_id|>"},
                         {base + 9, "<|eot_id|>"}};
        plan.bos = base + 0;
        plan.eos = base + 9;
        plan.pad = base + 1;
        plan.add_bos = true;
        plan.chat_template = kLlama3Template;
        plan.control_begin = base;
        plan.control_end = p.n_vocab;
        return plan;
    }
    // Qwen2: <|endoftext|> = 151643 in the real vocab; the tiny preset packs it after the merges.
    const uint32_t base = p.n_vocab >= 151643 + 3 ? 151643 : first_free_id;
    plan.pre = "qwen2";
    plan.specials = {{base, "<|endoftext|>"}, {base + 1, "<|im_start|>"}, {base + 2, "<|im_end|>"}};
    plan.bos = base;
    plan.eos = base + 2;
    plan.pad = base;
    plan.add_bos = false;
    plan.chat_template = kChatmlTemplate;
    return plan;
}

void add_tokenizer(GgufHeader& h, const PresetShape& p) {
    const ByteBpe& bpe = preset_bpe();
    const uint32_t n_learned = (uint32_t)(bpe.base_tokens.size() + bpe.merged_tokens.size());
    const TokenizerPlan plan = tokenizer_plan(p, n_learned);
    if (plan.specials.back().id >= p.n_vocab || n_learned > plan.specials.front().id)
        fail(std::string("preset ") + p.name + ": vocabulary of " + std::to_string(p.n_vocab) + " is too small");

    std::vector<GgufValue> tokens, types;
    tokens.reserve(p.n_vocab);
    types.reserve(p.n_vocab);
    for (const std::string& t : bpe.base_tokens) tokens.push_back(GgufValue::make_string(t));
    for (const std::string& t : bpe.merged_tokens) tokens.push_back(GgufValue::make_string(t));
    types.assign(tokens.size(), GgufValue::make_i32(kTypeNormal));
    size_t next_special = 0;
    uint32_t reserved = 0;
    for (uint32_t id = n_learned; id < p.n_vocab; ++id) {
        if (next_special < plan.specials.size() && plan.specials[next_special].id == id) {
            tokens.push_back(GgufValue::make_string(plan.specials[next_special++].text));
            types.push_back(GgufValue::make_i32(kTypeControl));
        } else if (id >= plan.control_begin && id < plan.control_end) {
            tokens.push_back(GgufValue::make_string("<|reserved_special_token_" + std::to_string(reserved++) + "|>"));
            types.push_back(GgufValue::make_i32(kTypeControl));
        } else {
            // Padding up to the real model's embedding rows, as llama.cpp's converter names it.
            tokens.push_back(GgufValue::make_string("[PAD" + std::to_string(id) + "]"));
            types.push_back(GgufValue::make_i32(kTypeUnused));
        }
    }
    std::vector<GgufValue> merges;
    for (const std::string& m : bpe.merges) merges.push_back(GgufValue::make_string(m));

    h.set("tokenizer.ggml.model", GgufValue::make_string("gpt2"));
    h.set("tokenizer.ggml.pre", GgufValue::make_string(plan.pre));
    h.set("tokenizer.ggml.tokens", GgufValue::make_array(GgufValueType::STRING, std::move(tokens)));
    h.set("tokenizer.ggml.token_type", GgufValue::make_array(GgufValueType::INT32, std::move(types)));
    h.set("tokenizer.ggml.merges", GgufValue::make_array(GgufValueType::STRING, std::move(merges)));
    h.set("tokenizer.ggml.bos_token_id", GgufValue::make_u32(plan.bos));
    h.set("tokenizer.ggml.eos_token_id", GgufValue::make_u32(plan.eos));
    h.set("tokenizer.ggml.padding_token_id", GgufValue::make_u32(plan.pad));
    h.set("tokenizer.ggml.add_bos_token", GgufValue::make_bool(plan.add_bos));
    h.set("tokenizer.chat_template", GgufValue::make_string(plan.chat_template));
}

// ---- tensor table ---------------------------------------------------------------------

// llama.cpp's general.file_type numbering (LLAMA_FTYPE_*).
uint32_t file_type_of(GgmlType wtype) {
    switch (wtype) {
        case GgmlType::F32: return 0;
        case GgmlType::F16: return 1;
        case GgmlType::Q8_0: return 7;
        case GgmlType::BF16: return 32;
        default: return 0;
    }
}

void add_tensor(GgufHeader& h, std::string name, std::vector<uint64_t> shape, GgmlType type) {
    GgufTensorInfo t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.type = type;
    t.n_elements = 1;
    for (uint64_t d : t.shape) t.n_elements *= d;
    auto bytes = ggml_row_bytes(type, t.n_elements);
    if (!bytes) fail("preset tensor " + t.name + " does not split into " + ggml_type_name(type) + " blocks");
    t.n_bytes = *bytes;
    h.tensors.push_back(std::move(t));
}

// In llama.cpp's order: embeddings, then each block, then the final norm and head.
// Matrices get the weight type; 1-D tensors (norms, biases) stay f32 as converters keep them.
void add_tensors(GgufHeader& h, const PresetShape& p, GgmlType w) {
    const GgmlType f = GgmlType::F32;
    const uint64_t e = p.n_embd, head_dim = p.n_embd / p.n_head;
    const uint64_t q = p.n_head * head_dim, kv = p.n_head_kv * head_dim;
    add_tensor(h, "token_embd.weight", {e, p.n_vocab}, w);
    for (uint32_t il = 0; il < p.n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        add_tensor(h, b + "attn_norm.weight", {e}, f);
        add_tensor(h, b + "attn_q.weight", {e, q}, w);
        add_tensor(h, b + "attn_k.weight", {e, kv}, w);
        add_tensor(h, b + "attn_v.weight", {e, kv}, w);
        if (p.qkv_bias) {
            add_tensor(h, b + "attn_q.bias", {q}, f);
            add_tensor(h, b + "attn_k.bias", {kv}, f);
            add_tensor(h, b + "attn_v.bias", {kv}, f);
        }
        add_tensor(h, b + "attn_output.weight", {q, e}, w);
        add_tensor(h, b + "ffn_norm.weight", {e}, f);
        add_tensor(h, b + "ffn_gate.weight", {e, p.n_ff}, w);
        add_tensor(h, b + "ffn_up.weight", {e, p.n_ff}, w);
        add_tensor(h, b + "ffn_down.weight", {p.n_ff, e}, w);
    }
    add_tensor(h, "output_norm.weight", {e}, f);
    if (!p.tied_embeddings) add_tensor(h, "output.weight", {e, p.n_vocab}, w);
}

const PresetShape& find_preset(const std::string& name) {
    for (const PresetShape& p : kPresets)
        if (name == p.name) return p;
    std::string known;
    for (const PresetShape& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
    fail("unknown preset '" + name + "' (presets: " + known + ")");
}

}  // namespace

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const PresetShape& p : kPresets) names.push_back(p.name);
    return names;
}

GgufHeader preset_header(const std::string& name, GgmlType wtype) {
    const PresetShape& p = find_preset(name);
    if (wtype != GgmlType::F32 && wtype != GgmlType::F16 && wtype != GgmlType::BF16 && wtype != GgmlType::Q8_0)
        fail(std::string("unsupported weight type '") + ggml_type_name(wtype) + "' for a preset (use f32, f16, bf16 or q8_0)");
    GgufHeader h;
    const std::string a = p.arch;
    h.set("general.architecture", GgufValue::make_string(a));
    h.set("general.name", GgufValue::make_string(p.display_name));
    h.set("general.file_type", GgufValue::make_u32(file_type_of(wtype)));
    h.set(a + ".block_count", GgufValue::make_u32(p.n_layer));
    h.set(a + ".context_length", GgufValue::make_u32(p.n_ctx));
    h.set(a + ".embedding_length", GgufValue::make_u32(p.n_embd));
    h.set(a + ".feed_forward_length", GgufValue::make_u32(p.n_ff));
    h.set(a + ".attention.head_count", GgufValue::make_u32(p.n_head));
    h.set(a + ".attention.head_count_kv", GgufValue::make_u32(p.n_head_kv));
    h.set(a + ".rope.freq_base", GgufValue::make_f32(p.rope_base));
    h.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::make_f32(p.norm_eps));
    if (a == "llama") {
        // llama.cpp's converter writes these two for llama files.
        h.set(a + ".rope.dimension_count", GgufValue::make_u32(p.n_embd / p.n_head));
        h.set(a + ".vocab_size", GgufValue::make_u32(p.n_vocab));
    }
    add_tokenizer(h, p);
    add_tensors(h, p, wtype);
    return h;
}

}  // namespace spillway
