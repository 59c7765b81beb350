// Hand-written unit tests: UTF-8 handling, pre-tokenizer splits, byte-level BPE and
// SentencePiece merging on tiny vocabularies, special tokens, the streaming decoder and
// the chat formats. The real-vocabulary comparison lives in reference_test.cpp.
#include <gtest/gtest.h>

#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/hf_convert.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace spillway {
namespace {

std::vector<std::string> split(std::string_view text, PreTokenizer kind) {
    std::vector<std::string> out;
    for (std::string_view piece : pretokenize(text, kind)) out.emplace_back(piece);
    return out;
}

GgufValue strings(const std::vector<std::string>& items) {
    std::vector<GgufValue> values;
    for (const auto& s : items) values.push_back(GgufValue::make_string(s));
    return GgufValue::make_array(GgufValueType::STRING, std::move(values));
}

std::string byte_level(std::string_view raw) {
    std::string out;
    for (char c : raw) append_utf8(out, byte_to_codepoint(static_cast<uint8_t>(c)));
    return out;
}

// A byte-level BPE vocab: the 256 byte tokens, then merges "h e", "l l", "he ll",
// "hell o", "Ġ w", then two special tokens.
GgufHeader tiny_bpe_header() {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_level(std::string(1, static_cast<char>(b))));
    for (const char* t : {"he", "ll", "hell", "hello", " w"}) tokens.push_back(byte_level(t));
    tokens.push_back("<|end|>");
    tokens.push_back("<tool>");
    std::vector<GgufValue> types(tokens.size(), GgufValue::make_i32(1));
    types[tokens.size() - 2] = GgufValue::make_i32(3);  // control
    types[tokens.size() - 1] = GgufValue::make_i32(4);  // user-defined
    GgufHeader h;
    h.set("tokenizer.ggml.model", GgufValue::make_string("gpt2"));
    h.set("tokenizer.ggml.pre", GgufValue::make_string("qwen2"));
    h.set("tokenizer.ggml.tokens", strings(tokens));
    h.set("tokenizer.ggml.token_type", GgufValue::make_array(GgufValueType::INT32, types));
    h.set("tokenizer.ggml.merges", strings({"h e", "l l", "he ll", "hell o", byte_level(" ") + " w"}));
    h.set("tokenizer.ggml.eos_token_id", GgufValue::make_u32(static_cast<uint32_t>(tokens.size() - 2)));
    return h;
}

// A SentencePiece vocab: <unk> <s> </s>, the 256 byte tokens, then pieces with scores.
GgufHeader tiny_spm_header() {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    std::vector<float> scores = {0, 0, 0};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        tokens.push_back(name);
        types.push_back(6);
        scores.push_back(0);
    }
    const std::pair<const char*, float> pieces[] = {
        {"\xE2\x96\x81", -1}, {"h", -2}, {"e", -2}, {"l", -2}, {"o", -2}, {"w", -2}, {"r", -2}, {"d", -2},
        {"ll", -3}, {"he", -4}, {"\xE2\x96\x81h", -5}, {"hell", -6}, {"\xE2\x96\x81hell", -7},
        {"\xE2\x96\x81hello", -8}, {"\xE2\x96\x81w", -9}, {"or", -10}, {"\xE2\x96\x81wor", -11},
        {"\xE2\x96\x81world", -12}, {"ld", -13}};
    for (auto [text, score] : pieces) {
        tokens.push_back(text);
        types.push_back(1);
        scores.push_back(score);
    }
    std::vector<GgufValue> type_values, score_values;
    for (int32_t t : types) type_values.push_back(GgufValue::make_i32(t));
    for (float s : scores) score_values.push_back(GgufValue::make_f32(s));
    GgufHeader h;
    h.set("tokenizer.ggml.model", GgufValue::make_string("llama"));
    h.set("tokenizer.ggml.tokens", strings(tokens));
    h.set("tokenizer.ggml.token_type", GgufValue::make_array(GgufValueType::INT32, type_values));
    h.set("tokenizer.ggml.scores", GgufValue::make_array(GgufValueType::FLOAT32, score_values));
    h.set("tokenizer.ggml.bos_token_id", GgufValue::make_u32(1));
    h.set("tokenizer.ggml.eos_token_id", GgufValue::make_u32(2));
    return h;
}

