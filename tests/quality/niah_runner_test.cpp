// The niah runner against fake backends over a byte-level codec: an oracle that reads the
// prompt, finds the needles for the asked keys and spells the answer (must score 100), a
// mute one (must score 0), and selective oracles that check per-task and per-depth groups.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "quality/niah_runner.h"

using namespace spillway;

namespace {

constexpr int32_t kBos = 256, kEos = 257;
constexpr uint32_t kVocab = 258;

TextCodec byte_codec() {
    TextCodec c;
    c.encode = [](const std::string& text) {
        std::vector<int32_t> ids{kBos};
        for (unsigned char ch : text) ids.push_back(ch);
        return ids;
    };
    c.decode = [](const std::vector<int32_t>& ids) {
        std::string s;
        for (int32_t id : ids)
            if (id < 256) s += (char)id;
        return s;
    };
    c.is_end = [](int32_t id) { return id == kEos; };
    return c;
}

// Emits, one byte per step, whatever `next_text(history)` says comes next (EOS when empty).
class ScriptBackend : public LogitsBackend {
public:
    using Next = std::function<int32_t(const std::string& history)>;
    explicit ScriptBackend(Next next) : next_(std::move(next)) {}
    uint32_t n_vocab() const override { return kVocab; }
    uint32_t n_ctx() const override { return 1u << 20; }
    uint32_t position() const override { return (uint32_t)history_.size() + bos_; }
    void reset() override {
        history_.clear();
        bos_ = 0;
    }
    const float* eval(const int32_t* tokens, uint32_t n, bool all_logits) override {
        rows_.assign((size_t)(all_logits ? n : 1) * kVocab, 0.0f);
        for (uint32_t i = 0; i < n; ++i) {
            if (tokens[i] == kBos) ++bos_;
            else history_ += (char)tokens[i];
            if (all_logits || i + 1 == n) rows_[(all_logits ? i : 0) * (size_t)kVocab + next_(history_)] = 10.0f;
        }
        ++evals_;
        return rows_.data();
    }
    std::string describe() const override { return "script"; }
    int evals() const { return evals_; }

private:
    Next next_;
    std::string history_;
    uint32_t bos_ = 0;
    std::vector<float> rows_;
    int evals_ = 0;
};

const std::string kMarker = " mentioned in the provided text are";

// The answer a perfect reader gives: every value of every key asked for in the answer prefix.
std::string oracle_answer(const std::string& text, const std::function<bool(size_t needle_at, size_t size)>& can_see) {
    const size_t end = text.rfind(kMarker);
    const size_t start = text.rfind("The special magic ", end);
    if (end == std::string::npos || start == std::string::npos) return "";
    std::string head = text.substr(start + 18, end - start - 18);  // "numbers for k1, k2 and k3"
    const std::string kind = head.substr(0, head.find(' '));
    std::string keys_text = head.substr(head.find(" for ") + 5);
    std::vector<std::string> keys;
    for (size_t p = 0; p < keys_text.size();) {
        size_t comma = keys_text.find(", ", p), and_ = keys_text.find(" and ", p);
        size_t cut = std::min(comma, and_);
        keys.push_back(keys_text.substr(p, cut - p));
        if (cut == std::string::npos) break;
        p = cut + (cut == comma ? 2 : 5);
    }
    std::vector<std::string> values;
    for (const std::string& key : keys) {
        const std::string needle = "One of the special magic " + kind + " for " + key + " is: ";
        for (size_t at = text.find(needle); at != std::string::npos && at < start; at = text.find(needle, at + 1)) {
            if (!can_see(at, start)) continue;
            const size_t v = at + needle.size();
            values.push_back(text.substr(v, text.find('.', v) - v));
        }
    }
    if (values.empty()) return "";
    std::string answer = " ";
    for (size_t i = 0; i < values.size(); ++i) answer += (i ? ", " : "") + values[i];
    return answer + ".\nThat is all.";  // the runner must stop at the newline
}

ScriptBackend::Next oracle(std::function<bool(size_t, size_t)> can_see = [](size_t, size_t) { return true; }) {
    return [can_see](const std::string& history) -> int32_t {
        const size_t end = history.rfind(kMarker);
        if (end == std::string::npos) return 'x';  // still reading the prompt
        const std::string generated = history.substr(end + kMarker.size());
        const std::string answer = oracle_answer(history.substr(0, end + kMarker.size()), can_see);
        if (generated.size() >= answer.size()) return kEos;
        return (unsigned char)answer[generated.size()];
    };
}

NiahRunConfig small_config() {
    NiahRunConfig c;
    c.lengths = {1500, 3000};
    c.n_depths = 5;
    c.samples = 2;
    c.seed = std::random_device{}();
    std::cout << "seed " << c.seed << "\n";
    return c;
}

}  // namespace

