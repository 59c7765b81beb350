#include "quality/niah_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/cpu/sampler.h"

namespace spillway {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Where a newline ends the answer: the first '\n' after some non-space text. A leading
// newline is allowed (models often start the answer on a new line).
size_t answer_end(const std::string& text) {
    bool begun = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == '\n' && begun) return i;
        if (c != ' ' && c != '\n' && c != '\t' && c != '\r') begun = true;
    }
    return std::string::npos;
}

std::string depth_name(double depth) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", depth);
    return buf;
}

}  // namespace

GreedyAnswer generate_greedy(LogitsBackend& backend, const TextCodec& codec, const std::vector<int32_t>& prompt,
                             const GreedyOptions& options) {
    if (prompt.empty()) fail("niah: empty prompt");
    if (prompt.size() >= backend.n_ctx())
        fail("niah: the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " +
             std::to_string(backend.n_ctx()));
    GreedyAnswer answer;
    backend.reset();
    const uint32_t V = backend.n_vocab();
    auto t0 = Clock::now();
    const float* logits = backend.eval(prompt.data(), (uint32_t)prompt.size(), false);
    answer.prefill_s = seconds_since(t0);

    t0 = Clock::now();
    for (uint32_t i = 0; i < options.max_tokens; ++i) {
        const int32_t token = argmax(logits, V);
        if (codec.is_end(token)) break;
        answer.tokens.push_back(token);
        if (options.stop_at_newline) {
            answer.text = codec.decode(answer.tokens);
            if (answer_end(answer.text) != std::string::npos) break;
        }
        if (i + 1 == options.max_tokens || backend.position() >= backend.n_ctx()) break;
        logits = backend.eval(&token, 1, false);
        ++answer.decode_steps;
    }
    answer.decode_s = seconds_since(t0);
    answer.text = codec.decode(answer.tokens);
    if (options.stop_at_newline) {
        const size_t end = answer_end(answer.text);
        if (end != std::string::npos) answer.text.resize(end);
    }
    return answer;
}

NiahReport aggregate_niah(std::vector<NiahCase> cases) {
    NiahReport report;
    report.cases = std::move(cases);
    // Groups in first-seen order, which is the config's order for run_niah's cases.
    auto add = [](std::vector<NiahGroup>& groups, const std::string& name, double score) {
        auto it = std::find_if(groups.begin(), groups.end(), [&](const NiahGroup& g) { return g.name == name; });
        if (it == groups.end()) {
            groups.push_back({name, 0, 0});
            it = groups.end() - 1;
        }
        it->score += score;  // a sum until the end
        ++it->cases;
    };
    double total = 0;
    for (const NiahCase& c : report.cases) {
        add(report.by_task, niah_task_name(c.task), c.score);
        add(report.by_task_length, std::string(niah_task_name(c.task)) + "@" + std::to_string(c.length), c.score);
        add(report.by_length, std::to_string(c.length), c.score);
        add(report.by_depth, depth_name(c.depth), c.score);
        total += c.score;
        report.prefill_tokens += c.prompt_tokens;
        report.prefill_s += c.prefill_s;
        report.decode_steps += c.decode_steps;
        report.decode_s += c.decode_s;
    }
    for (auto* groups : {&report.by_task, &report.by_length, &report.by_depth, &report.by_task_length})
        for (NiahGroup& g : *groups) g.score /= (double)g.cases;
    std::sort(report.by_depth.begin(), report.by_depth.end(),
              [](const NiahGroup& a, const NiahGroup& b) { return std::stod(a.name) < std::stod(b.name); });
    report.score = report.cases.empty() ? 0 : total / (double)report.cases.size();
    return report;
}

std::vector<NiahPrompt> make_niah_prompts(const TextCodec& codec, const NiahRunConfig& config,
                                          const NiahProgress& progress) {
    if (config.tasks.empty() || config.lengths.empty() || config.n_depths == 0 || config.samples == 0)
        fail("niah: nothing to run (no tasks, lengths, depths or samples)");
    auto encode_prompt = [&](const std::string& prompt, const std::string& prefix) {
        return codec.encode_prompt ? codec.encode_prompt(prompt, prefix) : codec.encode(prompt + prefix);
    };
    // A chat template adds a fixed number of tokens around the text; keep them out of the
    // haystack's share so the whole prompt still fits.
    const std::string probe = "Some text.";
    const int64_t overhead = (int64_t)encode_prompt(probe, "").size() - (int64_t)codec.encode(probe).size();
    const uint32_t reserve = config.greedy.max_tokens + (uint32_t)std::max<int64_t>(0, overhead);
    for (uint32_t length : config.lengths)
        if (length <= reserve)
            fail("niah: length " + std::to_string(length) + " leaves no room for the prompt after " +
                 std::to_string(reserve) + " reserved tokens (answer and chat template)");
    const TokenCounter count = [&](const std::string& text) { return codec.encode(text).size(); };
    const size_t total = config.tasks.size() * config.lengths.size() * config.n_depths * config.samples;
    std::vector<NiahPrompt> prompts;
    prompts.reserve(total);
    for (NiahTask task : config.tasks)
        for (uint32_t length : config.lengths)
            for (double depth : niah_depths(config.n_depths))
                for (uint32_t s = 0; s < config.samples; ++s) {
                    // Samples differ by seed; make_niah_sample mixes task and length in too.
                    const NiahSample sample = make_niah_sample({task, length - reserve, depth, config.seed + s}, count);
                    NiahPrompt p;
                    p.task = task;
                    p.length = length;
                    p.depth = depth;
                    p.sample = s;
                    p.tokens = encode_prompt(sample.prompt, sample.answer_prefix);
                    p.expected = sample.expected;
                    prompts.push_back(std::move(p));
                    if (progress) progress(prompts.size(), total);
                }
    return prompts;
}