int32_t id_of(const Tokenizer& t, const std::string& text) { return t.vocab().ids.at(text); }

TEST(Utf8, ReplacesMaximalInvalidSubsequences) {
    // Truncated 3-byte sequence: one U+FFFD for both bytes, then 'A' is kept.
    EXPECT_EQ(decode_utf8("\xE2\x82" "A"), (std::vector<uint32_t>{0xFFFD, 'A'}));
    // Overlong encoding: each byte is its own error.
    EXPECT_EQ(decode_utf8("\xC0\xAF"), (std::vector<uint32_t>{0xFFFD, 0xFFFD}));
    // Surrogate: ED A0 80 is three errors (A0 is not a valid second byte after ED).
    EXPECT_EQ(decode_utf8("\xED\xA0\x80"), (std::vector<uint32_t>{0xFFFD, 0xFFFD, 0xFFFD}));
    // Incomplete 4-byte sequence at the end.
    EXPECT_EQ(decode_utf8("x\xF0\x9F\x98"), (std::vector<uint32_t>{'x', 0xFFFD}));
    EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80"), (std::vector<uint32_t>{0x1F600}));
    EXPECT_TRUE(is_valid_utf8("caf\xC3\xA9 \xEF\xBF\xBD"));  // a literal U+FFFD is valid
    EXPECT_FALSE(is_valid_utf8("caf\xC3"));
    EXPECT_EQ(sanitize_utf8("a\x80z"), "a\xEF\xBF\xBDz");
}

TEST(Utf8, IncompleteTailIsHeldOnlyWhenItCanStillComplete) {
    EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xE2"), 1u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xE2\x82"), 2u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xE2\x82\xAC"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);
    EXPECT_EQ(utf8_incomplete_tail("\xED\xA0"), 0u);  // would be a surrogate: never valid
    EXPECT_EQ(utf8_incomplete_tail("\x80"), 0u);
}

TEST(Unicode, Categories) {
    EXPECT_TRUE(is_letter('a'));
    EXPECT_TRUE(is_letter(0x00E9));   // é
    EXPECT_TRUE(is_letter(0x4F60));   // 你
    EXPECT_FALSE(is_letter(0x0301));  // combining acute: a mark, not a letter
    EXPECT_TRUE(is_number('7'));
    EXPECT_TRUE(is_number(0x0663));   // Arabic-Indic three
    EXPECT_TRUE(is_number(0x00BD));   // ½ (No)
    EXPECT_TRUE(is_number(0x216B));   // Ⅻ (Nl)
    EXPECT_FALSE(is_number('x'));
    EXPECT_TRUE(is_whitespace(0x3000));
    EXPECT_TRUE(is_whitespace('\t'));
    EXPECT_FALSE(is_whitespace(0x200B));  // zero width space is Cf, not White_Space
}

TEST(PreTokenize, Qwen2Splits) {
    using V = std::vector<std::string>;
    EXPECT_EQ(split("Hello world", PreTokenizer::qwen2), (V{"Hello", " world"}));
    EXPECT_EQ(split("it's THEY'RE", PreTokenizer::qwen2), (V{"it", "'s", " THEY", "'RE"}));
    EXPECT_EQ(split("12345", PreTokenizer::qwen2), (V{"1", "2", "3", "4", "5"}));
    EXPECT_EQ(split("a  b", PreTokenizer::qwen2), (V{"a", " ", " b"}));
    EXPECT_EQ(split("x\n\n  y", PreTokenizer::qwen2), (V{"x", "\n\n", " ", " y"}));
    EXPECT_EQ(split("end   ", PreTokenizer::qwen2), (V{"end", "   "}));
    EXPECT_EQ(split("f(x);\n", PreTokenizer::qwen2), (V{"f", "(x", ");\n"}));
    EXPECT_EQ(split("\tif", PreTokenizer::qwen2), (V{"\tif"}));
    EXPECT_EQ(split("a ...!", PreTokenizer::qwen2), (V{"a", " ...!"}));
    EXPECT_EQ(split("你好，世界", PreTokenizer::qwen2), (V{"你好", "，世界"}));
}

