// spillway run: generate text with a GGUF model on the CPU engine. Streams text as it is
// generated (stdout), then reports prefill and decode speed and achieved GB/s (stderr),
// or everything as one JSON object with --json. --logits-out writes every evaluated
// position's logits (docs/logits-format.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "app/args.h"
#include "app/commands.h"
#include "app/env_record.h"
#include "app/plan_args.h"
#include "probe/device_probe.h"
#ifdef SPILLWAY_HAVE_CUDA
#include "engine/cuda/cuda_generate.h"
#endif
#include "common/error.h"
#include "engine/cpu/forward.h"
#include "engine/cpu/sampler.h"
#include "gguf/gguf.h"
#include "model/model_spec.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace spillway {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

KvType parse_kv_type(const std::string& text, const char* flag) {
    auto t = kv_type_from_name(text);
    if (!t) fail(std::string(flag) + ": unknown KV type '" + text + "' (expected f16, q8_0 or q4_0)");
    return *t;
}

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read prompt file '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Writes the logits file: one JSON header line, then per evaluated position an int32
// token id, an int32 position and n_vocab little-endian f32 logits.
class LogitsWriter {
public:
    LogitsWriter(const std::string& path, const std::string& model_path, uint32_t n_vocab) : n_vocab_(n_vocab) {
        out_.open(path, std::ios::binary | std::ios::trunc);
        if (!out_) fail("--logits-out: cannot create '" + path + "'");
        nlohmann::json header = {{"format", "spillway-logits"}, {"version", 1}, {"n_vocab", n_vocab},
                                 {"dtype", "f32"}, {"endian", "little"},
                                 {"record", "int32 token, int32 position, f32 logits[n_vocab]"},
                                 {"model", model_path}};
        out_ << header.dump() << '\n';
    }
    void write(int32_t token, int32_t position, const float* logits) {
        // The engine's hosts are little-endian (x86-64, aarch64); the format says so.
        out_.write(reinterpret_cast<const char*>(&token), 4);
        out_.write(reinterpret_cast<const char*>(&position), 4);
        out_.write(reinterpret_cast<const char*>(logits), (std::streamsize)n_vocab_ * 4);
        if (!out_) fail("--logits-out: write failed");
    }

private:
    std::ofstream out_;
    uint32_t n_vocab_;
};

}  // namespace

