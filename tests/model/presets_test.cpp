#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "common/error.h"
#include "gguf/gguf.h"
#include "model/model_spec.h"
#include "model/presets.h"
#include "tokenizer/tokenizer.h"

using namespace spillway;

namespace {

struct Expected {
    const char* name;
    Arch arch;
    uint32_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_base;
    bool bias, tied;
    double params;  // published parameter count (tiny: ours)
};

// Published shapes (config.json) and parameter counts of the real models.
const Expected kExpected[] = {
    {"qwen2.5-0.5b", Arch::qwen2, 24, 896, 14, 2, 4864, 151936, 32768, 1e6f, true, true, 0.494e9},
    {"qwen2.5-7b", Arch::qwen2, 28, 3584, 28, 4, 18944, 152064, 32768, 1e6f, true, false, 7.62e9},
    {"qwen2.5-14b", Arch::qwen2, 48, 5120, 40, 8, 13824, 152064, 1010000, 1e7f, true, false, 14.77e9},
    {"llama3-8b", Arch::llama, 32, 4096, 32, 8, 14336, 128256, 8192, 5e5f, false, false, 8.03e9},
};

const std::string& string_at(const GgufHeader& h, const char* key, size_t i) { return h.find(key)->array.at(i).s; }

}  // namespace

TEST(Presets, NamesAreTheFiveFromTheIssue) {
    EXPECT_EQ(preset_names(), (std::vector<std::string>{"tiny", "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-14b", "llama3-8b"}));
}

TEST(Presets, RealShapesMatchPublishedConfigs) {
    for (const Expected& x : kExpected) {
        SCOPED_TRACE(x.name);
        GgufHeader h = preset_header(x.name, GgmlType::F32);
        ModelSpec s = model_spec_from_gguf(h);
        EXPECT_EQ(s.arch, x.arch);
        EXPECT_EQ(s.n_layer, x.n_layer);
        EXPECT_EQ(s.n_embd, x.n_embd);
        EXPECT_EQ(s.n_head, x.n_head);
        EXPECT_EQ(s.layers[0].n_head_kv, x.n_head_kv);
        EXPECT_EQ(s.n_ff, x.n_ff);
        EXPECT_EQ(s.n_vocab, x.n_vocab);
        EXPECT_EQ(s.n_ctx_train, x.n_ctx);
        EXPECT_EQ(s.rope.freq_base, x.rope_base);
        EXPECT_EQ(s.has_qkv_bias, x.bias);
        EXPECT_EQ(s.tied_embeddings, x.tied);
        EXPECT_EQ(s.head_dim_k, x.arch == Arch::qwen2 && x.n_embd == 896 ? 64u : 128u);
        EXPECT_EQ(s.rope.type, x.arch == Arch::qwen2 ? RopeType::neox : RopeType::normal);
        // f32 weights: 4 bytes per parameter, within 1% of the published count.
        EXPECT_NEAR(s.weight_bytes_total / 4.0 / x.params, 1.0, 0.01) << s.weight_bytes_total / 4.0;
        EXPECT_TRUE(s.notes.empty());
    }
}

TEST(Presets, Qwen14bQ8_0IsTheDesignDocsSize) {
    ModelSpec s = model_spec_from_gguf(preset_header("qwen2.5-14b", GgmlType::Q8_0));
    EXPECT_NEAR(s.weight_bytes_total / 1e9, 15.7, 0.05);
    EXPECT_EQ(kv_bytes_per_cell(s, KvType::f16, KvType::f16), 192u * 1024);
}

TEST(Presets, TinyIsAFewMillionParametersWithGqaAndBias) {
    GgufHeader h = preset_header("tiny", GgmlType::F32);
    ModelSpec s = model_spec_from_gguf(h);
    EXPECT_EQ(s.arch, Arch::qwen2);
    EXPECT_TRUE(s.has_qkv_bias);
    EXPECT_EQ(s.n_head, 4u);
    EXPECT_EQ(s.layers[0].n_head_kv, 2u);
    EXPECT_EQ(s.head_dim_k, 64u);
    EXPECT_EQ(s.n_vocab, 768u);
    const double params = s.weight_bytes_total / 4.0;
    EXPECT_GT(params, 1e6);
    EXPECT_LT(params, 10e6);
}

TEST(Presets, WeightTypesApplyToMatricesOnly) {
    for (GgmlType w : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
        GgufHeader h = preset_header("tiny", w);
        for (const GgufTensorInfo& t : h.tensors) {
            EXPECT_EQ(t.type, t.shape.size() == 2 ? w : GgmlType::F32) << t.name;
            EXPECT_EQ(t.n_bytes, *ggml_row_bytes(t.type, t.n_elements)) << t.name;
        }
        EXPECT_EQ(h.find("general.file_type")->as_uint(),
                  w == GgmlType::F16 ? 1u : w == GgmlType::BF16 ? 32u : 7u);
    }
}

TEST(Presets, UnknownNameOrTypeIsAClearError) {
    try {
        preset_header("qwen3-4b", GgmlType::F16);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("unknown preset 'qwen3-4b'"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("llama3-8b"), std::string::npos) << e.what();
    }
    EXPECT_THROW(preset_header("tiny", GgmlType::Q4_K), Error);
}

