#pragma once
// Training and eval data for the test model, made by quality/niah.cpp and tokenized by our own
// tokenizer, so that training prompts and `spillway gate --niah` prompts come from one
// distribution. File format (little-endian), read by tools/train-niah/train.py:
//   header  "NIAHTRN1", u32 version (1), u32 n_samples, u32 n_batches, u32 n_vocab, u64 n_tokens
//   index   n_samples x { u64 first token, u32 n_tokens, u32 answer_start, u32 batch,
//                         u16 task, u16 n_expected, f32 depth, u32 target_tokens }
//   tokens  u16 x n_tokens (BOS, prompt, answer prefix, answer, EOS)
// A "batch" is a group of samples of one target length, meant to be trained on together
// with little padding. Loss on the answer: tokens [answer_start, n_tokens).
#include <cstdint>
#include <string>
#include <vector>

#include "quality/niah.h"
#include "tokenizer/tokenizer.h"

namespace spillway::niahtrain {

// What the model is taught to write after RULER's answer prefix: " V1, V2." (the scorer only
// looks for each value, so the plainest list will do), then EOS.
std::string answer_text(const std::vector<std::string>& expected);

struct TaskWeight {
    NiahTask task;
    double weight;
};
// "single_1:3,multikey_2:1" (weight defaults to 1).
std::vector<TaskWeight> parse_task_weights(const std::string& spec);

struct GenConfig {
    std::vector<TaskWeight> tasks;
    uint32_t min_len = 256, max_len = 512;  // prompt target, tokens; uniform per batch
    uint32_t tokens_per_batch = 65536;      // batch size = max(1, this / target)
    uint32_t n_batches = 16;
    uint64_t seed = 1;
    unsigned threads = 1;
};

struct Sample {
    std::vector<uint16_t> tokens;
    uint32_t answer_start = 0;
    uint32_t batch = 0;
    NiahTask task = NiahTask::single_1;
    uint16_t n_expected = 0;
    float depth = 0;
    uint32_t target = 0;
};

// Deterministic in the config (threads change only the speed).
std::vector<Sample> generate_train(const Tokenizer& tok, const GenConfig& config);

// The prompts `spillway gate --niah` builds for these tasks/lengths/depths/seed (same
// reserve for the answer), with the reference answer appended. Also returns the expected
// strings per sample, in order.
std::vector<Sample> generate_eval(const Tokenizer& tok, const std::vector<NiahTask>& tasks,
                                  const std::vector<uint32_t>& lengths, uint32_t n_depths, uint32_t samples,
                                  uint64_t seed, std::vector<std::vector<std::string>>* expected);

void write_samples(const std::string& path, const std::vector<Sample>& samples, uint32_t n_vocab);

}  // namespace spillway::niahtrain