TEST(NiahRunner, OracleScoresHundredOnEveryTask) {
    ScriptBackend backend(oracle());
    const NiahRunConfig config = small_config();
    size_t last_done = 0, calls = 0;
    const NiahReport r = run_niah(backend, byte_codec(), config, [&](size_t done, size_t total) {
        EXPECT_EQ(done, last_done + 1);
        EXPECT_EQ(total, 8u * 2 * 5 * 2);
        last_done = done;
        ++calls;
    });
    EXPECT_EQ(calls, 160u);
    ASSERT_EQ(r.cases.size(), 160u);
    for (const NiahCase& c : r.cases) {
        EXPECT_EQ(c.score, 100.0) << niah_task_name(c.task) << " answer \"" << c.answer << "\"";
        EXPECT_EQ(c.answer.find('\n'), std::string::npos);  // cut at the newline
        EXPECT_LE(c.prompt_tokens + config.greedy.max_tokens, c.length);
    }
    EXPECT_EQ(r.score, 100.0);
    ASSERT_EQ(r.by_task.size(), 8u);
    for (const NiahGroup& g : r.by_task) EXPECT_EQ(g.score, 100.0) << g.name;
    ASSERT_EQ(r.by_length.size(), 2u);
    EXPECT_EQ(r.by_length[0].name, "1500");
    EXPECT_EQ(r.by_length[0].cases, 80u);
    ASSERT_EQ(r.by_depth.size(), 5u);
    EXPECT_EQ(r.by_depth[0].name, "0.00");
    EXPECT_EQ(r.by_depth[4].name, "1.00");
    EXPECT_GT(r.decode_steps, 0u);
}

TEST(NiahRunner, ChatWrappedPromptsKeepTheirBudget) {
    TextCodec codec = byte_codec();
    const std::string user = "<|user|>\n", assistant = "<|end|>\n<|assistant|>\n";
    codec.encode_prompt = [codec, user, assistant](const std::string& prompt, const std::string& prefix) {
        return codec.encode(user + prompt + assistant + prefix);
    };
    ScriptBackend backend(oracle());
    NiahRunConfig config = small_config();
    config.lengths = {1200};
    config.n_depths = 2;
    config.samples = 1;
    const std::vector<NiahPrompt> prompts = make_niah_prompts(codec, config);
    ASSERT_EQ(prompts.size(), 8u * 2);
    for (const NiahPrompt& p : prompts) {
        EXPECT_LE(p.tokens.size() + config.greedy.max_tokens, 1200u);
        EXPECT_GE(p.tokens.size() + config.greedy.max_tokens + 150, 1200u);  // within a haystack unit (bytes here)
        EXPECT_EQ(codec.decode(p.tokens).rfind(user, 0), 0u);
    }
    const NiahReport r = run_niah_prompts(backend, codec, prompts, config.greedy);
    EXPECT_EQ(r.score, 100.0);
}

TEST(NiahRunner, MuteBackendScoresZero) {
    ScriptBackend backend([](const std::string&) { return kEos; });
    NiahRunConfig config = small_config();
    config.lengths = {1500};
    const NiahReport r = run_niah(backend, byte_codec(), config);
    EXPECT_EQ(r.cases.size(), 8u * 5 * 2);
    EXPECT_EQ(r.score, 0.0);
    for (const NiahCase& c : r.cases) EXPECT_EQ(c.generated_tokens, 0u);
    EXPECT_EQ(r.decode_steps, 0u);
    EXPECT_EQ(r.decode_tok_s(), 0.0);  // nothing decoded: no speed to report
}

TEST(NiahRunner, PerTaskGroupsSeparateWhatTheModelGetsRight) {
    // Answers only questions about UUIDs: single_3 and multikey_3 ask for UUID values.
    ScriptBackend::Next inner = oracle();
    ScriptBackend backend([inner](const std::string& h) -> int32_t {
        return h.find("special magic uuids") != std::string::npos ? inner(h) : kEos;
    });
    NiahRunConfig config = small_config();
    config.lengths = {1500};
    config.n_depths = 3;
    const NiahReport r = run_niah(backend, byte_codec(), config);
    for (const NiahGroup& g : r.by_task) {
        const bool uuid = g.name == "niah_single_3" || g.name == "niah_multikey_3";
        EXPECT_EQ(g.score, uuid ? 100.0 : 0.0) << g.name;
        EXPECT_EQ(g.cases, 6u);
    }
    EXPECT_NEAR(r.score, 25.0, 1e-9);
    for (const NiahGroup& g : r.by_depth) EXPECT_NEAR(g.score, 25.0, 1e-9) << g.name;
}