int cmd_run(int argc, char** argv) {
    ArgParser args("run", "generate text with a GGUF model");
    args.option({"-m", "--model"}, "FILE", "GGUF model file");
    args.option({"-p", "--prompt"}, "TEXT", "prompt text");
    args.option({"-f", "--file"}, "FILE", "read the prompt from a file");
    args.option({"-n", "--n-predict"}, "N", "tokens to generate; -1: until the end of generation or a full context",
                "128");
    args.option({"-c", "--ctx-size"}, "N", "context size in tokens (prompt + generated)", "4096, at most the training context");
    args.option({"-b", "--batch-size"}, "N", "prefill chunk size",
                "512; with --device cuda 4096 for prompts over 4096 tokens (2048 where the FFN does not run "
                "through the Hopper SwiGLU GEMM)");
    args.option({"-ctk", "--cache-type-k"}, "T", "K cache type: f16, q8_0, q4_0", "f16");
    args.option({"-ctv", "--cache-type-v"}, "T", "V cache type: f16, q8_0, q4_0", "f16");
    args.option({"-s", "--seed"}, "S", "sampling seed", "random");
    args.option({"--temp"}, "T", "temperature; 0 = greedy", "0.8");
    args.option({"--top-k"}, "N", "top-k; 0 = off", "40");
    args.option({"--top-p"}, "P", "top-p; 1 = off", "0.95");
    args.option({"--min-p"}, "P", "min-p; 0 = off", "0.05");
    args.option({"--repeat-penalty"}, "X", "repetition penalty; 1 = off", "1.0");
    args.option({"--repeat-last-n"}, "N", "tokens the repetition penalty looks back over", "64");
    args.option({"-t", "--threads"}, "N", "CPU threads", "all cores");
    args.option({"--device"}, "DEV", "cpu or cuda", "cpu");
    args.option({"--resident-cells"}, "N", "cuda: KV cells kept in VRAM, the rest streamed from pinned host RAM", "all");
    args.flag({"--chat"}, "format the prompt with the model's chat template");
    args.option({"-sys", "--system-prompt"}, "TEXT", "system prompt for --chat");
    args.flag({"--json"}, "print one JSON object (token ids, text, timings) instead of streaming");
    args.option({"--logits-out"}, "FILE", "write every evaluated position's logits (docs/logits-format.md)");
    add_plan_options(args, false);
    args.epilog(R"(--device cuda plans the KV cache for this GPU: the budget is free VRAM (capped by
--vram-target) minus the weights and a compute reserve. A cache larger than the budget keeps
its oldest cells in VRAM and streams the rest (the tail) from pinned host RAM every step.
With --kv-auto-tier (or SPILLWAY_KV_AUTO_TIER=1) the T*-aware walk picks the KV types from
this machine's measured bandwidths (spillway probe) and logs its reasoning at WARN; without
it nothing is measured and nothing extra is printed. The planner knobs apply to --device cuda.

example: spillway run -m tiny.gguf -p "Once upon a time" -n 64 --temp 0)");
    args.parse(argc, argv);
    if (args.help_requested()) {
        std::printf("%s", args.help().c_str());
        return 0;
    }

    const std::string device = args.get_or("--device", "cpu");
    if (device == "cuda") {
        warn_timing_bounds(spillway_env_settings(), "run");  // the CPU engine reads no lab knob
#ifndef SPILLWAY_HAVE_CUDA
        fail("--device cuda: this build has no CUDA engine (configure with -DSPILLWAY_CUDA=ON on a machine with nvcc)");
#endif
    } else if (device != "cpu") {
        fail("--device: unknown device '" + device + "' (expected cpu or cuda)");
    }
    const auto model_path = args.get("--model");
    if (!model_path) fail("-m FILE is required");
    if (args.has("--prompt") == args.has("--file")) fail("give exactly one of -p TEXT or -f FILE");
    const std::string text = args.has("--prompt") ? *args.get("--prompt") : read_text_file(*args.get("--file"));
    if (text.empty()) fail("the prompt is empty");
    if (args.has("--system-prompt") && !args.has("--chat")) fail("-sys needs --chat");
    KvType k_type = parse_kv_type(args.get_or("--cache-type-k", "f16"), "-ctk");
    KvType v_type = parse_kv_type(args.get_or("--cache-type-v", "f16"), "-ctv");
    const PlanKnobs knobs = resolve_plan_knobs(knob_flags_from(args), process_env());
    if (device == "cpu")
        for (const char* gpu_only : {"--kv-auto-tier", "--vram-target", "--tstar-drop", "--max-spill-mib", "--drop-model",
                                     "--host-ram-gbps", "--pcie-gbps", "--vram-bw-gbps", "--c-engage-ms", "--vram-free-mib",
                                     "--compute-reserve-mib"})
            if (args.has(gpu_only)) fail(std::string(gpu_only) + " plans the GPU's KV cache: it needs --device cuda");
    const int64_t n_predict = args.get_int("--n-predict", -1, 1 << 24).value_or(128);  // -1: no limit but the context
    const int64_t batch = args.get_int("--batch-size", 1, 1 << 16).value_or(512);
    const unsigned threads =
        (unsigned)args.get_int("--threads", 1, 1024).value_or(std::max(1u, std::thread::hardware_concurrency()));
    SamplerConfig sampling;
    sampling.temperature = (float)args.get_double("--temp").value_or(0.8);
    sampling.top_k = (int32_t)args.get_int("--top-k", 0, 1 << 30).value_or(40);
    sampling.top_p = (float)args.get_double("--top-p").value_or(0.95);
    sampling.min_p = (float)args.get_double("--min-p").value_or(0.05);
    sampling.repeat_penalty = (float)args.get_double("--repeat-penalty").value_or(1.0);
    sampling.repeat_last_n = (uint32_t)args.get_int("--repeat-last-n", 0, 1 << 30).value_or(64);
    sampling.seed = args.has("--seed") ? (uint64_t)*args.get_int("--seed", 0, INT64_MAX) : std::random_device{}();
    const bool json = args.has("--json");

    std::shared_ptr<const GgufFile> file = GgufFile::open(*model_path);
    const ModelSpec spec = model_spec_from_gguf(file->header());
    const CpuModel model = load_cpu_model(file, spec);
    const Tokenizer tokenizer(file->header());

    std::vector<int32_t> prompt;
    if (args.has("--chat")) {
        const ChatTemplate tmpl = chat_template_from_string(tokenizer.vocab().chat_template);
        ChatOptions options;
        options.system_prompt = args.get("--system-prompt");
        prompt = tokenizer.encode(format_chat(tmpl, {{"user", text}}, options), {.add_special = true, .parse_special = true});
    } else {
        prompt = tokenizer.encode(text);
    }
    if (prompt.empty()) fail("the prompt is empty after tokenization");

    const int64_t ctx_default = std::min<int64_t>(4096, spec.n_ctx_train ? spec.n_ctx_train : 4096);
    const uint32_t n_ctx = (uint32_t)args.get_int("--ctx-size", 1, 1 << 26).value_or(std::max<int64_t>(ctx_default, 1));
    if (prompt.size() >= n_ctx)
        fail("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " +
             std::to_string(n_ctx) + " (raise -c, or shorten the prompt)");
    const int64_t room = n_ctx - (int64_t)prompt.size();
    const uint32_t n_generate = (uint32_t)(n_predict < 0 ? room : std::min<int64_t>(n_predict, room));

