// spillway gate: the quality gate (issue 7). Three modes:
//   --niah   RULER-style needle-in-a-haystack per KV tier, by task, depth and length
//   --kl     logit metrics of KV tiers against f16-resident on one long text
//   --cells  the spec's T5 table (f16_resident, f16_spill, q8_resident, auto) and its four
//            checks; cells the current engine cannot run are reported as not available.
// Every number printed was measured in this run, except the planner's decision, which is
// labelled as planned.
#include <algorithm>
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
#include "common/error.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/progress.h"
#include "engine/cpu/cpu_model.h"
#include "gguf/gguf.h"
#include "plan/planner.h"
#include "probe/profile.h"
#include "quality/gate_cells.h"
#include "quality/logit_compare.h"
#include "quality/logits_backend.h"
#include "quality/niah.h"
#include "quality/niah_runner.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace spillway {
namespace {

const char* kEpilog = R"(Modes (give one):
  --niah   RULER niah: 8 tasks (or --tasks), needles at --depths evenly spaced depths, prompts
           of --lengths tokens of the model's own tokenizer (answer room reserved), greedy
           answer after RULER's answer prefix, scored by string-match-all (0-100). One run per
           tier of --tiers (default f16/f16).
  --kl     Next-token distributions of each tier of --tiers against --reference (f16/f16) on
           the same text, all positions: mean and max KL(ref || tier) in nats, top-1
           agreement, max and mean |dlogit|, perplexity of the text. Text: -f FILE, or the
           essay haystack of quality/niah.cpp (our own grammar), --kl-tokens tokens of it.
  --cells  The spec's T5 table: f16_resident, f16_spill, q8_resident, auto, with niah, KL vs
           f16_resident, decode tok/s and the four checks. f16_spill and auto need the spill
           engine (issue 6) and are reported as not available; --profile FILE lets the
           planner say which tier auto would choose at -c N.

Decode tok/s is measured over the greedy answer steps of the niah run (one token per step).

examples:
  spillway gate -m tiny.gguf --niah --tasks single_1,multikey_1 --lengths 1024 --depths 3
  spillway gate -m tiny.gguf --kl --tiers f32/f32,q8_0/q8_0,q4_0/q4_0 --kl-tokens 1024 --json
  spillway gate -m model.gguf --cells --lengths 4096 --profile profiles/h200-sxm.json -c 65536)";

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<std::string> split_commas(const std::string& text) {
    std::vector<std::string> out;
    std::string item;
    std::istringstream in(text);
    while (std::getline(in, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

std::vector<GateKv> parse_tiers(const std::string& text) {
    std::vector<GateKv> tiers;
    for (const std::string& t : split_commas(text)) {
        auto kv = parse_gate_kv(t);
        if (!kv) fail("--tiers: unknown KV tier '" + t + "' (K/V with f16, q8_0, q4_0; or f32/f32)");
        tiers.push_back(*kv);
    }
    if (tiers.empty()) fail("--tiers: no tiers given");
    return tiers;
}

// Answers may be any bytes a model produced; JSON output must stay valid UTF-8.
std::string dump_json(const nlohmann::json& j) { return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace); }

struct GateModel {
    CpuModel cpu;
    std::unique_ptr<Tokenizer> tokenizer;
    TextCodec codec;
};

std::unique_ptr<GateModel> load_gate_model(const std::string& path, bool chat) {
    auto m = std::make_unique<GateModel>();
    m->cpu = load_cpu_model_file(path);
    m->tokenizer = std::make_unique<Tokenizer>(m->cpu.file->header());
    const Tokenizer* tok = m->tokenizer.get();
    m->codec.encode = [tok](const std::string& text) { return tok->encode(text); };
    m->codec.decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
    m->codec.is_end = [tok](int32_t id) { return tok->is_end_of_generation(id); };
    if (chat) {
        const ChatTemplate tmpl = chat_template_from_string(tok->vocab().chat_template);
        m->codec.encode_prompt = [tok, tmpl](const std::string& prompt, const std::string& answer_prefix) {
            const std::string text = format_chat(tmpl, {{"user", prompt}}) + answer_prefix;
            return tok->encode(text, {.add_special = true, .parse_special = true});
        };
    }
    return m;
}

struct Runtime {
    std::string device = "cpu";
    uint32_t chunk = 512;
    unsigned threads = 0;
};

// The one place a device is chosen: the CUDA engine plugs in here as another LogitsBackend.
std::unique_ptr<LogitsBackend> open_backend(const Runtime& rt, const GateModel& model, GateKv kv, uint32_t n_ctx) {
    if (rt.device == "cpu") return make_cpu_logits_backend(model.cpu, kv, n_ctx, rt.chunk, rt.threads);
    if (rt.device == "cuda") fail("--device cuda: the CUDA engine is not wired into gate yet; use --device cpu");
    fail("--device: unknown device '" + rt.device + "' (expected cpu or cuda)");
}

NiahRunConfig niah_config_from(const ArgParser& args) {
    NiahRunConfig c;
    if (auto tasks = args.get("--tasks")) {
        c.tasks.clear();
        for (const std::string& name : split_commas(*tasks)) {
            auto t = niah_task_from_name(name);
            if (!t) fail("--tasks: unknown task '" + name + "' (niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery)");
            c.tasks.push_back(*t);
        }
        if (c.tasks.empty()) fail("--tasks: no tasks given");
    }
    if (auto lengths = args.get("--lengths")) {
        c.lengths.clear();
        for (const std::string& l : split_commas(*lengths)) c.lengths.push_back((uint32_t)parse_int_in(l, "--lengths", 64, 1 << 26));
        if (c.lengths.empty()) fail("--lengths: no lengths given");
    }
    c.n_depths = (uint32_t)args.get_int("--depths", 1, 1000).value_or(5);
    c.samples = (uint32_t)args.get_int("--samples", 1, 100000).value_or(1);
    c.seed = (uint64_t)args.get_int("--seed", 0, INT64_MAX).value_or(42);
    c.greedy.max_tokens = (uint32_t)args.get_int("--max-answer-tokens", 1, 4096).value_or(64);
    return c;
}

NiahReport run_niah_with_progress(LogitsBackend& backend, const GateModel& model, const std::vector<NiahPrompt>& prompts,
                                  const NiahRunConfig& config, const std::string& label) {
    ProgressBar bar("niah " + label, prompts.size(), "cases");
    NiahReport r = run_niah_prompts(backend, model.codec, prompts, config.greedy,
                                    [&](size_t done, size_t) { bar.update(done); });
    bar.finish();
    return r;
}

std::vector<NiahPrompt> make_prompts_with_progress(const GateModel& model, const NiahRunConfig& config) {
    // Building is tokenizer-bound (a bisection over the haystack per case).
    const size_t total = config.tasks.size() * config.lengths.size() * config.n_depths * config.samples;
    ProgressBar bar("niah prompts", total, "cases");
    std::vector<NiahPrompt> prompts = make_niah_prompts(model.codec, config, [&](size_t done, size_t) { bar.update(done); });
    bar.finish();
    return prompts;
}

// The text the logit metrics run over, cut to n_tokens (0: all of a file).
std::vector<int32_t> kl_tokens_from(const ArgParser& args, const GateModel& model, uint64_t seed, std::string& source) {
    const uint32_t n_tokens = (uint32_t)args.get_int("--kl-tokens", 2, 1 << 24).value_or(args.has("--file") ? 0 : 2048);
    std::vector<int32_t> tokens;
    if (auto path = args.get("--file")) {
        tokens = model.codec.encode(read_text_file(*path));
        source = "file " + *path;
    } else {
        // ~4 characters per token in English; grow until the essay covers the request.
        size_t chars = (size_t)n_tokens * 4 + 256;
        for (;;) {
            tokens = model.codec.encode(essay_haystack(seed, chars));
            if (tokens.size() >= n_tokens) break;
            chars *= 2;
        }
        source = "essay haystack (quality/niah.cpp grammar, seed " + std::to_string(seed) + ")";
    }
    if (n_tokens && tokens.size() > n_tokens) tokens.resize(n_tokens);
    if (tokens.size() < 2) fail("--kl: the text has fewer than 2 tokens");
    return tokens;
}

nlohmann::json metrics_json(const LogitMetrics& m) {
    return {{"positions", m.positions},           {"mean_kl", m.mean_kl},
            {"max_kl", m.max_kl},                 {"top1_agreement", m.top1_agreement},
            {"max_abs_dlogit", m.max_abs_dlogit}, {"mean_abs_dlogit", m.mean_abs_dlogit},
            {"nll_positions", m.nll_positions},   {"ppl_reference", m.ppl_reference},
            {"ppl_candidate", m.ppl_candidate}};
}

std::vector<LogitMetrics> run_kl(const Runtime& rt, const GateModel& model, GateKv reference,
                                 const std::vector<GateKv>& tiers, const std::vector<int32_t>& tokens,
                                 const char* label) {
    const uint32_t n = (uint32_t)tokens.size();
    auto ref = open_backend(rt, model, reference, n);
    std::vector<std::unique_ptr<LogitsBackend>> owned;
    std::vector<LogitsBackend*> candidates;
    for (const GateKv& t : tiers) {
        owned.push_back(open_backend(rt, model, t, n));
        candidates.push_back(owned.back().get());
    }
    ProgressBar bar(label, n, "tokens");
    auto out = compare_logits(*ref, candidates, tokens, rt.chunk, [&](uint64_t done, uint64_t) { bar.update(done); });
    bar.finish();
    return out;
}

int gate_niah(const ArgParser& args, const Runtime& rt, const GateModel& model, const std::string& model_path, bool json) {
    const NiahRunConfig config = niah_config_from(args);
    const std::vector<GateKv> tiers = parse_tiers(args.get_or("--tiers", "f16/f16"));
    const uint32_t n_ctx = *std::max_element(config.lengths.begin(), config.lengths.end());
    const std::vector<NiahPrompt> prompts = make_prompts_with_progress(model, config);
    nlohmann::json out = {{"mode", "niah"}, {"model", model_path}, {"device", rt.device}, {"seed", config.seed},
                          {"depths", niah_depths(config.n_depths)}, {"samples", config.samples},
                          {"lengths", config.lengths}, {"max_answer_tokens", config.greedy.max_tokens}};
    out["tiers"] = nlohmann::json::array();
    for (const GateKv& kv : tiers) {
        auto backend = open_backend(rt, model, kv, n_ctx);
        const NiahReport r = run_niah_with_progress(*backend, model, prompts, config, gate_kv_name(kv));
        if (json) {
            out["tiers"].push_back({{"tier", gate_kv_name(kv)}, {"niah", niah_report_json(r, args.has("--cases"))}});
        } else {
            std::printf("== niah, %s, %s\n%s", backend->describe().c_str(), model_path.c_str(), format_niah_table(r).c_str());
            if (args.has("--cases"))
                for (const NiahCase& c : r.cases)
                    std::printf("  %s len %u depth %.2f #%u: %.0f  answer \"%s\"\n", niah_task_name(c.task), c.length,
                                c.depth, c.sample, c.score, c.answer.c_str());
            std::printf("\n");
        }
    }
    if (json) std::printf("%s\n", dump_json(out).c_str());
    return 0;
}

int gate_kl(const ArgParser& args, const Runtime& rt, const GateModel& model, const std::string& model_path, bool json) {
    const auto reference = parse_gate_kv(args.get_or("--reference", "f16/f16"));
    if (!reference) fail("--reference: unknown KV tier '" + args.get_or("--reference", "") + "'");
    const std::vector<GateKv> tiers = parse_tiers(args.get_or("--tiers", "f32/f32,q8_0/q8_0,q8_0/q4_0,q4_0/q4_0"));
    std::string source;
    const uint64_t seed = (uint64_t)args.get_int("--seed", 0, INT64_MAX).value_or(42);
    const std::vector<int32_t> tokens = kl_tokens_from(args, model, seed, source);
    const std::vector<LogitMetrics> metrics = run_kl(rt, model, *reference, tiers, tokens, "kl");
    if (json) {
        nlohmann::json out = {{"mode", "kl"}, {"model", model_path}, {"device", rt.device},
                              {"reference", gate_kv_name(*reference)}, {"tokens", tokens.size()},
                              {"text", source}, {"n_vocab", model.cpu.spec.n_vocab}};
        out["tiers"] = nlohmann::json::array();
        for (size_t i = 0; i < tiers.size(); ++i) {
            nlohmann::json t = metrics_json(metrics[i]);
            t["tier"] = gate_kv_name(tiers[i]);
            out["tiers"].push_back(t);
        }
        std::printf("%s\n", dump_json(out).c_str());
        return 0;
    }
    std::printf("== logit metrics vs %s, %s (%s), %zu tokens of %s\n", gate_kv_name(*reference).c_str(),
                model_path.c_str(), rt.device.c_str(), tokens.size(), source.c_str());
    std::printf("%-10s %12s %12s %8s %12s %12s %10s %10s\n", "tier", "mean KL", "max KL", "top-1", "max |dlogit|",
                "mean |dlogit|", "ppl ref", "ppl tier");
    for (size_t i = 0; i < tiers.size(); ++i) {
        const LogitMetrics& m = metrics[i];
        std::printf("%-10s %12.4g %12.4g %7.2f%% %12.4g %12.4g %10.3f %10.3f\n", gate_kv_name(tiers[i]).c_str(), m.mean_kl,
                    m.max_kl, 100 * m.top1_agreement, m.max_abs_dlogit, m.mean_abs_dlogit, m.ppl_reference, m.ppl_candidate);
    }
    std::printf("KL in nats, KL(reference || tier) of the next-token distribution, mean over %llu positions\n",
                (unsigned long long)(metrics.empty() ? 0 : metrics[0].positions));
    return 0;
}

// What auto would choose: the planner with the profile's terms, the switch on.
std::optional<AutoDecision> plan_auto_decision(const ArgParser& args, const GateModel& model, uint64_t n_ctx,
                                               std::vector<std::string>& diagnostics) {
    auto profile = args.get("--profile");
    if (!profile) return std::nullopt;
    KnobFlags flags;
    flags.kv_auto_tier = "1";
    flags.tstar_drop = args.get("--tstar-drop");
    flags.max_spill_mib = args.get("--max-spill-mib");
    flags.vram_target_mib = args.get("--vram-target");
    PlanKnobs knobs = resolve_plan_knobs(flags, process_env());
    ProbeValues values = load_probe_profile(*profile);
    BudgetInputs budget;
    std::optional<double> free_mib = values.vram_free_mib ? values.vram_free_mib : values.vram_total_mib;
    if (free_mib) budget.vram_free_bytes = (uint64_t)(*free_mib * (double)kMiB);
    else if (knobs.vram_target_mib) budget.vram_free_bytes = *knobs.vram_target_mib * kMiB;
    else fail("--profile " + *profile + " has no VRAM size; add --vram-target MiB");
    if (knobs.vram_target_mib) budget.vram_target_bytes = *knobs.vram_target_mib * kMiB;
    budget.weight_bytes = model.cpu.spec.weight_bytes_total;
    budget.compute_reserve_bytes = default_compute_reserve_bytes(model.cpu.spec);
    FixedProbeSource probe(values);
    KvPlan plan;
    {
        ScopedLogCapture quiet;  // the WARN lines are kept in plan.diagnostics and shown below
        plan = plan_kv(model.cpu.spec, n_ctx, budget, knobs, probe);
    }
    diagnostics = plan.diagnostics;
    AutoDecision d;
    d.tier = kv_tier_name(plan.tier);
    d.reason = plan.reason;
    d.source = "profile " + *profile + ", ctx " + std::to_string(n_ctx);
    for (const LadderRow& row : plan.ladder)
        if (row.tier == KvTier{KvType::f16, KvType::f16}) d.f16_spills = row.window.spilled_bytes > 0;
    return d;
}

int gate_cells(const ArgParser& args, const Runtime& rt, const GateModel& model, const std::string& model_path, bool json) {
    NiahRunConfig config = niah_config_from(args);
    if (!args.has("--lengths")) config.lengths = {4096};
    const uint32_t n_ctx = *std::max_element(config.lengths.begin(), config.lengths.end());
    const uint64_t plan_ctx = (uint64_t)args.get_int("--ctx-size", 1, int64_t(1) << 31).value_or(n_ctx);
    GateThresholds thresholds;
    thresholds.niah_tolerance = args.get_double("--niah-tolerance").value_or(0.0);
    std::vector<std::string> diagnostics;
    const std::optional<AutoDecision> decision = plan_auto_decision(args, model, plan_ctx, diagnostics);
    KnobFlags drop_flag;
    drop_flag.tstar_drop = args.get("--tstar-drop");
    thresholds.tstar_drop = resolve_plan_knobs(drop_flag, process_env()).tstar_drop;

    const GateKv f16{{KvType::f16, KvType::f16}, false};
    const GateKv q8{{KvType::q8_0, KvType::q8_0}, false};
    const char* kNeedsSpill = "needs the spill engine (issue 6)";

    // Resident cells: niah (and decode tok/s from its answers) per tier, then KL of q8 vs f16.
    const std::vector<NiahPrompt> prompts = make_prompts_with_progress(model, config);
    auto run_resident = [&](GateCell cell, GateKv kv) {
        CellResult r;
        r.cell = cell;
        r.kv_tier = gate_kv_name(kv);
        auto backend = open_backend(rt, model, kv, n_ctx);
        const NiahReport report = run_niah_with_progress(*backend, model, prompts, config, gate_kv_name(kv));
        r.niah = report.score;
        if (report.decode_steps) r.decode_tok_s = report.decode_tok_s();
        r.spilled_mib = (double)backend->spilled_bytes() / (double)kMiB;
        return std::pair{r, report};
    };
    auto [f16_cell, f16_report] = run_resident(GateCell::f16_resident, f16);
    f16_cell.kl_reference = true;
    auto [q8_cell, q8_report] = run_resident(GateCell::q8_resident, q8);
    std::string kl_source;
    const std::vector<int32_t> kl_tokens = kl_tokens_from(args, model, config.seed, kl_source);
    const LogitMetrics q8_kl = run_kl(rt, model, f16, {q8}, kl_tokens, "kl q8_0 vs f16")[0];
    q8_cell.kl_vs_f16 = q8_kl.mean_kl;
    q8_cell.top1_vs_f16 = q8_kl.top1_agreement;

    CellResult spill_cell, auto_cell;
    spill_cell.cell = GateCell::f16_spill;
    spill_cell.unavailable = kNeedsSpill;
    auto_cell.cell = GateCell::auto_tier;
    auto_cell.unavailable = kNeedsSpill;
    if (decision) {
        auto_cell.chosen_tier = decision->tier;
        auto_cell.chosen_note = "planned, not run";
    }
    const std::vector<CellResult> cells = {f16_cell, spill_cell, q8_cell, auto_cell};
    const std::vector<GateCheck> checks = evaluate_gate_checks(cells, decision, thresholds);

    if (json) {
        nlohmann::json out = gate_cells_json(cells, checks, decision);
        out["mode"] = "cells";
        out["model"] = model_path;
        out["device"] = rt.device;
        out["niah_lengths"] = config.lengths;
        out["planner_ctx"] = plan_ctx;
        out["kl_tokens"] = kl_tokens.size();
        out["kl_text"] = kl_source;
        out["q8_kl"] = metrics_json(q8_kl);
        out["niah"] = {{"f16_resident", niah_report_json(f16_report, false)},
                       {"q8_resident", niah_report_json(q8_report, false)}};
        out["planner_diagnostics"] = diagnostics;
        std::printf("%s\n", dump_json(out).c_str());
        return 0;
    }
    std::printf("== quality gate (spec T5 cells), %s on %s\n", model_path.c_str(), rt.device.c_str());
    std::printf("niah: %zu tasks x lengths", config.tasks.size());
    for (uint32_t l : config.lengths) std::printf(" %u", l);
    std::printf(" x %u depths x %u samples; KL over %zu tokens of %s\n", config.n_depths, config.samples,
                kl_tokens.size(), kl_source.c_str());
    std::printf("decode tok/s: greedy answer steps of the niah run (%llu steps f16, %llu steps q8)\n\n",
                (unsigned long long)f16_report.decode_steps, (unsigned long long)q8_report.decode_steps);
    std::printf("%s\n", format_gate_table(cells).c_str());
    if (decision) {
        std::printf("auto (planned): %s — %s [%s]\n", decision->tier.c_str(), decision->reason.c_str(), decision->source.c_str());
        for (const std::string& line : diagnostics) std::printf("  %s\n", line.c_str());
        std::printf("\n");
    } else {
        std::printf("auto: no planner decision (give --profile FILE and -c N)\n\n");
    }
    std::printf("%s", format_gate_checks(checks).c_str());
    return 0;
}

}  // namespace

int cmd_gate(int argc, char** argv) {
    ArgParser args("gate", "Quality gate: RULER niah, logit metrics of KV tiers, and the spec's four-cell table.");
    args.option({"-m", "--model"}, "FILE", "GGUF model file");
    args.option({"--device"}, "DEV", "cpu or cuda", "cpu");
    args.flag({"--niah"}, "run RULER-style niah");
    args.flag({"--kl"}, "compare KV tiers' logits with the reference on one text");
    args.flag({"--cells"}, "the spec's four-cell table and checks");
    args.option({"--tasks"}, "LIST", "niah tasks, comma-separated (single_1, niah_multikey_2, ...)", "all 8");
    args.option({"--lengths"}, "LIST", "niah context lengths in tokens", "4096,8192 (--cells: 4096)");
    args.option({"--depths"}, "N", "needle depths, evenly spaced over [0, 1]", "5");
    args.option({"--samples"}, "N", "samples per (task, length, depth)", "1");
    args.option({"-s", "--seed"}, "S", "seed of the niah samples and the KL essay", "42");
    args.option({"--max-answer-tokens"}, "N", "greedy answer length limit (reserved in each prompt)", "64");
    args.flag({"--cases"}, "list every niah case with its answer");
    args.flag({"--chat"}, "niah prompts in the model's chat template (user turn; the answer prefix opens the reply)");
    args.option({"--tiers"}, "LIST", "KV tiers K/V, comma-separated (f16, q8_0, q4_0; f32/f32 = exact CPU cache)",
                "--niah: f16/f16; --kl: f32/f32,q8_0/q8_0,q8_0/q4_0,q4_0/q4_0");
    args.option({"--reference"}, "KV", "--kl reference tier", "f16/f16");
    args.option({"-f", "--file"}, "FILE", "--kl text file (instead of the generated essay)");
    args.option({"--kl-tokens"}, "N", "tokens of the KL text", "2048 (all of -f FILE)");
    args.option({"--profile"}, "FILE", "--cells: GPU/host profile for the planner's auto decision");
    args.option({"-c", "--ctx-size"}, "N", "--cells: context the planner decides for", "the longest niah length");
    args.option({"--vram-target"}, "MiB", "--cells: VRAM cap for the planner");
    args.option({"--tstar-drop"}, "X", "--cells: target per-token drop", "0.20");
    args.option({"--max-spill-mib"}, "M", "--cells: ceiling on T*", "800");
    args.option({"--niah-tolerance"}, "P", "--cells: q8 niah may be P points below f16", "0");
    args.option({"-b", "--batch-size"}, "N", "prefill chunk size", "512");
    args.option({"-t", "--threads"}, "N", "CPU threads", "all cores");
    args.flag({"--json"}, "print one JSON object");
    args.epilog(kEpilog);
    args.parse(argc, argv);
    if (args.help_requested()) {
        std::fputs(args.help().c_str(), stdout);
        return 0;
    }
    const int modes = (int)args.has("--niah") + (int)args.has("--kl") + (int)args.has("--cells");
    if (modes != 1) fail("give exactly one of --niah, --kl or --cells");
    const auto model_path = args.get("--model");
    if (!model_path) fail("-m FILE is required");
    Runtime rt;
    rt.device = args.get_or("--device", "cpu");
    if (rt.device != "cpu" && rt.device != "cuda") fail("--device: unknown device '" + rt.device + "' (expected cpu or cuda)");
    if (rt.device == "cuda") fail("--device cuda: the CUDA engine is not wired into gate yet; use --device cpu");
    rt.chunk = (uint32_t)args.get_int("--batch-size", 1, 1 << 16).value_or(512);
    rt.threads = (unsigned)args.get_int("--threads", 1, 1024).value_or(std::max(1u, std::thread::hardware_concurrency()));
    const bool json = args.has("--json");

    const std::unique_ptr<GateModel> model = load_gate_model(*model_path, args.has("--chat"));
    if (args.has("--niah")) return gate_niah(args, rt, *model, *model_path, json);
    if (args.has("--kl")) return gate_kl(args, rt, *model, *model_path, json);
    return gate_cells(args, rt, *model, *model_path, json);
}

}  // namespace spillway