TEST(NiahRunner, PerDepthGroupsSeparateWhereTheModelLooks) {
    // Sees only needles in the first 40% of the text: depths 0 and 0.25 are found, the rest lost.
    ScriptBackend backend(oracle([](size_t at, size_t size) { return at < size * 4 / 10; }));
    NiahRunConfig config = small_config();
    config.tasks = {NiahTask::single_1, NiahTask::single_2};
    config.lengths = {3000};
    const NiahReport r = run_niah(backend, byte_codec(), config);
    ASSERT_EQ(r.by_depth.size(), 5u);
    const double expected[5] = {100, 100, 0, 0, 0};
    for (int i = 0; i < 5; ++i) EXPECT_EQ(r.by_depth[i].score, expected[i]) << r.by_depth[i].name;
    EXPECT_NEAR(r.score, 40.0, 1e-9);
}

TEST(NiahRunner, AggregationMeansByGroup) {
    auto c = [](NiahTask t, uint32_t len, double depth, double score) {
        NiahCase x;
        x.task = t;
        x.length = len;
        x.depth = depth;
        x.score = score;
        x.prompt_tokens = 10;
        x.decode_steps = 2;
        x.decode_s = 0.5;
        return x;
    };
    const NiahReport r = aggregate_niah({c(NiahTask::single_1, 4096, 1.0, 100), c(NiahTask::single_1, 8192, 0.0, 50),
                                         c(NiahTask::multiquery, 4096, 0.0, 25), c(NiahTask::multiquery, 8192, 1.0, 0)});
    EXPECT_DOUBLE_EQ(r.score, 43.75);
    ASSERT_EQ(r.by_task.size(), 2u);
    EXPECT_EQ(r.by_task[0].name, "niah_single_1");
    EXPECT_DOUBLE_EQ(r.by_task[0].score, 75.0);
    EXPECT_DOUBLE_EQ(r.by_task[1].score, 12.5);
    ASSERT_EQ(r.by_length.size(), 2u);
    EXPECT_DOUBLE_EQ(r.by_length[0].score, 62.5);  // 4096
    EXPECT_DOUBLE_EQ(r.by_length[1].score, 25.0);  // 8192
    ASSERT_EQ(r.by_depth.size(), 2u);
    EXPECT_EQ(r.by_depth[0].name, "0.00");  // sorted by depth, not first seen
    EXPECT_DOUBLE_EQ(r.by_depth[0].score, 37.5);
    EXPECT_DOUBLE_EQ(r.by_depth[1].score, 50.0);
    EXPECT_EQ(r.decode_steps, 8u);
    EXPECT_DOUBLE_EQ(r.decode_tok_s(), 4.0);
    EXPECT_EQ(r.prefill_tokens, 40u);
    ASSERT_EQ(r.by_task_length.size(), 4u);
    EXPECT_EQ(r.by_task_length[1].name, "niah_single_1@8192");
    EXPECT_DOUBLE_EQ(r.by_task_length[1].score, 50.0);
    const std::string table = format_niah_table(r);
    // Row per task, column per length (4096, 8192), then the task's mean and case count.
    EXPECT_NE(table.find("  niah_single_1      100.0    50.0    75.0      2\n"), std::string::npos) << table;
    EXPECT_NE(table.find("  all                 62.5    25.0    43.8      4\n"), std::string::npos) << table;
}

TEST(GreedyGeneration, StopsAtEndTokenNewlineOrLimit) {
    const TextCodec codec = byte_codec();
    const std::vector<int32_t> prompt = codec.encode("Q:");
    auto spell = [](std::string text) {
        return [text](const std::string& h) -> int32_t {
            const size_t generated = h.size() - 2;  // after "Q:"
            return generated < text.size() ? (unsigned char)text[generated] : kEos;
        };
    };
    {   // End token after "abc": three tokens, each evaluated.
        ScriptBackend b(spell("abc"));
        const GreedyAnswer a = generate_greedy(b, codec, prompt, {});
        EXPECT_EQ(a.text, "abc");
        EXPECT_EQ(a.decode_steps, 3u);
    }
    {   // A leading newline does not stop; the one after text does.
        ScriptBackend b(spell("\n 42\nnext line"));
        const GreedyAnswer a = generate_greedy(b, codec, prompt, {});
        EXPECT_EQ(a.text, "\n 42");
        EXPECT_EQ(a.tokens.size(), 5u);  // the newline token ends it and is not evaluated
    }
    {   // Newline stop off: runs to the limit; the last token is never evaluated.
        ScriptBackend b(spell("12\n345678"));
        GreedyOptions o;
        o.stop_at_newline = false;
        o.max_tokens = 5;
        const GreedyAnswer a = generate_greedy(b, codec, prompt, o);
        EXPECT_EQ(a.text, "12\n34");
        EXPECT_EQ(a.decode_steps, 4u);
        EXPECT_EQ(b.evals(), 1 + 4);  // one prefill call, then one per evaluated token
    }
}