TEST(PreTokenize, Llama3GroupsDigitsByThree) {
    using V = std::vector<std::string>;
    EXPECT_EQ(split("1234567", PreTokenizer::llama3), (V{"123", "456", "7"}));
    EXPECT_EQ(split("v2.10", PreTokenizer::llama3), (V{"v", "2", ".", "10"}));
}

TEST(PreTokenize, Gpt2DefaultSplits) {
    using V = std::vector<std::string>;
    EXPECT_EQ(split("Hello 123 world's!!", PreTokenizer::gpt2), (V{"Hello", " 123", " world", "'s", "!!"}));
}

TEST(PreTokenize, UnknownNameIsAnError) {
    EXPECT_THROW(pre_tokenizer_from_name("falcon"), Error);
    EXPECT_EQ(pre_tokenizer_from_name("llama-bpe"), PreTokenizer::llama3);
}

TEST(ByteBpe, MergesByRankAndRoundTrips) {
    Tokenizer t(tiny_bpe_header());
    auto ids = t.encode("hello world", {.add_special = false});
    // "hello" merges fully; " world" is " w" then single bytes.
    std::vector<int32_t> expected = {id_of(t, "hello"), id_of(t, byte_level(" w")), 'o' + 0, 'r' + 0, 'l' + 0, 'd' + 0};
    for (size_t k = 2; k < expected.size(); ++k) expected[k] = t.vocab().byte_token[expected[k]];
    EXPECT_EQ(ids, expected);
    EXPECT_EQ(t.decode(ids), "hello world");
}

TEST(ByteBpe, SpecialTokensNeedParseSpecialButUserDefinedDoNot) {
    Tokenizer t(tiny_bpe_header());
    int32_t end = id_of(t, "<|end|>"), tool = id_of(t, "<tool>");
    auto parsed = t.encode("hello<|end|><tool>", {.add_special = false, .parse_special = true});
    EXPECT_EQ(parsed, (std::vector<int32_t>{id_of(t, "hello"), end, tool}));
    auto literal = t.encode("hello<|end|><tool>", {.add_special = false, .parse_special = false});
    EXPECT_GT(literal.size(), 3u);
    EXPECT_EQ(literal.back(), tool);
    EXPECT_EQ(t.decode(parsed), "hello<tool>");  // control tokens are not rendered by default
    EXPECT_EQ(t.decode(parsed, {.render_special = true}), "hello<|end|><tool>");
    EXPECT_EQ(t.decode(literal), "hello<|end|><tool>");
    EXPECT_TRUE(t.is_end_of_generation(end));
}

TEST(ByteBpe, InvalidUtf8IsEncodedAsReplacementChar) {
    Tokenizer t(tiny_bpe_header());
    EXPECT_EQ(t.decode(t.encode("a\xFFz", {.add_special = false})), "a\xEF\xBF\xBDz");
}

TEST(ByteBpe, LongWordIsNotQuadratic) {
    Tokenizer t(tiny_bpe_header());
    std::string word(200000, 'l');  // one pre-token of 200k bytes: merges into "ll" pairs
    auto ids = t.encode(word, {.add_special = false});
    EXPECT_EQ(ids.size(), 100000u);
    EXPECT_EQ(t.decode(ids), word);
}