#ifdef SPILLWAY_HAVE_CUDA
    // The GPU's KV cache: the requested types (switch off) or the auto-tier's choice, and
    // the window of cells that stay in VRAM. With the switch off nothing is measured and
    // nothing is printed unless the cache has to spill.
    uint64_t resident_cells = n_ctx;
    std::optional<KvPlan> kv_plan;
    if (device == "cuda") {
        if (!cuda_device_available()) fail("--device cuda: no usable CUDA GPU on this machine");
        const PlanSource source = plan_source_from(args);
        const BudgetInputs budget = budget_inputs_from(args, spec, source.values, knobs);
        kv_plan = plan_from_source(spec, n_ctx, budget, knobs, source);
        k_type = kv_plan->tier.k;
        v_type = kv_plan->tier.v;
        resident_cells = kv_plan->window.resident_cells;
        if (resident_cells == 0)
            fail("the KV budget holds no cell of the cache (" + describe_budget(kv_plan->budget) +
                 "): raise --vram-target or lower -c");
        if (kv_plan->window.spilled_cells > 0 && !json)
            std::fprintf(stderr, "kv cache: %s, %llu of %u cells in VRAM, %llu cells (%.0f MiB) streamed from pinned host RAM\n",
                         kv_tier_name(kv_plan->tier).c_str(), (unsigned long long)resident_cells, n_ctx,
                         (unsigned long long)kv_plan->window.spilled_cells,
                         (double)kv_plan->window.spilled_bytes / (double)kMiB);
    }
#endif

    std::unique_ptr<LogitsWriter> logits_out;
    if (auto path = args.get("--logits-out")) logits_out = std::make_unique<LogitsWriter>(*path, *model_path, spec.n_vocab);

    StreamDecoder stream(tokenizer);
    std::string generated_text;
    std::vector<int32_t> generated;
    generated.reserve(n_generate);
    // Streams one sampled token's text; false once it ends the generation.
    auto emit = [&](int32_t token) {
        generated.push_back(token);
        if (tokenizer.is_end_of_generation(token)) return false;
        const std::string piece = stream.push(token);
        generated_text += piece;
        if (!json) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
        }
        return true;
    };
    double prefill_s = 0, decode_s = 0;
    uint64_t bytes_read = 0;
    uint32_t n_decoded = 0;  // forward passes of generated tokens
#ifdef SPILLWAY_HAVE_CUDA
    if (device == "cuda") {
        LogitsSink on_logits;
        if (logits_out)
            on_logits = [&](int32_t token, int32_t position, const float* row) { logits_out->write(token, position, row); };
        // Long prompts prefill faster in larger chunks (2048 against 512: 1.4x at 8k, "Run P2-1";
        // 4096 against 2048: +6% at 8k, +4.6% at 64k, session 46, docs/perf-notes.md); the
        // scratch stays inside the planner's compute reserve.
        // 0: the engine's long-prompt chunk for this model (cuda_long_prompt_chunk); generate_cuda
        // caps the chunk at the prompt.
        const uint32_t cuda_batch = args.has("--batch-size") || prompt.size() <= 4096 ? (uint32_t)batch : 0;
        CudaGenerateOptions copt{n_ctx, cuda_batch, k_type, v_type, !json};
        // --resident-cells (tests, experiments) wins over the plan's window.
        copt.resident_cells = (uint32_t)args.get_int("--resident-cells", 1, UINT32_MAX)
                                  .value_or(std::min<uint64_t>(resident_cells, n_ctx));
        CudaGenerateStats stats = generate_cuda(model, prompt, n_generate, sampling, copt, emit, on_logits);
        prefill_s = stats.prefill_s;
        decode_s = stats.decode_s;
        bytes_read = stats.bytes_read;
        n_decoded = stats.n_decoded;
    }