NiahReport run_niah_prompts(LogitsBackend& backend, const TextCodec& codec, const std::vector<NiahPrompt>& prompts,
                            const GreedyOptions& greedy, const NiahProgress& progress) {
    for (const NiahPrompt& p : prompts)
        if (p.tokens.size() >= backend.n_ctx() || p.length > backend.n_ctx())
            fail("niah: length " + std::to_string(p.length) + " exceeds the backend's context of " +
                 std::to_string(backend.n_ctx()));
    std::vector<NiahCase> cases;
    cases.reserve(prompts.size());
    for (const NiahPrompt& p : prompts) {
        const GreedyAnswer answer = generate_greedy(backend, codec, p.tokens, greedy);
        NiahCase c;
        c.task = p.task;
        c.length = p.length;
        c.depth = p.depth;
        c.sample = p.sample;
        c.prompt_tokens = (uint32_t)p.tokens.size();
        c.expected = p.expected;
        c.answer = answer.text;
        c.score = niah_score(answer.text, p.expected);
        c.generated_tokens = (uint32_t)answer.tokens.size();
        c.prefill_s = answer.prefill_s;
        c.decode_s = answer.decode_s;
        c.decode_steps = answer.decode_steps;
        cases.push_back(std::move(c));
        if (progress) progress(cases.size(), prompts.size());
    }
    return aggregate_niah(std::move(cases));
}

NiahReport run_niah(LogitsBackend& backend, const TextCodec& codec, const NiahRunConfig& config,
                    const NiahProgress& progress) {
    for (uint32_t length : config.lengths)
        if (length > backend.n_ctx())
            fail("niah: length " + std::to_string(length) + " exceeds the backend's context of " +
                 std::to_string(backend.n_ctx()));
    return run_niah_prompts(backend, codec, make_niah_prompts(codec, config), config.greedy, progress);
}

std::string format_niah_table(const NiahReport& report) {
    std::string out;
    char cell[64];
    auto score_of = [](const std::vector<NiahGroup>& groups, const std::string& name) -> std::string {
        for (const NiahGroup& g : groups)
            if (g.name == name) {
                char buf[32];
                std::snprintf(buf, sizeof buf, "%8.1f", g.score);
                return buf;
            }
        return "       -";
    };
    // RULER's layout: a row per task, a column per context length, then the means.
    out += "task              ";
    for (const NiahGroup& l : report.by_length) {
        std::snprintf(cell, sizeof cell, "%8s", l.name.c_str());
        out += cell;
    }
    out += "     all  cases\n";
    for (const NiahGroup& t : report.by_task) {
        std::snprintf(cell, sizeof cell, "  %-16s", t.name.c_str());
        out += cell;
        for (const NiahGroup& l : report.by_length) out += score_of(report.by_task_length, t.name + "@" + l.name);
        std::snprintf(cell, sizeof cell, "%8.1f %6u\n", t.score, t.cases);
        out += cell;
    }
    out += "  all             ";
    for (const NiahGroup& l : report.by_length) out += score_of(report.by_length, l.name);
    std::snprintf(cell, sizeof cell, "%8.1f %6zu\n", report.score, report.cases.size());
    out += cell;
    out += "depth                 niah  cases\n";
    for (const NiahGroup& g : report.by_depth) {
        std::snprintf(cell, sizeof cell, "  %-16s %7.1f %6u\n", g.name.c_str(), g.score, g.cases);
        out += cell;
    }
    char line[160];
    std::snprintf(line, sizeof line, "speed: prefill %.1f tok/s (%llu tokens), decode %.1f tok/s (%llu steps)\n",
                  report.prefill_tok_s(), (unsigned long long)report.prefill_tokens, report.decode_tok_s(),
                  (unsigned long long)report.decode_steps);
    out += line;
    return out;
}

nlohmann::json niah_report_json(const NiahReport& report, bool with_cases) {
    auto groups = [](const std::vector<NiahGroup>& gs) {
        nlohmann::json a = nlohmann::json::array();
        for (const NiahGroup& g : gs) a.push_back({{"name", g.name}, {"score", g.score}, {"cases", g.cases}});
        return a;
    };
    nlohmann::json j = {{"score", report.score},
                        {"cases", report.cases.size()},
                        {"by_task", groups(report.by_task)},
                        {"by_length", groups(report.by_length)},
                        {"by_depth", groups(report.by_depth)},
                        {"by_task_length", groups(report.by_task_length)},
                        {"prefill_tokens", report.prefill_tokens},
                        {"prefill_s", report.prefill_s},
                        {"prefill_tok_s", report.prefill_tok_s()},
                        {"decode_steps", report.decode_steps},
                        {"decode_s", report.decode_s},
                        {"decode_tok_s", report.decode_tok_s()}};
    if (with_cases) {
        nlohmann::json a = nlohmann::json::array();
        for (const NiahCase& c : report.cases)
            a.push_back({{"task", niah_task_name(c.task)}, {"length", c.length}, {"depth", c.depth},
                         {"sample", c.sample}, {"prompt_tokens", c.prompt_tokens}, {"expected", c.expected},
                         {"answer", c.answer}, {"score", c.score}, {"generated_tokens", c.generated_tokens}});
        j["case_list"] = a;
    }
    return j;
}

}  // namespace spillway
