#include "vocab_builder.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"
#include "quality/niah.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "train_data.h"

namespace spillway::niahtrain {
namespace {

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// Byte ranges of UUID-shaped substrings (8-4-4-4-12 lower-case hex). Their pieces are random
// hex fragments: the vocabulary gets fixed hex groups for them instead of learning from them.
std::vector<std::pair<size_t, size_t>> uuid_ranges(const std::string& text) {
    static const char* kShape = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t i = 0; i + 36 <= text.size();) {
        bool match = true;
        for (size_t k = 0; k < 36 && match; ++k)
            match = kShape[k] == '-' ? text[i + k] == '-' : is_hex(text[i + k]);
        if (match) {
            out.push_back({i, i + 36});
            i += 36;
        } else {
            ++i;
        }
    }
    return out;
}

std::string mapped(std::string_view bytes) {
    std::string out;
    for (unsigned char b : bytes) append_utf8(out, byte_to_codepoint(b));
    return out;
}

std::vector<std::string> digit_groups() {
    std::vector<std::string> out;
    char buf[8];
    for (int n = 0; n < 100; ++n) out.push_back((std::snprintf(buf, sizeof buf, "%02d", n), buf));
    for (int n = 0; n < 1000; ++n) out.push_back((std::snprintf(buf, sizeof buf, "%03d", n), buf));
    return out;
}

// UUID pieces under the llama3 split: runs of a-f letters, alone or after '-' or ' '. Runs of
// up to two letters are whole tokens; longer ones (rarer) are merged from those.
std::vector<std::string> hex_groups() {
    std::vector<std::string> runs;
    for (char a = 'a'; a <= 'f'; ++a) {
        runs.push_back(std::string(1, a));
        for (char b = 'a'; b <= 'f'; ++b) runs.push_back(std::string{a, b});
    }
    std::vector<std::string> out;
    for (const char* prefix : {"", "-", " "})
        for (const std::string& r : runs)
            if (*prefix || r.size() > 1) out.push_back(prefix + r);
    return out;
}

}  // namespace

std::vector<Promise> vocab_promises() {
    std::vector<Promise> out;
    for (const std::string& a : niah_key_adjectives()) out.push_back({" " + a, "key adjective"});
    for (const std::string& n : niah_key_nouns()) out.push_back({"-" + n, "key noun"});
    for (const std::string& d : digit_groups()) out.push_back({d, "digit group"});
    for (const std::string& h : hex_groups()) out.push_back({h, "hex group"});
    return out;
}

VocabFile build_vocab(uint32_t corpus_samples) {
    // 1. The pieces of the generator's closed text, with their counts: prompts of every task
    //    at a few lengths and depths, answer prefixes and answers.
    std::map<std::string, uint64_t> counts;
    auto add_text = [&](const std::string& text) {
        const auto uuids = uuid_ranges(text);
        for (std::string_view piece : pretokenize(text, PreTokenizer::llama3)) {
            const size_t begin = (size_t)(piece.data() - text.data()), end = begin + piece.size();
            bool skip = std::any_of(piece.begin(), piece.end(), [](char c) { return c >= '0' && c <= '9'; });
            for (auto [ub, ue] : uuids) skip = skip || (begin < ue && ub < end);
            if (!skip) ++counts[std::string(piece)];
        }
    };
    // Counting bytes/4 as tokens is enough to size the corpus prompts.
    const TokenCounter rough = [](const std::string& s) { return s.size() / 4; };
    const uint32_t lengths[] = {300, 800, 2500};
    for (NiahTask task : all_niah_tasks())
        for (uint32_t s = 0; s < corpus_samples; ++s) {
            NiahSample sample = make_niah_sample({task, lengths[s % 3], (s % 5) / 4.0, 1000 + s}, rough);
            add_text(sample.prompt + sample.answer_prefix + answer_text(sample.expected));
        }
    add_text(essay_haystack(7, 400000));

    // 2. Targets: every corpus piece, every key word form, digit and hex groups.
    struct Word {
        std::vector<int32_t> syms;
        uint64_t weight;
    };
    std::vector<std::string> tokens;
    std::unordered_map<std::string, int32_t> id_of;
    auto intern = [&](const std::string& t) {
        auto [it, added] = id_of.emplace(t, (int32_t)tokens.size());
        if (added) tokens.push_back(t);
        return it->second;
    };
    for (int b = 0; b < 256; ++b) intern(mapped(std::string(1, (char)b)));
    for (const Promise& p : vocab_promises()) counts.emplace(p.text, 1);  // keeps corpus counts
    std::vector<Word> words;
    for (const auto& [piece, n] : counts) {
        Word w{{}, n};
        for (unsigned char b : piece) w.syms.push_back(intern(mapped(std::string(1, (char)b))));
        if (w.syms.size() > 1) words.push_back(std::move(w));
    }

    // 3. Classic BPE: join the most frequent adjacent pair (ties: the smaller merge string,
    //    so the result never depends on hash order) until every target is one symbol.
    //    Merges are applied left to right, as the encoder does, so encoding a target with
    //    these merges alone (no whole-piece lookup) also yields one token.
    VocabFile v;
    while (!words.empty()) {
        std::map<std::pair<int32_t, int32_t>, uint64_t> pairs;
        for (const Word& w : words)
            for (size_t i = 0; i + 1 < w.syms.size(); ++i) pairs[{w.syms[i], w.syms[i + 1]}] += w.weight;
        std::pair<int32_t, int32_t> best{-1, -1};
        uint64_t best_n = 0;
        std::string best_text;
        for (const auto& [pair, n] : pairs) {
            std::string text = tokens[pair.first] + " " + tokens[pair.second];
            if (n > best_n || (n == best_n && text < best_text)) best = pair, best_n = n, best_text = std::move(text);
        }
        const int32_t merged = intern(tokens[best.first] + tokens[best.second]);
        v.merges.push_back(best_text);
        for (Word& w : words) {
            std::vector<int32_t> out;
            for (size_t i = 0; i < w.syms.size(); ++i) {
                if (i + 1 < w.syms.size() && w.syms[i] == best.first && w.syms[i + 1] == best.second) {
                    out.push_back(merged);
                    ++i;
                } else {
                    out.push_back(w.syms[i]);
                }
            }
            w.syms = std::move(out);
        }
        std::erase_if(words, [](const Word& w) { return w.syms.size() <= 1; });
    }
    v.tokens = tokens;
    v.types.assign(tokens.size(), 1);  // normal
    v.bos = (int32_t)v.tokens.size();
    v.tokens.push_back("<s>");
    v.eos = (int32_t)v.tokens.size();
    v.tokens.push_back("</s>");
    v.types.push_back(3);  // control
    v.types.push_back(3);
    return v;
}

