// niah-train-data: the test model's vocabulary and data (docs/test-model.md).
//   vocab --out FILE.json [--samples N]        learn the vocabulary from the niah generator
//   check --vocab FILE.json                     prove the promised pieces are one token each
//   gen   --vocab F --out F.bin [options]       training batches (see train_data.h)
//   eval  --vocab F --out F.bin --tasks .. --lengths .. [--depths 5 --samples 1 --seed 42]
//                                               the gate's own prompts + reference answers,
//                                               and F.bin.json with the expected strings
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/error.h"
#include "tokenizer/pretokenize.h"
#include "train_data.h"
#include "vocab_builder.h"

using namespace spillway;
using namespace spillway::niahtrain;

namespace {

struct Args {
    std::map<std::string, std::string> kv;
    Args(int argc, char** argv, int first) {
        for (int i = first; i < argc; i += 2) {
            if (std::strncmp(argv[i], "--", 2) != 0 || i + 1 >= argc) fail(std::string("bad argument '") + argv[i] + "'");
            kv[argv[i]] = argv[i + 1];
        }
    }
    std::string str(const std::string& k, const char* fallback = nullptr) const {
        auto it = kv.find(k);
        if (it != kv.end()) return it->second;
        if (!fallback) fail("missing " + k);
        return fallback;
    }
    uint64_t num(const std::string& k, uint64_t fallback) const {
        auto it = kv.find(k);
        return it == kv.end() ? fallback : std::stoull(it->second);
    }
};

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= s.size()) {
        size_t comma = s.find(',', start);
        if (comma == std::string::npos) comma = s.size();
        if (comma > start) out.push_back(s.substr(start, comma - start));
        start = comma + 1;
    }
    return out;
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int cmd_vocab(const Args& a) {
    const double t0 = now_s();
    VocabFile v = build_vocab((uint32_t)a.num("--samples", 200));
    save_vocab_json(v, a.str("--out"));
    std::printf("vocab: %zu tokens (256 bytes, %zu merges, 2 control) in %.1f s -> %s\n", v.tokens.size(),
                v.merges.size(), now_s() - t0, a.str("--out").c_str());
    return 0;
}

int cmd_check(const Args& a) {
    const VocabFile v = load_vocab_json(a.str("--vocab"));
    const Tokenizer tok = make_tokenizer(v);
    // The same merges without whole-piece lookup: the file must also be a consistent BPE for
    // tokenizers that only merge (HF without ignore_merges).
    Vocab merge_only_vocab = tok.vocab();
    merge_only_vocab.ignore_merges = false;
    const Tokenizer merge_only(merge_only_vocab);
    int bad = 0;
    std::map<std::string, int> promised;
    for (const Promise& p : vocab_promises()) {
        ++promised[p.what];
        for (const Tokenizer* t : {&tok, &merge_only}) {
            auto ids = t->encode(p.text, {.add_special = false});
            if (ids.size() != 1) {
                if (bad++ < 20) std::printf("NOT ONE TOKEN (%s): '%s' -> %zu tokens\n", p.what.c_str(), p.text.c_str(), ids.size());
            }
        }
    }
    // Every non-UUID, non-digit piece of real prompts of every task must be one token too, and
    // keys must cost exactly two tokens (" adjective", "-noun") wherever they appear.
    const TokenCounter count = [&](const std::string& s) { return tok.encode(s).size(); };
    size_t pieces = 0, prompt_tokens = 0, prompt_chars = 0;
    for (NiahTask task : all_niah_tasks())
        for (uint32_t seed = 0; seed < 8; ++seed) {
            NiahSample s = make_niah_sample({task, 1024, seed / 7.0, 777 + seed}, count);
            const std::string text = s.prompt + s.answer_prefix + answer_text(s.expected);
            prompt_tokens += tok.encode(text).size();
            prompt_chars += text.size();
            std::vector<int32_t> merged = merge_only.encode(text), looked_up = tok.encode(text);
            if (merged != looked_up && bad++ < 20) std::printf("MERGE-ONLY DIFFERS on a %s prompt\n", niah_task_name(task));
            for (std::string_view piece : pretokenize(text, PreTokenizer::llama3)) {
                const bool hexish = piece.find_first_of("0123456789") != std::string_view::npos ||
                                    task == NiahTask::single_3 || task == NiahTask::multikey_3;
                if (hexish) continue;  // numbers: digit groups above; UUID tasks: hex groups above
                ++pieces;
                if (tok.encode(piece, {.add_special = false}).size() != 1 && bad++ < 20)
                    std::printf("PIECE NOT ONE TOKEN: '%.*s'\n", (int)piece.size(), piece.data());
            }
            for (const std::string& v : s.expected) {
                const size_t n = tok.encode(" " + v, {.add_special = false}).size();
                const size_t want = v.size() == 7 ? 4 : 0;  // " ", "ddd", "ddd", "d"
                if (want && n != want && bad++ < 20) std::printf("VALUE '%s' -> %zu tokens\n", v.c_str(), n);
            }
        }
    // Every possible word key, in context after a space: " adjective" + "-noun".
    size_t keys = 0;
    for (const std::string& adj : niah_key_adjectives())
        for (const std::string& noun : niah_key_nouns()) {
            ++keys;
            const size_t n = tok.encode(" " + adj + "-" + noun, {.add_special = false}).size();
            if (n != 2 && bad++ < 20) std::printf("KEY '%s-%s' -> %zu tokens\n", adj.c_str(), noun.c_str(), n);
        }
    std::printf("all %zu word keys are 2 tokens each\n", keys);
    for (auto& [what, n] : promised) std::printf("promised one token: %4d %s\n", n, what.c_str());
    std::printf("vocab %zu tokens, %zu merges; %zu prompt pieces checked; %.2f chars/token on niah prompts\n",
                v.tokens.size(), v.merges.size(), pieces, (double)prompt_chars / (double)prompt_tokens);
    std::printf("%s\n", bad ? "CHECK FAILED" : "check passed");
    return bad ? 1 : 0;
}

