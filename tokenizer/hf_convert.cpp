#include "tokenizer/hf_convert.h"

#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace spillway {
namespace {

using json = nlohmann::json;

// The Split regexes of the pre-tokenizers we implement (tokenizer.json spelling).
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

// Calls `visit` on every object nested in `node` (normalizer/pre_tokenizer sequences).
template <class Visit>
void for_each_object(const json& node, Visit&& visit) {
    if (node.is_object()) {
        visit(node);
        for (const auto& [key, child] : node.items()) for_each_object(child, visit);
    } else if (node.is_array()) {
        for (const auto& child : node) for_each_object(child, visit);
    }
}

// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
std::string token_text(const json& value) {
    if (value.is_string()) return value.get<std::string>();
    if (value.is_object() && value.contains("content") && value["content"].is_string())
        return value["content"].get<std::string>();
    return {};
}

GgufValue string_array(std::vector<std::string> items) {
    std::vector<GgufValue> values;
    values.reserve(items.size());
    for (auto& s : items) values.push_back(GgufValue::make_string(std::move(s)));
    return GgufValue::make_array(GgufValueType::STRING, std::move(values));
}

std::string read_file(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) fail("tokenizer: cannot open " + path);
    std::ostringstream content;
    content << file.rdbuf();
    return content.str();
}

}  // namespace