TEST(SentencePiece, MergesByScoreWithSpacePrefix) {
    Tokenizer t(tiny_spm_header());
    auto ids = t.encode("hello world", {.add_special = true});
    EXPECT_EQ(ids, (std::vector<int32_t>{1, id_of(t, "\xE2\x96\x81hello"), id_of(t, "\xE2\x96\x81world")}));
    EXPECT_EQ(t.decode(ids), "hello world");
}

TEST(SentencePiece, ByteFallbackForUnknownCharacters) {
    Tokenizer t(tiny_spm_header());
    auto ids = t.encode("h\xC3\xA9", {.add_special = false});  // é is not in the vocab
    EXPECT_EQ(ids, (std::vector<int32_t>{id_of(t, "\xE2\x96\x81h"), id_of(t, "<0xC3>"), id_of(t, "<0xA9>")}));
    EXPECT_EQ(t.decode(ids), "h\xC3\xA9");
}

TEST(SentencePiece, PrefixRestartsAfterSpecialTokens) {
    Tokenizer t(tiny_spm_header());
    auto ids = t.encode("hello</s>world", {.add_special = false, .parse_special = true});
    EXPECT_EQ(ids, (std::vector<int32_t>{id_of(t, "\xE2\x96\x81hello"), 2, id_of(t, "\xE2\x96\x81world")}));
    EXPECT_EQ(t.decode(ids, {.render_special = true}), "hello</s>world");
    auto literal = t.encode("hello</s>", {.add_special = false, .parse_special = false});
    EXPECT_NE(std::find(literal.begin(), literal.end(), id_of(t, "<0x3C>")), literal.end());
}

TEST(StreamDecoder, HoldsIncompleteCharactersUntilComplete) {
    Tokenizer t(tiny_bpe_header());
    auto byte = [&](uint8_t b) { return t.vocab().byte_token[b]; };
    StreamDecoder stream(t);
    // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80, fed one byte per token.
    EXPECT_EQ(stream.push(byte('a')), "a");
    EXPECT_EQ(stream.push(byte(0xC3)), "");
    EXPECT_EQ(stream.push(byte(0xA9)), "\xC3\xA9");
    EXPECT_EQ(stream.push(byte(0xE2)), "");
    EXPECT_EQ(stream.push(byte(0x82)), "");
    EXPECT_EQ(stream.push(byte(0xAC)), "\xE2\x82\xAC");
    EXPECT_EQ(stream.push(byte(0xF0)), "");
    EXPECT_EQ(stream.push(byte(0x9F)), "");
    EXPECT_EQ(stream.push(byte(0x98)), "");
    EXPECT_EQ(stream.push(byte(0x80)), "\xF0\x9F\x98\x80");
    // A broken sequence is replaced as soon as it is known to be broken.
    EXPECT_EQ(stream.push(byte(0xE2)), "");
    EXPECT_EQ(stream.push(byte('x')), "\xEF\xBF\xBDx");
    EXPECT_EQ(stream.push(byte(0x80)), "\xEF\xBF\xBD");  // lone continuation byte
    // An unfinished character at the end becomes U+FFFD on finish().
    EXPECT_EQ(stream.push(byte(0xF0)), "");
    EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");
    EXPECT_EQ(stream.finish(), "");
}

TEST(StreamDecoder, MultiByteTokensSplitAcrossCharacters) {
    // "hello" then a token that holds the first half of é: the text before is emitted at once.
    Tokenizer t(tiny_bpe_header());
    StreamDecoder stream(t);
    EXPECT_EQ(stream.push(id_of(t, "hello")), "hello");
    EXPECT_EQ(stream.push(t.vocab().byte_token[0xC3]), "");
    EXPECT_EQ(stream.push(t.vocab().byte_token[0xA9]), "\xC3\xA9");
}

