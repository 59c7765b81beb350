#include "train_data.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "quality/niah_runner.h"

namespace spillway::niahtrain {
namespace {

// splitmix64, as quality/niah.cpp: the data must be identical on every machine and build.
uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
double unit(uint64_t x) { return (double)(mix(x) >> 11) / 9007199254740992.0; }

std::vector<uint16_t> to_u16(const std::vector<int32_t>& ids) {
    std::vector<uint16_t> out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
        if (id < 0 || id > 65535) fail("token id " + std::to_string(id) + " does not fit u16");
        out.push_back((uint16_t)id);
    }
    return out;
}

// Prompt + answer prefix as the gate encodes them (BOS added), then the answer and EOS.
// The answer begins with a space, so appending it never changes how the prefix tokenizes;
// checked anyway, since a mismatch would teach the model prompts it never sees.
Sample make_sample(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids, const std::string& prompt_text,
                   const std::vector<std::string>& expected, bool verify) {
    const std::string answer = answer_text(expected);
    std::vector<int32_t> answer_ids = tok.encode(answer, {.add_special = false});
    if (verify) {
        std::vector<int32_t> whole = tok.encode(prompt_text + answer);
        std::vector<int32_t> joined = prompt_ids;
        joined.insert(joined.end(), answer_ids.begin(), answer_ids.end());
        if (whole != joined) fail("answer tokens do not continue the prompt's tokens: '" + answer + "'");
    }
    Sample s;
    s.tokens = to_u16(prompt_ids);
    s.answer_start = (uint32_t)s.tokens.size();
    for (uint16_t id : to_u16(answer_ids)) s.tokens.push_back(id);
    s.tokens.push_back((uint16_t)tok.eos());
    s.n_expected = (uint16_t)expected.size();
    return s;
}

template <typename Fn>
void parallel_for(size_t n, unsigned threads, Fn fn) {
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    for (unsigned t = 0; t < std::max(1u, threads); ++t)
        pool.emplace_back([&] {
            for (size_t i; !failed && (i = next++) < n;) {
                try {
                    fn(i);
                } catch (...) {
                    if (!failed.exchange(true)) error = std::current_exception();
                }
            }
        });
    for (auto& th : pool) th.join();
    if (error) std::rethrow_exception(error);
}

}  // namespace

std::string answer_text(const std::vector<std::string>& expected) {
    std::string out;
    for (size_t i = 0; i < expected.size(); ++i) out += (i ? ", " : " ") + expected[i];
    return out + ".";
}

std::vector<TaskWeight> parse_task_weights(const std::string& spec) {
    std::vector<TaskWeight> out;
    std::stringstream in(spec);
    std::string item;
    while (std::getline(in, item, ',')) {
        if (item.empty()) continue;
        double w = 1;
        if (size_t colon = item.find(':'); colon != std::string::npos) {
            w = std::stod(item.substr(colon + 1));
            item.resize(colon);
        }
        auto task = niah_task_from_name(item);
        if (!task || !(w > 0)) fail("--tasks: bad entry '" + item + "'");
        out.push_back({*task, w});
    }
    if (out.empty()) fail("--tasks: no tasks");
    return out;
}

std::vector<Sample> generate_train(const Tokenizer& tok, const GenConfig& c) {
    if (c.min_len < 96 || c.max_len < c.min_len) fail("gen: need 96 <= --min-len <= --max-len");
    double total_w = 0;
    for (const TaskWeight& t : c.tasks) total_w += t.weight;
    const TokenCounter count = [&](const std::string& text) { return tok.encode(text).size(); };
    std::vector<std::vector<Sample>> batches(c.n_batches);
    parallel_for(c.n_batches, c.threads, [&](size_t b) {
        const uint64_t bseed = mix(c.seed * 0x100000001b3ull + b);
        const uint32_t target = c.min_len + (uint32_t)(unit(bseed) * (c.max_len - c.min_len + 1));
        const uint32_t n = std::max(1u, c.tokens_per_batch / target);
        for (uint32_t i = 0; i < n; ++i) {
            const uint64_t sseed = mix(bseed ^ mix(i + 1));
            double pick = unit(sseed ^ 0x7a5c) * total_w;
            NiahTask task = c.tasks.back().task;
            for (const TaskWeight& t : c.tasks)
                if ((pick -= t.weight) < 0) {
                    task = t.task;
                    break;
                }
            const double depth = unit(sseed ^ 0xde9);
            const NiahSample ns = make_niah_sample({task, target, depth, sseed}, count);
            const std::string text = ns.prompt + ns.answer_prefix;
            Sample s = make_sample(tok, tok.encode(text), text, ns.expected, i == 0);
            s.batch = (uint32_t)b;
            s.task = task;
            s.depth = (float)depth;
            s.target = target;
            batches[b].push_back(std::move(s));
        }
    });
    std::vector<Sample> out;
    for (auto& b : batches)
        for (auto& s : b) out.push_back(std::move(s));
    return out;
}

std::vector<Sample> generate_eval(const Tokenizer& tok, const std::vector<NiahTask>& tasks,
                                  const std::vector<uint32_t>& lengths, uint32_t n_depths, uint32_t samples,
                                  uint64_t seed, std::vector<std::vector<std::string>>* expected) {
    TextCodec codec;
    codec.encode = [&](const std::string& text) { return tok.encode(text); };
    codec.decode = [&](const std::vector<int32_t>& ids) { return tok.decode(ids); };
    codec.is_end = [&](int32_t id) { return tok.is_end_of_generation(id); };
    NiahRunConfig config;  // the gate's defaults except what is given
    config.tasks = tasks;
    config.lengths = lengths;
    config.n_depths = n_depths;
    config.samples = samples;
    config.seed = seed;
    std::vector<Sample> out;
    uint32_t batch = 0;
    for (const NiahPrompt& p : make_niah_prompts(codec, config)) {
        Sample s = make_sample(tok, p.tokens, "", p.expected, false);
        // One batch per (task, length), so the trainer can decode a batch of equal lengths.
        if (!out.empty() && (out.back().task != p.task || out.back().target != p.length)) ++batch;
        s.batch = batch;
        s.task = p.task;
        s.depth = (float)p.depth;
        s.target = p.length;
        out.push_back(std::move(s));
        if (expected) expected->push_back(p.expected);
    }
    return out;
}

void write_samples(const std::string& path, const std::vector<Sample>& samples, uint32_t n_vocab) {
    std::ofstream out(path + ".tmp", std::ios::binary);
    if (!out) fail("cannot write '" + path + "'");
    auto put = [&](const auto& v) { out.write(reinterpret_cast<const char*>(&v), sizeof v); };
    uint64_t n_tokens = 0;
    for (const Sample& s : samples) n_tokens += s.tokens.size();
    out.write("NIAHTRN1", 8);
    put((uint32_t)1);
    put((uint32_t)samples.size());
    put((uint32_t)(samples.empty() ? 0 : samples.back().batch + 1));
    put(n_vocab);
    put(n_tokens);
    uint64_t first = 0;
    for (const Sample& s : samples) {
        put(first);
        put((uint32_t)s.tokens.size());
        put(s.answer_start);
        put(s.batch);
        put((uint16_t)s.task);
        put(s.n_expected);
        put(s.depth);
        put(s.target);
        first += s.tokens.size();
    }
    for (const Sample& s : samples) out.write(reinterpret_cast<const char*>(s.tokens.data()), 2 * s.tokens.size());
    out.close();
    if (!out || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) fail("cannot write '" + path + "'");
}

}  // namespace spillway::niahtrain