int cmd_gen(const Args& a) {
    const VocabFile v = load_vocab_json(a.str("--vocab"));
    const Tokenizer tok = make_tokenizer(v);
    GenConfig c;
    c.tasks = parse_task_weights(a.str("--tasks", "single_1,single_2"));
    c.min_len = (uint32_t)a.num("--min-len", 256);
    c.max_len = (uint32_t)a.num("--max-len", 512);
    c.tokens_per_batch = (uint32_t)a.num("--tokens-per-batch", 65536);
    c.n_batches = (uint32_t)a.num("--batches", 16);
    c.seed = a.num("--seed", 1);
    c.threads = (unsigned)a.num("--threads", std::max(1u, std::thread::hardware_concurrency()));
    const double t0 = now_s();
    const std::vector<Sample> samples = generate_train(tok, c);
    write_samples(a.str("--out"), samples, (uint32_t)v.tokens.size());
    size_t n = 0;
    for (const Sample& s : samples) n += s.tokens.size();
    const double dt = now_s() - t0;
    std::printf("gen: %zu samples, %u batches, %zu tokens in %.1f s (%.0f tok/s, %u threads) -> %s\n", samples.size(),
                c.n_batches, n, dt, n / dt, c.threads, a.str("--out").c_str());
    return 0;
}

int cmd_eval(const Args& a) {
    const VocabFile v = load_vocab_json(a.str("--vocab"));
    const Tokenizer tok = make_tokenizer(v);
    std::vector<NiahTask> tasks;
    for (const std::string& name : split(a.str("--tasks", "single_1,single_2,single_3"))) {
        auto t = niah_task_from_name(name);
        if (!t) fail("--tasks: unknown task '" + name + "'");
        tasks.push_back(*t);
    }
    std::vector<uint32_t> lengths;
    for (const std::string& l : split(a.str("--lengths", "512"))) lengths.push_back((uint32_t)std::stoul(l));
    std::vector<std::vector<std::string>> expected;
    const std::vector<Sample> samples = generate_eval(tok, tasks, lengths, (uint32_t)a.num("--depths", 5),
                                                      (uint32_t)a.num("--samples", 1), a.num("--seed", 42), &expected);
    const std::string out = a.str("--out");
    write_samples(out, samples, (uint32_t)v.tokens.size());
    nlohmann::json j = nlohmann::json::array();
    for (size_t i = 0; i < samples.size(); ++i)
        j.push_back({{"task", niah_task_name(samples[i].task)}, {"length", samples[i].target},
                     {"depth", samples[i].depth}, {"expected", expected[i]}});
    std::ofstream(out + ".json") << j.dump(1) << "\n";
    std::printf("eval: %zu prompts -> %s (+ .json)\n", samples.size(), out.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: niah-train-data vocab|check|gen|eval [--key value ...]\n");
        return 2;
    }
    try {
        const std::string cmd = argv[1];
        const Args a(argc, argv, 2);
        if (cmd == "vocab") return cmd_vocab(a);
        if (cmd == "check") return cmd_check(a);
        if (cmd == "gen") return cmd_gen(a);
        if (cmd == "eval") return cmd_eval(a);
        std::fprintf(stderr, "niah-train-data: unknown command '%s'\n", cmd.c_str());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "niah-train-data: error: %s\n", e.what());
        return 1;
    }
}