GgufHeader gguf_vocab_from_hf_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
    json tok, config = json::object();
    try {
        tok = json::parse(tokenizer_json);
        if (!tokenizer_config_json.empty()) config = json::parse(tokenizer_config_json);
    } catch (const json::exception& e) {
        fail(std::string("tokenizer: bad tokenizer JSON: ") + e.what());
    }
    try {
        const json& model = tok.at("model");
        std::string model_type = model.value("type", "");
        if (model_type != "BPE")
            fail("tokenizer: tokenizer.json model type \"" + model_type + "\" is not supported (BPE only)");

        // Which family: ▁ handling or byte fallback means SentencePiece-style; a ByteLevel
        // pre-tokenizer means GPT-2 style.
        bool metaspace = model.value("byte_fallback", false), byte_level = false, prepend_space = false;
        std::string split_regex;
        auto inspect = [&](const json& node) {
            std::string type = node.value("type", "");
            if (type == "ByteLevel") byte_level = true;
            if (type == "Metaspace") {
                metaspace = true;
                prepend_space = node.value("add_prefix_space", true) && node.value("prepend_scheme", "always") != "never";
            }
            if (type == "Prepend" && node.value("prepend", "") == kSpmSpace) metaspace = prepend_space = true;
            if (type == "Split" && node.contains("pattern") && node["pattern"].contains("Regex"))
                split_regex = node["pattern"]["Regex"].get<std::string>();
        };
        if (tok.contains("normalizer")) for_each_object(tok["normalizer"], inspect);
        if (tok.contains("pre_tokenizer")) for_each_object(tok["pre_tokenizer"], inspect);
        bool sentencepiece = metaspace && !byte_level;
        if (!sentencepiece && !byte_level)
            fail("tokenizer: tokenizer.json is neither byte-level BPE nor SentencePiece-style BPE");

        std::string pre = "default";
        if (byte_level && !split_regex.empty()) {
            if (split_regex == kQwen2Regex) pre = "qwen2";
            else if (split_regex == kLlama3Regex) pre = "llama-bpe";
            else fail("tokenizer: unsupported pre-tokenizer regex " + split_regex);
        }

        // Tokens by id: the model vocab, then added tokens (which may extend it).
        std::map<int64_t, std::string> by_id;
        for (const auto& [text, id] : model.at("vocab").items()) by_id[id.get<int64_t>()] = text;
        std::map<int64_t, bool> added;  // id -> special
        if (tok.contains("added_tokens")) {
            for (const json& t : tok["added_tokens"]) {
                int64_t id = t.at("id").get<int64_t>();
                by_id[id] = t.at("content").get<std::string>();
                added[id] = t.value("special", false);
            }
        }
        if (by_id.empty() || by_id.begin()->first < 0 || by_id.rbegin()->first > 0x7FFFFFF)
            fail("tokenizer: tokenizer.json token ids are empty or out of range");
        const int64_t n = by_id.rbegin()->first + 1;

        std::vector<std::string> tokens(n);
        std::vector<int32_t> types(n, static_cast<int32_t>(TokenType::normal));
        for (int64_t id = 0; id < n; ++id) {
            auto it = by_id.find(id);
            if (it == by_id.end()) {
                tokens[id] = "[PAD" + std::to_string(id) + "]";
                types[id] = static_cast<int32_t>(TokenType::unused);
            } else {
                tokens[id] = it->second;
            }
        }
        std::string unk_text = model.contains("unk_token") && model["unk_token"].is_string()
                                   ? model["unk_token"].get<std::string>() : "";
        for (int64_t id = 0; id < n; ++id) {
            const std::string& text = tokens[id];
            if (sentencepiece && text.size() == 6 && text.rfind("<0x", 0) == 0 && text.back() == '>')
                types[id] = static_cast<int32_t>(TokenType::byte);
            if (!unk_text.empty() && text == unk_text) types[id] = static_cast<int32_t>(TokenType::unknown);
            if (auto a = added.find(id); a != added.end() && text != unk_text)
                types[id] = static_cast<int32_t>(a->second ? TokenType::control : TokenType::user_defined);
        }

        // Merges come as "a b" strings or, in newer files, as ["a", "b"] pairs.
        std::vector<std::string> merges;
        for (const json& m : model.at("merges")) {
            if (m.is_string()) merges.push_back(m.get<std::string>());
            else merges.push_back(m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
        }

        std::unordered_map<std::string, int64_t> id_of;
        for (int64_t id = 0; id < n; ++id) id_of.emplace(tokens[id], id);

        GgufHeader header;
        header.set("tokenizer.ggml.model", GgufValue::make_string(sentencepiece ? "llama" : "gpt2"));
        if (!sentencepiece) header.set("tokenizer.ggml.pre", GgufValue::make_string(pre));
        std::vector<GgufValue> type_values;
        type_values.reserve(n);
        for (int32_t t : types) type_values.push_back(GgufValue::make_i32(t));

        if (sentencepiece) {
            // GGUF "llama" vocabs merge by score. A token's score is minus the rank of the
            // first merge that produces it, so the score order is HF's merge order; tokens
            // no merge produces can never be formed by HF and get the lowest score.
            std::vector<float> scores(n, 0.0f);
            std::vector<bool> produced(n, false);
            for (size_t rank = 0; rank < merges.size(); ++rank) {
                const std::string& m = merges[rank];
                size_t space = m.find(' ');
                if (space == std::string::npos) continue;
                auto it = id_of.find(m.substr(0, space) + m.substr(space + 1));
                if (it == id_of.end() || produced[it->second]) continue;
                produced[it->second] = true;
                scores[it->second] = -static_cast<float>(rank);
            }
            for (int64_t id = 0; id < n; ++id) {
                bool multi_char = decode_utf8(tokens[id]).size() > 1;
                if (!produced[id] && multi_char && types[id] == static_cast<int32_t>(TokenType::normal))
                    scores[id] = -1e9f;
            }
            std::vector<GgufValue> score_values;
            score_values.reserve(n);
            for (float s : scores) score_values.push_back(GgufValue::make_f32(s));
            header.set("tokenizer.ggml.tokens", string_array(tokens));
            header.set("tokenizer.ggml.scores", GgufValue::make_array(GgufValueType::FLOAT32, std::move(score_values)));
            header.set("tokenizer.ggml.token_type", GgufValue::make_array(GgufValueType::INT32, std::move(type_values)));
            header.set("tokenizer.ggml.add_space_prefix", GgufValue::make_bool(prepend_space));
        } else {
            header.set("tokenizer.ggml.tokens", string_array(tokens));
            header.set("tokenizer.ggml.token_type", GgufValue::make_array(GgufValueType::INT32, std::move(type_values)));
            header.set("tokenizer.ggml.merges", string_array(std::move(merges)));
        }

        auto set_id = [&](const char* key, const std::string& text) {
            if (text.empty()) return;
            auto it = id_of.find(text);
            if (it != id_of.end()) header.set(key, GgufValue::make_u32(static_cast<uint32_t>(it->second)));
        };
        std::string bos = config.contains("bos_token") ? token_text(config["bos_token"]) : "";
        std::string eos = config.contains("eos_token") ? token_text(config["eos_token"]) : "";
        std::string pad = config.contains("pad_token") ? token_text(config["pad_token"]) : "";
        // Without a config, a post-processor template names the BOS it adds.
        bool template_adds_bos = false, have_template = false;
        if (tok.contains("post_processor") && tok["post_processor"].is_object() &&
            tok["post_processor"].value("type", "") == "TemplateProcessing") {
            have_template = true;
            for (const json& item : tok["post_processor"].value("single", json::array())) {
                if (!item.contains("SpecialToken")) continue;
                template_adds_bos = true;
                if (bos.empty()) bos = item["SpecialToken"].value("id", "");
                break;
            }
        }
        set_id("tokenizer.ggml.bos_token_id", bos);
        set_id("tokenizer.ggml.eos_token_id", eos);
        set_id("tokenizer.ggml.padding_token_id", pad);
        set_id("tokenizer.ggml.unknown_token_id", unk_text);
        if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean())
            header.set("tokenizer.ggml.add_bos_token", GgufValue::make_bool(config["add_bos_token"].get<bool>()));
        else if (tok.contains("post_processor") && !tok["post_processor"].is_null())
            // HF adds exactly what the post-processor says: nothing unless it is a template.
            header.set("tokenizer.ggml.add_bos_token", GgufValue::make_bool(have_template && template_adds_bos));
        if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean())
            header.set("tokenizer.ggml.add_eos_token", GgufValue::make_bool(config["add_eos_token"].get<bool>()));
        if (config.contains("chat_template") && config["chat_template"].is_string())
            header.set("tokenizer.chat_template", GgufValue::make_string(config["chat_template"].get<std::string>()));
        return header;
    } catch (const json::exception& e) {
        fail(std::string("tokenizer: unexpected tokenizer.json structure: ") + e.what());
    }
}

GgufHeader gguf_vocab_from_hf_files(const std::string& tokenizer_json_path, const std::string& config_path) {
    std::string tokenizer_json = read_file(tokenizer_json_path);
    std::string config_json = config_path.empty() ? std::string() : read_file(config_path);
    return gguf_vocab_from_hf_json(tokenizer_json, config_json);
}

}  // namespace spillway
