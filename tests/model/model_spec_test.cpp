#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "model/model_spec.h"
#include "model_test_util.h"

using namespace spillway;
using namespace spillway::test;

namespace {

Shape qwen14b_shape() {
    Shape s;
    s.arch = "qwen2";
    s.n_layer = 48;
    s.n_embd = 5120;
    s.n_head = 40;
    s.n_head_kv = 8;
    s.n_ff = 13824;
    s.n_vocab = 152064;
    s.n_ctx = 1010000;
    s.rope_base = 10000000.0f;
    s.qkv_bias = true;
    s.wtype = GgmlType::Q8_0;
    return s;
}

// The error message of model_spec_from_gguf, or "" when it succeeds.
std::string spec_error(const GgufHeader& h) {
    try {
        model_spec_from_gguf(h);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

}  // namespace

TEST(ModelSpec, Qwen25_14B_1M_Shape) {
    ModelSpec spec = model_spec_from_gguf(make_header(qwen14b_shape()));
    EXPECT_EQ(spec.arch, Arch::qwen2);
    EXPECT_STREQ(arch_name(spec.arch), "qwen2");
    EXPECT_EQ(spec.name, "test model");
    EXPECT_EQ(spec.n_layer, 48u);
    EXPECT_EQ(spec.n_embd, 5120u);
    EXPECT_EQ(spec.n_head, 40u);
    EXPECT_EQ(spec.n_ff, 13824u);
    EXPECT_EQ(spec.n_vocab, 152064u);
    EXPECT_EQ(spec.n_ctx_train, 1010000u);
    EXPECT_EQ(spec.head_dim_k, 128u);
    EXPECT_EQ(spec.head_dim_v, 128u);
    EXPECT_FLOAT_EQ(spec.norm_eps, 1e-6f);
    EXPECT_EQ(spec.rope.type, RopeType::neox);
    EXPECT_EQ(spec.rope.freq_base, 10000000.0f);
    EXPECT_EQ(spec.rope.n_dims, 128u);
    EXPECT_EQ(spec.rope.scaling, RopeScaling::none);
    EXPECT_EQ(spec.swa_window, 0u);
    EXPECT_FALSE(spec.tied_embeddings);
    EXPECT_TRUE(spec.has_qkv_bias);
    ASSERT_EQ(spec.layers.size(), 48u);
    for (const LayerSpec& l : spec.layers) {
        EXPECT_EQ(l.n_head, 40u);
        EXPECT_EQ(l.n_head_kv, 8u);
        EXPECT_FALSE(l.is_local);
    }
    EXPECT_TRUE(spec.notes.empty());
}

// 48 layers x (K + V) x 8 heads x 128 dims: f16 2 B each = 192 KiB; q8_0 34 B and q4_0 18 B per 32.
TEST(ModelSpec, Qwen25_14B_KvBytesPerCellByHand) {
    ModelSpec spec = model_spec_from_gguf(make_header(qwen14b_shape()));
    EXPECT_EQ(kv_bytes_per_cell(spec, KvType::f16, KvType::f16), 192u * 1024u);
    EXPECT_EQ(kv_bytes_per_cell(spec, KvType::q8_0, KvType::q8_0), 48u * 2 * 8 * 128 / 32 * 34);  // 104448
    EXPECT_EQ(kv_bytes_per_cell(spec, KvType::q4_0, KvType::q4_0), 48u * 2 * 8 * 128 / 32 * 18);  // 55296
    // Mixed K/V: one of each per layer.
    EXPECT_EQ(kv_bytes_per_cell(spec, KvType::q8_0, KvType::q4_0), 48u * (8 * 128 / 32) * (34 + 18));
    EXPECT_EQ(kv_bytes_per_cell(spec, KvType::f16, KvType::q8_0), 48u * (8 * 128 * 2 + 8 * 128 / 32 * 34));
    EXPECT_EQ(layer_kv_bytes_per_cell(spec, 47, KvType::f16, KvType::f16), 4096u);
    // DESIGN.md's roofline example: f16 KV at 64k context is 12.9 GB.
    EXPECT_EQ(kv_cache_bytes(spec, 65536, KvType::f16, KvType::f16), 65536ull * 196608);
    EXPECT_NEAR(kv_cache_bytes(spec, 65536, KvType::f16, KvType::f16) / 1e9, 12.9, 0.05);
    EXPECT_EQ(kv_cache_bytes(spec, 1010000, KvType::q8_0, KvType::q8_0), 1010000ull * 104448);
    EXPECT_EQ(kv_cache_bytes(spec, 0, KvType::f16, KvType::f16), 0u);
    EXPECT_THROW(layer_kv_bytes_per_cell(spec, 48, KvType::f16, KvType::f16), Error);
}

// Q8_0 matrices (34 B per 32 values), f32 norms and biases.
TEST(ModelSpec, Qwen25_14B_WeightBytesByHand) {
    ModelSpec spec = model_spec_from_gguf(make_header(qwen14b_shape()));
    const uint64_t matrix_values = 2ull * 5120 * 5120 + 2ull * 5120 * 1024 + 3ull * 5120 * 13824;  // 275,251,200
    const uint64_t f32_values = 2 * 5120 + 5120 + 2 * 1024;                                       // norms + biases
    const uint64_t per_layer = matrix_values / 32 * 34 + f32_values * 4;
    EXPECT_EQ(per_layer, 292524032u);
    const uint64_t non_layer = 2 * (5120ull * 152064 / 32 * 34) + 5120 * 4;
    EXPECT_EQ(non_layer, 1654476800u);
    for (const LayerSpec& l : spec.layers) EXPECT_EQ(l.weight_bytes, per_layer);
    EXPECT_EQ(spec.weight_bytes_non_layer, non_layer);
    EXPECT_EQ(spec.weight_bytes_total, 48 * per_layer + non_layer);
    EXPECT_NEAR(spec.weight_bytes_total / 1e9, 15.7, 0.05);  // DESIGN.md: Q8_0 weights 15.7 GB
    EXPECT_EQ(spec.weight_bytes_by_type.at(GgmlType::F32), 48 * f32_values * 4 + 5120 * 4);
    EXPECT_EQ(spec.weight_bytes_by_type.at(GgmlType::Q8_0), spec.weight_bytes_total - 48 * f32_values * 4 - 5120 * 4);
    EXPECT_EQ(spec.tensor_count_by_type.at(GgmlType::Q8_0), 48u * 7 + 2);
    EXPECT_EQ(spec.tensor_count_by_type.at(GgmlType::F32), 48u * 5 + 1);
}

TEST(ModelSpec, LlamaUsesNormalRopeAndTiedEmbeddingsAreDetected) {
    Shape s;
    s.arch = "llama";
    s.qkv_bias = false;
    s.tied = true;
    s.with_tokens = true;
    ModelSpec spec = model_spec_from_gguf(make_header(s));
    EXPECT_EQ(spec.arch, Arch::llama);
    EXPECT_EQ(spec.rope.type, RopeType::normal);
    EXPECT_TRUE(spec.tied_embeddings);
    EXPECT_FALSE(spec.has_qkv_bias);
    EXPECT_EQ(spec.n_vocab, 1000u);
    EXPECT_EQ(spec.head_dim_k, 64u);
}

TEST(ModelSpec, VocabFromTokensWithoutTensorTable) {
    Shape s;
    s.with_tensors = false;
    s.with_tokens = true;
    s.n_vocab = 777;
    ModelSpec spec = model_spec_from_gguf(make_header(s));
    EXPECT_EQ(spec.n_vocab, 777u);
    EXPECT_EQ(spec.weight_bytes_total, 0u);
    EXPECT_TRUE(spec.tied_embeddings);  // no output.weight in an empty table
}

TEST(ModelSpec, HeadCountKvPerLayerArrayAndExplicitHeadDims) {
    Shape s;
    s.with_tensors = false;
    s.with_tokens = true;
    GgufHeader h = make_header(s);
    h.set("qwen2.attention.head_count_kv", u32_array({2, 4, 1, 2}));
    h.set("qwen2.attention.key_length", GgufValue::make_u32(96));
    h.set("qwen2.attention.value_length", GgufValue::make_u32(32));
    ModelSpec spec = model_spec_from_gguf(h);
    EXPECT_EQ(spec.layers[1].n_head_kv, 4u);
    EXPECT_EQ(spec.layers[2].n_head_kv, 1u);
    EXPECT_EQ(spec.head_dim_k, 96u);
    EXPECT_EQ(spec.head_dim_v, 32u);
    // Per cell: sum over layers of kv_heads * (96 + 32) * 2 bytes.
    EXPECT_EQ(kv_bytes_per_cell(spec, KvType::f16, KvType::f16), (2 + 4 + 1 + 2) * (96 + 32) * 2u);
    EXPECT_EQ(layer_kv_bytes_per_cell(spec, 1, KvType::q4_0, KvType::q8_0), 4u * 96 / 32 * 18 + 4 * 32 / 32 * 34);
}

// Sliding window 4096 with llama.cpp's period-2 pattern: even layers local, odd layers global.
TEST(ModelSpec, SlidingWindowPatternLimitsLocalLayers) {
    Shape s;
    s.n_layer = 8;
    GgufHeader h = make_header(s);
    h.set("qwen2.attention.sliding_window", GgufValue::make_u32(4096));
    h.set("qwen2.attention.sliding_window_pattern", GgufValue::make_u32(2));
    ModelSpec spec = model_spec_from_gguf(h);
    EXPECT_EQ(spec.swa_window, 4096u);
    for (uint32_t il = 0; il < 8; ++il) EXPECT_EQ(spec.layers[il].is_local, il % 2 == 0) << il;
    const uint64_t cell = 2 * (2 * 64 * 2);  // per layer: K + V, 2 heads x 64 dims, f16
    EXPECT_EQ(kv_bytes_per_cell(spec, KvType::f16, KvType::f16), 8 * cell);
    EXPECT_EQ(kv_cache_bytes(spec, 32768, KvType::f16, KvType::f16), 4 * 32768 * cell + 4 * 4096 * cell);
    EXPECT_EQ(kv_cache_bytes(spec, 1000, KvType::f16, KvType::f16), 8 * 1000 * cell);  // below the window

    // A per-layer bool array says the same thing explicitly.
    std::vector<GgufValue> flags;
    for (int il = 0; il < 8; ++il) flags.push_back(GgufValue::make_bool(il < 6));
    h.set("qwen2.attention.sliding_window_pattern", GgufValue::make_array(GgufValueType::BOOL, flags));
    spec = model_spec_from_gguf(h);
    EXPECT_EQ(kv_cache_bytes(spec, 32768, KvType::q8_0, KvType::q8_0),
              (6 * 4096ull + 2 * 32768ull) * 2 * (2 * 64 / 32 * 34));

    // A window without a pattern: every layer is local (Mistral v0.1 style).
    erase_key(h, "qwen2.attention.sliding_window_pattern");
    spec = model_spec_from_gguf(h);
    EXPECT_EQ(kv_cache_bytes(spec, 1 << 20, KvType::f16, KvType::f16), 8 * 4096 * cell);
}

TEST(ModelSpec, RopeScalingAndYarnKeys) {
    Shape s;
    s.with_tensors = false;
    s.with_tokens = true;
    GgufHeader h = make_header(s);
    h.set("qwen2.rope.scaling.type", GgufValue::make_string("yarn"));
    h.set("qwen2.rope.scaling.factor", GgufValue::make_f32(4.0f));
    h.set("qwen2.rope.scaling.original_context_length", GgufValue::make_u32(32768));
    h.set("qwen2.rope.scaling.yarn_beta_fast", GgufValue::make_f32(16.0f));
    h.set("qwen2.rope.scaling.yarn_log_multiplier", GgufValue::make_f32(0.1f));
    h.set("qwen2.rope.dimension_count", GgufValue::make_u32(32));
    ModelSpec spec = model_spec_from_gguf(h);
    EXPECT_EQ(spec.rope.scaling, RopeScaling::yarn);
    EXPECT_EQ(spec.rope.scaling_factor, 4.0f);
    EXPECT_EQ(spec.rope.original_context, 32768u);
    EXPECT_EQ(spec.rope.yarn_beta_fast, 16.0f);
    EXPECT_EQ(spec.rope.yarn_beta_slow, 1.0f);
    EXPECT_FLOAT_EQ(spec.rope.yarn_log_multiplier, 0.1f);
    EXPECT_EQ(spec.rope.n_dims, 32u);

    // A factor without a type is linear scaling, as llama.cpp reads it.
    erase_key(h, "qwen2.rope.scaling.type");
    spec = model_spec_from_gguf(h);
    EXPECT_EQ(spec.rope.scaling, RopeScaling::linear);

    h.set("qwen2.rope.scaling.type", GgufValue::make_string("longrope"));
    std::string error = spec_error(h);
    EXPECT_CONTAINS(error, "longrope");
    EXPECT_CONTAINS(error, "none, linear, yarn");
}

TEST(ModelSpec, HeadDimNotMultipleOf32IsANoteNotAnError) {
    Shape s;
    s.n_embd = 240;  // 4 heads of 60
    s.with_tensors = false;
    s.with_tokens = true;
    ModelSpec spec = model_spec_from_gguf(make_header(s));
    EXPECT_EQ(spec.head_dim_k, 60u);
    ASSERT_EQ(spec.notes.size(), 1u);
    EXPECT_CONTAINS(spec.notes[0], "q8_0");
    EXPECT_TRUE(kv_type_fits(spec, KvType::f16));
    EXPECT_FALSE(kv_type_fits(spec, KvType::q8_0));
    EXPECT_FALSE(kv_type_fits(spec, KvType::q4_0));
    EXPECT_EQ(kv_bytes_per_cell(spec, KvType::f16, KvType::f16), 4u * 2 * 2 * 60 * 2);
    EXPECT_THROW(kv_bytes_per_cell(spec, KvType::q8_0, KvType::f16), Error);  // 120 values: not whole blocks
}

TEST(KvType, NamesAndRowBytes) {
    for (KvType t : {KvType::f16, KvType::q8_0, KvType::q4_0}) {
        EXPECT_EQ(kv_type_from_name(kv_type_name(t)), t);
    }
    EXPECT_FALSE(kv_type_from_name("q5_0").has_value());
    EXPECT_FALSE(kv_type_from_name("").has_value());
    EXPECT_EQ(kv_ggml_type(KvType::f16), GgmlType::F16);
    EXPECT_EQ(kv_ggml_type(KvType::q8_0), GgmlType::Q8_0);
    EXPECT_EQ(kv_ggml_type(KvType::q4_0), GgmlType::Q4_0);
    EXPECT_EQ(kv_row_bytes(KvType::f16, 1024), 2048u);
    EXPECT_EQ(kv_row_bytes(KvType::q8_0, 1024), 1088u);
    EXPECT_EQ(kv_row_bytes(KvType::q4_0, 1024), 576u);
    EXPECT_EQ(kv_row_bytes(KvType::f16, 7), 14u);
    EXPECT_THROW(kv_row_bytes(KvType::q4_0, 48), Error);
}

// ---- every error path ---------------------------------------------------------------

TEST(ModelSpecErrors, UnsupportedArchitectureNamesItAndTheSupportedOnes) {
    Shape s;
    s.arch = "gemma3";
    std::string error = spec_error(make_header(s));
    EXPECT_CONTAINS(error, "'gemma3'");
    EXPECT_CONTAINS(error, "llama, qwen2");
}

TEST(ModelSpecErrors, MissingArchitecture) {
    GgufHeader h = make_header(Shape{});
    erase_key(h, "general.architecture");
    EXPECT_CONTAINS(spec_error(h), "general.architecture");
    h.set("general.architecture", GgufValue::make_u32(3));
    EXPECT_CONTAINS(spec_error(h), "general.architecture must be a string");
}

TEST(ModelSpecErrors, AllMissingKeysInOneError) {
    Shape s;
    s.with_tensors = false;  // and no tokens: the vocab is missing too
    GgufHeader h = make_header(s);
    erase_key(h, "qwen2.block_count");
    erase_key(h, "qwen2.context_length");
    erase_key(h, "qwen2.attention.layer_norm_rms_epsilon");
    erase_key(h, "qwen2.feed_forward_length");
    std::string error = spec_error(h);
    EXPECT_CONTAINS(error, "missing required keys for qwen2");
    for (const char* key : {"qwen2.block_count", "qwen2.context_length", "qwen2.attention.layer_norm_rms_epsilon",
                            "qwen2.feed_forward_length", "tokenizer.ggml.tokens"})
        EXPECT_CONTAINS(error, key);
    EXPECT_EQ(error.find("embedding_length"), std::string::npos) << error;
}

TEST(ModelSpecErrors, WrongValueTypes) {
    GgufHeader h = make_header(Shape{});
    h.set("qwen2.block_count", GgufValue::make_string("four"));
    h.set("qwen2.rope.freq_base", GgufValue::make_string("big"));
    std::string error = spec_error(h);
    EXPECT_CONTAINS(error, "qwen2.block_count must be an unsigned 32-bit integer");
    EXPECT_CONTAINS(error, "four");
    h = make_header(Shape{});
    h.set("qwen2.embedding_length", GgufValue::make_i32(-256));
    EXPECT_CONTAINS(spec_error(h), "qwen2.embedding_length must be an unsigned 32-bit integer");
    h = make_header(Shape{});
    h.set("qwen2.attention.layer_norm_rms_epsilon", GgufValue::make_string("tiny"));
    EXPECT_CONTAINS(spec_error(h), "layer_norm_rms_epsilon must be a finite number");
}

TEST(ModelSpecErrors, EmbeddingNotDivisibleByHeads) {
    Shape s;
    s.n_embd = 250;
    s.with_tensors = false;
    s.with_tokens = true;
    std::string error = spec_error(make_header(s));
    EXPECT_CONTAINS(error, "250");
    EXPECT_CONTAINS(error, "not divisible by the 4 query heads");
    // With explicit head dims the embedding width need not split evenly.
    GgufHeader h = make_header(s);
    h.set("qwen2.attention.key_length", GgufValue::make_u32(64));
    h.set("qwen2.attention.value_length", GgufValue::make_u32(64));
    EXPECT_EQ(spec_error(h), "");
}

TEST(ModelSpecErrors, HeadsNotMultipleOfKvHeads) {
    Shape s;
    s.n_head = 4;
    s.n_head_kv = 3;
    s.with_tensors = false;
    s.with_tokens = true;
    EXPECT_CONTAINS(spec_error(make_header(s)), "4 query heads are not a multiple of 3 KV heads");
    GgufHeader h = make_header(Shape{.with_tokens = true, .with_tensors = false});
    h.set("qwen2.attention.head_count_kv", u32_array({2, 2, 3, 2}));
    EXPECT_CONTAINS(spec_error(h), "not a multiple of 3 KV heads in layer 2");
}

TEST(ModelSpecErrors, ZeroSizes) {
    for (const char* key : {"qwen2.embedding_length", "qwen2.context_length", "qwen2.attention.head_count",
                            "qwen2.attention.head_count_kv", "qwen2.feed_forward_length"}) {
        GgufHeader h = make_header(Shape{.with_tokens = true, .with_tensors = false});
        h.set(key, GgufValue::make_u32(0));
        EXPECT_CONTAINS(spec_error(h), std::string(key) + " is 0");
    }
    for (uint32_t layers : {0u, 4000000000u}) {
        GgufHeader h = make_header(Shape{.with_tokens = true, .with_tensors = false});
        h.set("qwen2.block_count", GgufValue::make_u32(layers));
        EXPECT_CONTAINS(spec_error(h), "qwen2.block_count = " + std::to_string(layers) + " is out of range");
    }
    GgufHeader h;
    h = make_header(Shape{.with_tokens = true, .with_tensors = false});
    h.set("qwen2.attention.layer_norm_rms_epsilon", GgufValue::make_f32(0.0f));
    EXPECT_CONTAINS(spec_error(h), "layer_norm_rms_epsilon");
    h = make_header(Shape{.with_tokens = true, .with_tensors = false});
    h.set("qwen2.rope.dimension_count", GgufValue::make_u32(65));
    EXPECT_CONTAINS(spec_error(h), "rope.dimension_count = 65");
}

TEST(ModelSpecErrors, PerLayerArrayOfWrongLength) {
    GgufHeader h = make_header(Shape{.with_tokens = true, .with_tensors = false});
    h.set("qwen2.attention.head_count_kv", u32_array({2, 2, 2}));
    EXPECT_CONTAINS(spec_error(h), "qwen2.attention.head_count_kv has 3 per-layer values but block_count is 4");
    h = make_header(Shape{.with_tokens = true, .with_tensors = false});
    h.set("qwen2.attention.sliding_window", GgufValue::make_u32(128));
    h.set("qwen2.attention.sliding_window_pattern",
          GgufValue::make_array(GgufValueType::BOOL, {GgufValue::make_bool(true)}));
    EXPECT_CONTAINS(spec_error(h), "sliding_window_pattern has 1 entries but block_count is 4");
}

TEST(ModelSpecErrors, TensorShapeDisagreesWithMetadata) {
    GgufHeader h = make_header(Shape{});
    find_tensor(h, "blk.3.attn_k.weight")->shape = {256, 256};  // as if 4 KV heads, metadata says 2
    std::string error = spec_error(h);
    EXPECT_CONTAINS(error, "tensor blk.3.attn_k.weight has shape [256, 256] but the metadata implies [256, 128]");
    h = make_header(Shape{});
    find_tensor(h, "blk.0.ffn_down.weight")->shape = {500, 256};
    EXPECT_CONTAINS(spec_error(h), "blk.0.ffn_down.weight has shape [500, 256]");
}

TEST(ModelSpecErrors, MissingAndExtraLayerTensors) {
    GgufHeader h = make_header(Shape{});
    std::erase_if(h.tensors, [](const GgufTensorInfo& t) { return t.name == "blk.2.attn_v.weight"; });
    std::erase_if(h.tensors, [](const GgufTensorInfo& t) { return t.name == "blk.1.attn_k.bias"; });
    std::string error = spec_error(h);
    EXPECT_CONTAINS(error, "missing tensors: blk.1.attn_k.bias, blk.2.attn_v.weight");
    h = make_header(Shape{});
    h.tensors.push_back(tensor_info("blk.4.attn_norm.weight", {256}, GgmlType::F32));
    EXPECT_CONTAINS(spec_error(h), "tensor blk.4.attn_norm.weight belongs to layer 4 but block_count is 4");
}

TEST(ModelSpecErrors, VocabSizeDisagreement) {
    Shape s;
    s.with_tokens = true;
    GgufHeader h = make_header(s);
    find_tensor(h, "token_embd.weight")->shape = {256, 1024};
    std::string error = spec_error(h);
    EXPECT_CONTAINS(error, "tokenizer.ggml.tokens has 1000 tokens but token_embd.weight has 1024 rows");
    h.set("tokenizer.ggml.tokens", GgufValue::make_u32(5));
    EXPECT_CONTAINS(spec_error(h), "tokenizer.ggml.tokens must be an array of strings");
}
