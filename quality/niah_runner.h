#pragma once
// Runs RULER-style niah (quality/niah.h) against a LogitsBackend: for every task, context
// length, depth and sample it builds the prompt in the model's own tokens, prefills it,
// generates the answer greedily after RULER's answer prefix and scores it with RULER's
// string-match-all. Reports per task, per depth and per context length.
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "quality/logits_backend.h"
#include "quality/niah.h"

namespace spillway {

// The model's tokenizer as the runner needs it (a test can supply a byte-level fake).
struct TextCodec {
    std::function<std::vector<int32_t>(const std::string&)> encode;  // a whole prompt (BOS as the vocab says)
    std::function<std::string(const std::vector<int32_t>&)> decode;  // generated ids -> text
    std::function<bool(int32_t)> is_end;                             // EOS / end of turn
    // Optional: the ids of prompt + answer prefix for a chat model (the user turn holds the
    // prompt, the assistant turn starts with the answer prefix, as RULER does for chat
    // models). Unset: encode(prompt + answer_prefix), base-model style.
    std::function<std::vector<int32_t>(const std::string& prompt, const std::string& answer_prefix)> encode_prompt;
};

struct GreedyOptions {
    uint32_t max_tokens = 64;     // RULER gives niah answers 128 tokens; 4 values fit in ~64
    bool stop_at_newline = true;  // once the answer has begun, a newline ends it
};

struct GreedyAnswer {
    std::vector<int32_t> tokens;  // generated ids, without the stop token
    std::string text;
    double prefill_s = 0;
    double decode_s = 0;          // time of the forward passes of generated tokens
    uint32_t decode_steps = 0;    // forward passes timed in decode_s
};

// Resets the backend, prefills `prompt` and generates greedily (argmax) until an end token,
// a newline after some answer text, max_tokens, or the end of the context.
GreedyAnswer generate_greedy(LogitsBackend& backend, const TextCodec& codec, const std::vector<int32_t>& prompt,
                             const GreedyOptions& options);

struct NiahRunConfig {
    std::vector<NiahTask> tasks = all_niah_tasks();
    std::vector<uint32_t> lengths = {4096, 8192};  // context lengths in tokens (prompt + answer)
    uint32_t n_depths = 5;
    uint32_t samples = 1;        // per (task, length, depth)
    uint64_t seed = 42;
    GreedyOptions greedy;
};

struct NiahCase {
    NiahTask task = NiahTask::single_1;
    uint32_t length = 0;         // context length of the cell
    double depth = 0;
    uint32_t sample = 0;
    uint32_t prompt_tokens = 0;  // actual prompt + answer prefix tokens
    std::vector<std::string> expected;
    std::string answer;
    double score = 0;            // 0..100
    uint32_t generated_tokens = 0;
    double prefill_s = 0, decode_s = 0;
    uint32_t decode_steps = 0;
};

struct NiahGroup {
    std::string name;            // "niah_single_1", "4096", "0.25"
    double score = 0;            // mean over the group's cases
    uint32_t cases = 0;
};

struct NiahReport {
    std::vector<NiahCase> cases;
    double score = 0;            // mean over every case
    std::vector<NiahGroup> by_task, by_length, by_depth;  // in the config's order
    std::vector<NiahGroup> by_task_length;                 // RULER's table: "niah_single_1@4096"
    uint64_t prefill_tokens = 0;
    double prefill_s = 0;
    uint64_t decode_steps = 0;
    double decode_s = 0;
    double decode_tok_s() const { return decode_s > 0 ? (double)decode_steps / decode_s : 0; }
    double prefill_tok_s() const { return prefill_s > 0 ? (double)prefill_tokens / prefill_s : 0; }
};

// Groups and means; cases keep their order. Pure (tests call it on hand-made cases).
NiahReport aggregate_niah(std::vector<NiahCase> cases);

// done/total after every case, for a progress bar.
using NiahProgress = std::function<void(size_t done, size_t total)>;

// One case's prompt, ready to run: built once and shared by every tier that runs it
// (building costs a dozen tokenizations of the whole prompt).
struct NiahPrompt {
    NiahTask task = NiahTask::single_1;
    uint32_t length = 0;
    double depth = 0;
    uint32_t sample = 0;
    std::vector<int32_t> tokens;  // prompt + answer prefix
    std::vector<std::string> expected;
};

// Every (task, length, depth, sample) of the config, in that nesting order. The prompt of a
// cell of length L is at most L - greedy.max_tokens tokens, so the answer always has room.
std::vector<NiahPrompt> make_niah_prompts(const TextCodec& codec, const NiahRunConfig& config,
                                          const NiahProgress& progress = {});

// Every prompt must fit the backend's context.
NiahReport run_niah_prompts(LogitsBackend& backend, const TextCodec& codec, const std::vector<NiahPrompt>& prompts,
                            const GreedyOptions& greedy, const NiahProgress& progress = {});

// make_niah_prompts then run_niah_prompts.
NiahReport run_niah(LogitsBackend& backend, const TextCodec& codec, const NiahRunConfig& config,
                    const NiahProgress& progress = {});

std::string format_niah_table(const NiahReport& report);
// Scores, groups and speed; with_cases adds every case (prompt length, expected, answer).
nlohmann::json niah_report_json(const NiahReport& report, bool with_cases);

}  // namespace spillway