// The vocabulary: 256 byte tokens in GPT-2's order, learned merges whose results are
// tokens, control tokens at the real models' ids, and unused padding up to n_vocab.
TEST(PresetTokenizer, ByteTokensMergesAndSpecials) {
    GgufHeader h = preset_header("tiny", GgmlType::F32);
    EXPECT_EQ(h.find("tokenizer.ggml.model")->s, "gpt2");
    EXPECT_EQ(h.find("tokenizer.ggml.pre")->s, "qwen2");
    const auto& tokens = h.find("tokenizer.ggml.tokens")->array;
    const auto& types = h.find("tokenizer.ggml.token_type")->array;
    const auto& merges = h.find("tokenizer.ggml.merges")->array;
    ASSERT_EQ(tokens.size(), 768u);
    ASSERT_EQ(types.size(), 768u);
    EXPECT_EQ(merges.size(), 509u);
    EXPECT_EQ(tokens[0].s, "!");
    EXPECT_EQ(tokens[93].s, "~");
    EXPECT_EQ(tokens[188 + ' '].s, "\xC4\xA0");  // space is the 33rd non-printable byte: U+0120 'Ġ'
    std::set<std::string> seen;
    for (const GgufValue& t : tokens) EXPECT_TRUE(seen.insert(t.s).second) << "duplicate token " << t.s;
    std::set<std::string> so_far;
    for (size_t i = 0; i < 256; ++i) so_far.insert(tokens[i].s);
    for (size_t r = 0; r < merges.size(); ++r) {
        const std::string& m = merges[r].s;
        size_t space = m.find(' ');
        ASSERT_NE(space, std::string::npos);
        std::string left = m.substr(0, space), right = m.substr(space + 1);
        EXPECT_TRUE(so_far.count(left) && so_far.count(right)) << "merge " << r << " uses a later token: " << m;
        EXPECT_EQ(tokens[256 + r].s, left + right);
        so_far.insert(left + right);
    }
    EXPECT_EQ(tokens[765].s, "<|endoftext|>");
    EXPECT_EQ(tokens[766].s, "<|im_start|>");
    EXPECT_EQ(tokens[767].s, "<|im_end|>");
    EXPECT_EQ(types[766].i, 3);
    EXPECT_EQ(types[100].i, 1);
    EXPECT_EQ(h.find("tokenizer.ggml.eos_token_id")->as_uint(), 767u);
    EXPECT_EQ(h.find("tokenizer.ggml.bos_token_id")->as_uint(), 765u);
    EXPECT_EQ(h.find("tokenizer.ggml.padding_token_id")->as_uint(), 765u);
    EXPECT_NE(h.find("tokenizer.chat_template")->s.find("<|im_start|>"), std::string::npos);
}

TEST(PresetTokenizer, RealVocabSpecialIdsAndPadding) {
    GgufHeader q = preset_header("qwen2.5-7b", GgmlType::Q8_0);
    EXPECT_EQ(string_at(q, "tokenizer.ggml.tokens", 151643), "<|endoftext|>");
    EXPECT_EQ(string_at(q, "tokenizer.ggml.tokens", 151645), "<|im_end|>");
    EXPECT_EQ(string_at(q, "tokenizer.ggml.tokens", 152063), "[PAD152063]");
    EXPECT_EQ(q.find("tokenizer.ggml.token_type")->array[152063].i, 5);
    EXPECT_EQ(q.find("tokenizer.ggml.token_type")->array[1000].i, 5);
    EXPECT_EQ(q.find("tokenizer.ggml.eos_token_id")->as_uint(), 151645u);

    GgufHeader l = preset_header("llama3-8b", GgmlType::Q8_0);
    EXPECT_EQ(l.find("tokenizer.ggml.pre")->s, "llama-bpe");
    EXPECT_EQ(string_at(l, "tokenizer.ggml.tokens", 128000), "<|begin_of_text|>");
    EXPECT_EQ(string_at(l, "tokenizer.ggml.tokens", 128006), "<|start_header_id|>");
    EXPECT_EQ(string_at(l, "tokenizer.ggml.tokens", 128009), "<|eot_id|>");
    EXPECT_EQ(string_at(l, "tokenizer.ggml.tokens", 128255).rfind("<|reserved_special_token_", 0), 0u);
    EXPECT_EQ(l.find("tokenizer.ggml.token_type")->array[128255].i, 3);
    EXPECT_EQ(l.find("tokenizer.ggml.bos_token_id")->as_uint(), 128000u);
    EXPECT_EQ(l.find("tokenizer.ggml.eos_token_id")->as_uint(), 128009u);
    EXPECT_TRUE(l.find("tokenizer.ggml.add_bos_token")->b);
    EXPECT_NE(l.find("tokenizer.chat_template")->s.find("<|start_header_id|>"), std::string::npos);
}

// The project's tokenizer loads the preset vocabulary, and the learned merges compress
// ordinary English well below one token per byte while round-tripping exactly.
TEST(PresetTokenizer, LoadsAndCompressesEnglish) {
    for (const char* name : {"tiny", "llama3-8b"}) {
        SCOPED_TRACE(name);
        Tokenizer tok(preset_header(name, GgmlType::F32));
        const std::string text = "The model reads the context and the cache spills to the host when the memory is full.";
        std::vector<int32_t> ids = tok.encode(text, {.add_special = false});
        EXPECT_LT(ids.size(), text.size() / 2) << ids.size();
        EXPECT_EQ(tok.decode(ids), text);
        std::vector<int32_t> chat = tok.encode("<|im_start|>user\nhi<|im_end|>", {.add_special = false, .parse_special = true});
        if (std::string(name) == "tiny") EXPECT_EQ(chat.front(), 766);
    }
}
