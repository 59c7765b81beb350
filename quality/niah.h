#pragma once
// RULER-style needle-in-a-haystack tasks: generation and scoring. The spec's quality rule is
// "RULER niah or logit equivalence, never a single greedy needle", so every task here is a
// family of prompts (needles at evenly spaced depths, several context lengths, fixed seeds).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace spillway {

// The eight niah tasks of RULER's synthetic suite.
enum class NiahTask {
    single_1,    // noise haystack, word key, number value
    single_2,    // essay haystack, word key, number value
    single_3,    // essay haystack, word key, UUID value
    multikey_1,  // essay haystack, 4 keys (3 distractors), number values
    multikey_2,  // haystack made of needles, word keys, number values
    multikey_3,  // haystack made of needles, UUID keys and values
    multivalue,  // essay haystack, one key holding 4 values
    multiquery,  // essay haystack, 4 keys all asked for
};
const char* niah_task_name(NiahTask task);
std::optional<NiahTask> niah_task_from_name(const std::string& name);
std::vector<NiahTask> all_niah_tasks();

// Counts tokens of a text with the model's own tokenizer, so target lengths are in the
// model's tokens (a character count would be off by 3-4x between vocabularies).
using TokenCounter = std::function<size_t(const std::string&)>;

struct NiahSample {
    NiahTask task = NiahTask::single_1;
    uint32_t target_tokens = 0;       // requested prompt length
    uint32_t prompt_tokens = 0;       // achieved prompt length (<= target)
    double depth = 0.0;               // where the (first) needle sits, 0 = start, 1 = end
    std::string prompt;               // instruction + haystack + question
    std::string answer_prefix;        // appended after the prompt (RULER style)
    std::vector<std::string> expected;  // every value the answer must contain
};

struct NiahRequest {
    NiahTask task = NiahTask::single_1;
    uint32_t target_tokens = 4096;
    double depth = 0.5;
    uint64_t seed = 0;
};

// Deterministic in (task, target_tokens, depth, seed). Throws spillway::Error when the
// target is too small to hold the instruction, the needles and the question.
NiahSample make_niah_sample(const NiahRequest& request, const TokenCounter& count_tokens);

// n depths evenly spaced over [0, 1] (n == 1 gives 0.5).
std::vector<double> niah_depths(uint32_t n);

// RULER's string-match-all: mean over expected values of case-insensitive substring
// presence in the answer, times 100.
double niah_score(const std::string& answer, const std::vector<std::string>& expected);

// The essay-style haystack: prose generated from our own sentence grammar (deterministic in
// seed), so it can be shipped. Returns at least `min_chars` characters of whole sentences.
std::string essay_haystack(uint64_t seed, size_t min_chars);

// The words word keys ("adjective-noun") are drawn from, in list order. For tools that must
// make every key word one token of a vocabulary (tools/niah-train-data).
std::vector<std::string> niah_key_adjectives();
std::vector<std::string> niah_key_nouns();

}  // namespace spillway
