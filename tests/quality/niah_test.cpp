#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "common/error.h"
#include "quality/niah.h"

using namespace spillway;

namespace {

// Whitespace-separated words stand in for tokens here; the gate uses the model's tokenizer.
size_t count_words(const std::string& text) {
    std::istringstream in(text);
    size_t n = 0;
    std::string w;
    while (in >> w) ++n;
    return n;
}

size_t occurrences(const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
    return n;
}

uint64_t fresh_seed() {
    uint64_t s = std::random_device{}();
    std::cout << "seed " << s << "\n";
    return s;
}

}  // namespace

TEST(Niah, EveryTaskFillsItsTargetAndHidesItsNeedles) {
    const uint64_t seed = fresh_seed();
    for (NiahTask task : all_niah_tasks()) {
        for (uint32_t target : {300u, 2000u, 9000u}) {
            NiahSample s = make_niah_sample({task, target, 0.5, seed}, count_words);
            SCOPED_TRACE(std::string(niah_task_name(task)) + " @" + std::to_string(target));
            EXPECT_LE(s.prompt_tokens, target);
            // Within one haystack unit (a sentence, or RULER's 19-word noise unit) of the target.
            EXPECT_GE(s.prompt_tokens + 40, target);
            EXPECT_EQ(count_words(s.prompt + s.answer_prefix), s.prompt_tokens);
            ASSERT_FALSE(s.expected.empty());
            for (const std::string& v : s.expected) EXPECT_EQ(occurrences(s.prompt, v), 1u) << v;
        }
    }
}

TEST(Niah, ShapesMatchRulerTasks) {
    const uint64_t seed = fresh_seed();
    auto sample = [&](NiahTask t) { return make_niah_sample({t, 3000, 0.3, seed}, count_words); };
    EXPECT_EQ(sample(NiahTask::single_1).expected.size(), 1u);
    EXPECT_EQ(sample(NiahTask::multivalue).expected.size(), 4u);
    EXPECT_EQ(sample(NiahTask::multiquery).expected.size(), 4u);
    // UUID values: 36 characters with dashes at RULER's places.
    std::string uuid = sample(NiahTask::single_3).expected[0];
    ASSERT_EQ(uuid.size(), 36u);
    EXPECT_EQ(uuid[8], '-');
    EXPECT_EQ(uuid[14], '4');
    // multikey_1 hides 4 needles (3 distractor keys), one of them queried.
    NiahSample mk1 = sample(NiahTask::multikey_1);
    EXPECT_EQ(occurrences(mk1.prompt, "One of the special magic numbers for"), 4u);
    // multikey_2's haystack is itself made of needles.
    NiahSample mk2 = sample(NiahTask::multikey_2);
    EXPECT_GT(occurrences(mk2.prompt, "One of the special magic numbers for"), 50u);
    // Noise haystack is the repeated RULER filler; essays are not.
    EXPECT_GT(occurrences(sample(NiahTask::single_1).prompt, "The grass is green."), 20u);
    EXPECT_EQ(occurrences(sample(NiahTask::single_2).prompt, "The grass is green."), 0u);
    // The question names the queried key, and so does the answer prefix.
    NiahSample s2 = sample(NiahTask::single_2);
    std::string key = s2.answer_prefix.substr(s2.answer_prefix.find(" for ") + 5);
    key = key.substr(0, key.find(' '));
    EXPECT_NE(s2.prompt.find("for " + key + " is: " + s2.expected[0]), std::string::npos);
}

TEST(Niah, NeedleSitsAtTheRequestedDepth) {
    const uint64_t seed = fresh_seed();
    for (double depth : niah_depths(5)) {
        NiahSample s = make_niah_sample({NiahTask::single_2, 8000, depth, seed}, count_words);
        size_t body_begin = s.prompt.find('\n') + 1;
        size_t body_end = s.prompt.rfind('\n');
        size_t at = s.prompt.find(s.expected[0]);
        // In tokens (here: words), as the depth is defined; within half a sentence.
        const std::string body = s.prompt.substr(body_begin, body_end - body_begin);
        double measured = (double)count_words(s.prompt.substr(body_begin, at - body_begin)) / (double)count_words(body);
        EXPECT_NEAR(measured, depth, 0.01) << "depth " << depth;
    }
}

TEST(Niah, DeterministicInSeed) {
    const uint64_t seed = fresh_seed();
    NiahRequest r{NiahTask::multiquery, 1500, 0.75, seed};
    EXPECT_EQ(make_niah_sample(r, count_words).prompt, make_niah_sample(r, count_words).prompt);
    NiahRequest other = r;
    other.seed = seed + 1;
    EXPECT_NE(make_niah_sample(r, count_words).expected, make_niah_sample(other, count_words).expected);
}

TEST(Niah, RejectsImpossibleRequests) {
    EXPECT_THROW(make_niah_sample({NiahTask::single_1, 10, 0.5, 1}, count_words), Error);
    EXPECT_THROW(make_niah_sample({NiahTask::single_1, 1000, 1.5, 1}, count_words), Error);
    EXPECT_FALSE(niah_task_from_name("niah_single_9").has_value());
    EXPECT_EQ(niah_task_from_name("multikey_2"), NiahTask::multikey_2);
    EXPECT_EQ(niah_task_from_name("niah_multivalue"), NiahTask::multivalue);
}

TEST(Niah, ScoreIsRulerStringMatchAll) {
    EXPECT_DOUBLE_EQ(niah_score("The numbers are 1234567 and 7654321.", {"1234567", "7654321"}), 100.0);
    EXPECT_DOUBLE_EQ(niah_score("only 1234567", {"1234567", "7654321"}), 50.0);
    EXPECT_DOUBLE_EQ(niah_score("ABCDEF-uuid", {"abcdef-UUID"}), 100.0);
    EXPECT_DOUBLE_EQ(niah_score("nothing here", {"1234567"}), 0.0);
    EXPECT_DOUBLE_EQ(niah_score("anything", {}), 0.0);
}

TEST(Niah, EssayHaystackIsVariedProse) {
    std::string a = essay_haystack(1, 20000), b = essay_haystack(2, 20000);
    EXPECT_GE(a.size(), 20000u);
    EXPECT_NE(a, b);
    EXPECT_NE(a.find("\n\n"), std::string::npos);
    // No sentence dominates: the most frequent first 40 characters of a paragraph are rare.
    EXPECT_LT(occurrences(a, "Most people who start something new"), 60u);
}