#endif
    if (device == "cpu") {
        // Everything the loops touch is allocated here.
        ThreadPool pool(threads);
        KvCache cache = make_kv_cache(spec, n_ctx, k_type, v_type);
        const uint32_t chunk = (uint32_t)std::min<int64_t>(batch, (int64_t)prompt.size());
        CpuForwardState state = make_forward_state(model, chunk, logits_out != nullptr, threads);
        Sampler sampler = make_sampler(sampling, spec.n_vocab);
        std::vector<int32_t> history = prompt;
        history.reserve(prompt.size() + n_generate + 1);
        const uint32_t V = spec.n_vocab;

        const auto t_prefill = Clock::now();
        for (uint32_t pos = 0; pos < prompt.size(); pos += chunk) {
            const uint32_t n = std::min<uint32_t>(chunk, (uint32_t)prompt.size() - pos);
            forward_cpu(model, cache, state, pool, prompt.data() + pos, n, pos);
            if (logits_out)
                for (uint32_t i = 0; i < n; ++i) logits_out->write(prompt[pos + i], (int32_t)(pos + i), state.logits.data() + (size_t)i * V);
        }
        prefill_s = seconds_since(t_prefill);
        // With all_logits the last token's row is the last of the last chunk.
        auto last_logits = [&](uint32_t n_in_call) {
            return state.logits.data() + (state.all_logits ? (size_t)(n_in_call - 1) * V : 0);
        };
        const uint32_t last_chunk = (uint32_t)(prompt.size() - (prompt.size() - 1) / chunk * chunk);

        const auto t_decode = Clock::now();
        const float* logits = last_logits(last_chunk);
        uint32_t pos = (uint32_t)prompt.size();
        for (uint32_t i = 0; i < n_generate; ++i) {
            const int32_t token = sample_token(sampler, logits, history);
            history.push_back(token);
            const bool stop = !emit(token);
            if (stop || i + 1 == n_generate || pos >= n_ctx) break;
            forward_cpu(model, cache, state, pool, &token, 1, pos);
            bytes_read += decode_bytes_per_token(model, pos + 1, k_type, v_type);
            if (logits_out) logits_out->write(token, (int32_t)pos, state.logits.data());
            logits = last_logits(1);
            ++pos;
        }
        decode_s = seconds_since(t_decode);
        n_decoded = pos - (uint32_t)prompt.size();
    }
    const std::string tail = stream.finish();
    generated_text += tail;
    // Why the generation ended: the model's end token, -n reached, or no room left in -c (which
    // a user who asked for more tokens is told).
    const bool ended = !generated.empty() && tokenizer.is_end_of_generation(generated.back());
    const bool reached_n = !ended && n_predict >= 0 && (int64_t)generated.size() >= n_predict;
    const bool context_full = !ended && !reached_n;
    const char* stop = ended ? "end_of_generation" : reached_n ? "n_predict" : "context_full";

    const double prefill_tps = prefill_s > 0 ? prompt.size() / prefill_s : 0;
    const double decode_tps = decode_s > 0 && n_decoded ? n_decoded / decode_s : 0;
    const double decode_gbps = decode_s > 0 && n_decoded ? bytes_read / decode_s / 1e9 : 0;
    if (json) {
        nlohmann::json out = {
            {"model", *model_path}, {"device", device}, {"threads", threads},
            {"ctk", kv_type_name(k_type)}, {"ctv", kv_type_name(v_type)}, {"n_ctx", n_ctx},
            {"seed", sampling.seed}, {"prompt_tokens", prompt}, {"generated_tokens", generated},
            {"text", generated_text}, {"stop", stop},
            {"timings", {{"prefill_s", prefill_s}, {"prefill_tokens", prompt.size()}, {"prefill_tok_s", prefill_tps},
                         {"decode_s", decode_s}, {"decode_tokens", n_decoded}, {"decode_tok_s", decode_tps},
                         {"decode_gb_s", decode_gbps}}}};
#ifdef SPILLWAY_HAVE_CUDA
        // Only when the plan did something beyond the requested types: the switch-off,
        // fits-in-VRAM output stays what it always was.
        if (kv_plan && (knobs.auto_tier || kv_plan->window.spilled_cells > 0))
            out["kv_plan"] = {{"auto_tier", knobs.auto_tier},
                              {"tier", kv_tier_name(kv_plan->tier)},
                              {"reason", kv_plan->reason},
                              {"resident_cells", kv_plan->window.resident_cells},
                              {"spilled_cells", kv_plan->window.spilled_cells},
                              {"spilled_bytes", kv_plan->window.spilled_bytes},
                              {"probed", kv_plan->probed},
                              {"predicted_tok_s", kv_plan->predicted_tok_s ? nlohmann::json(*kv_plan->predicted_tok_s)
                                                                           : nlohmann::json(nullptr)},
                              {"diagnostics", kv_plan->diagnostics}};
#endif
        std::printf("%s\n", out.dump(1).c_str());
    } else {
        std::printf("%s\n", tail.c_str());
        std::fflush(stdout);  // the text ends before the statistics on a terminal that shows both
        if (context_full)
            std::fprintf(stderr, "stopped after %zu tokens: the context (-c %u) is full\n", generated.size(), n_ctx);
        std::fprintf(stderr,
                     "prefill: %zu tokens in %.3f s (%.1f tok/s)\n"
                     "decode:  %u tokens in %.3f s (%.1f tok/s, %.2f GB/s of weights + KV read)\n",
                     prompt.size(), prefill_s, prefill_tps, n_decoded, decode_s, decode_tps, decode_gbps);
    }
    return 0;
}

}  // namespace spillway