void save_vocab_json(const VocabFile& v, const std::string& path) {
    nlohmann::json j = {{"format", "spillway-niah-vocab-1"},
                        {"model", "gpt2"},
                        {"pre", v.pre},
                        {"bos", v.bos},
                        {"eos", v.eos},
                        {"tokens", v.tokens},
                        {"token_type", v.types},
                        {"merges", v.merges}};
    std::ofstream out(path);
    if (!out) fail("cannot write '" + path + "'");
    out << j.dump(0) << "\n";
}

VocabFile load_vocab_json(const std::string& path) {
    std::ifstream in(path);
    if (!in) fail("cannot read '" + path + "'");
    nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("format", "") != "spillway-niah-vocab-1") fail(path + ": not a spillway-niah-vocab-1 file");
    VocabFile v;
    v.pre = j.at("pre").get<std::string>();
    v.tokens = j.at("tokens").get<std::vector<std::string>>();
    v.types = j.at("token_type").get<std::vector<int32_t>>();
    v.merges = j.at("merges").get<std::vector<std::string>>();
    v.bos = j.at("bos").get<int32_t>();
    v.eos = j.at("eos").get<int32_t>();
    if (v.tokens.size() != v.types.size() || v.tokens.size() > 65535)
        fail(path + ": token and type counts differ, or too many tokens for u16 ids");
    return v;
}

Tokenizer make_tokenizer(const VocabFile& v) {
    GgufHeader h;
    auto strings = [](const std::vector<std::string>& items) {
        std::vector<GgufValue> a;
        for (const std::string& s : items) a.push_back(GgufValue::make_string(s));
        return GgufValue::make_array(GgufValueType::STRING, std::move(a));
    };
    std::vector<GgufValue> types;
    for (int32_t t : v.types) types.push_back(GgufValue::make_i32(t));
    h.set("tokenizer.ggml.model", GgufValue::make_string("gpt2"));
    h.set("tokenizer.ggml.pre", GgufValue::make_string(v.pre));
    h.set("tokenizer.ggml.tokens", strings(v.tokens));
    h.set("tokenizer.ggml.token_type", GgufValue::make_array(GgufValueType::INT32, std::move(types)));
    h.set("tokenizer.ggml.merges", strings(v.merges));
    h.set("tokenizer.ggml.bos_token_id", GgufValue::make_u32((uint32_t)v.bos));
    h.set("tokenizer.ggml.eos_token_id", GgufValue::make_u32((uint32_t)v.eos));
    h.set("tokenizer.ggml.add_bos_token", GgufValue::make_bool(true));
    h.set("tokenizer.ggml.add_eos_token", GgufValue::make_bool(false));
    return Tokenizer(h);
}

}  // namespace spillway::niahtrain