TEST(StreamDecoder, SentencePieceDropsTheFirstSpace) {
    Tokenizer t(tiny_spm_header());
    StreamDecoder stream(t);
    std::string text;
    for (int32_t id : t.encode("hello world", {.add_special = true})) text += stream.push(id);
    EXPECT_EQ(text + stream.finish(), "hello world");
}

TEST(ChatTemplate, ChatMlWithSystemPrompt) {
    ChatTemplate chat = chat_template_from_string("{% for m in messages %}<|im_start|>{{ m.role }}...");
    std::string text = format_chat(chat, {{"user", "Hi"}}, {.system_prompt = "Be brief."});
    EXPECT_EQ(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(format_chat(chat, {{"user", "Hi"}}, {.add_generation_prompt = false}),
              "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, Qwen25DefaultSystemPrompt) {
    ChatTemplate chat = chat_template_from_string(
        "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}");
    EXPECT_EQ(format_chat(chat, {{"user", "Hi"}}),
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    // An explicit system message replaces the default.
    EXPECT_EQ(format_chat(chat, {{"system", "S"}, {"user", "Hi"}}, {.add_generation_prompt = false}),
              "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, Llama3TrimsContent) {
    ChatTemplate chat = chat_template_from_string("{{ '<|start_header_id|>' + message['role'] }}");
    EXPECT_EQ(format_chat(chat, {{"user", "  Hi\n"}}, {.system_prompt = "Sys"}),
              "<|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, UnknownTemplateIsAnError) {
    EXPECT_THROW(chat_template_from_string("{{ bos_token }}[INST] {{ content }} [/INST]"), Error);
    EXPECT_THROW(chat_template_from_string(""), Error);
}

TEST(Vocab, RejectsBadMetadata) {
    GgufHeader h = tiny_bpe_header();
    h.set("tokenizer.ggml.model", GgufValue::make_string("bert"));
    EXPECT_THROW(Tokenizer{h}, Error);
    h = tiny_bpe_header();
    h.set("tokenizer.ggml.eos_token_id", GgufValue::make_u32(1u << 30));
    EXPECT_THROW(Tokenizer{h}, Error);
    h = tiny_bpe_header();
    h.set("tokenizer.ggml.token_type", GgufValue::make_array(GgufValueType::INT32, {GgufValue::make_i32(1)}));
    EXPECT_THROW(Tokenizer{h}, Error);
    EXPECT_THROW(Tokenizer{GgufHeader{}}, Error);
}

TEST(HfConvert, ByteLevelJsonBecomesGgufKeys) {
    std::string json = R"({
      "added_tokens": [{"id": 5, "content": "<|end|>", "special": true}],
      "normalizer": null,
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated"},
        {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4}, "merges": [["a", "b"], "ab c"]}
    })";
    GgufHeader h = gguf_vocab_from_hf_json(json, R"({"eos_token": "<|end|>", "chat_template": "<|im_start|>"})");
    EXPECT_EQ(h.find("tokenizer.ggml.model")->s, "gpt2");
    EXPECT_EQ(h.find("tokenizer.ggml.pre")->s, "qwen2");
    EXPECT_EQ(h.find("tokenizer.ggml.merges")->array[0].s, "a b");
    EXPECT_EQ(*h.find("tokenizer.ggml.eos_token_id")->as_uint(), 5u);
    EXPECT_EQ(h.find("tokenizer.ggml.token_type")->array[5].as_int(), 3);
    Tokenizer t(h);
    EXPECT_EQ(t.encode("abc", {.add_special = false}), (std::vector<int32_t>{4}));
}

TEST(HfConvert, UnsupportedModelsAreErrors) {
    EXPECT_THROW(gguf_vocab_from_hf_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"), Error);
    EXPECT_THROW(gguf_vocab_from_hf_json("{not json"), Error);
    EXPECT_THROW(gguf_vocab_from_hf_json(R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x"}},
        "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "ByteLevel"}})"), Error);
}

}  // namespace
}  // namespace spillway
