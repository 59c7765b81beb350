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
#include "app/gate_plans.h"
#include "app/gate_synthetic.h"
#include "app/plan_args.h"
#include "common/error.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/progress.h"
#include "engine/cpu/cpu_model.h"
#include "gguf/gguf.h"
#include "plan/planner.h"
#include "probe/device_probe.h"
#include "probe/profile.h"
#include "quality/gate_cells.h"
#include "quality/logit_compare.h"
#include "quality/logits_backend.h"
#ifdef SPILLWAY_HAVE_CUDA
#include "quality/cuda_logits_backend.h"
#endif
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
           f16_resident, decode tok/s and the four checks. The planner sizes the cells for
           -c N (default: the longest niah length) on this GPU (--device cuda) or on
           --profile FILE: f16_spill runs f16/f16 with the window the budget leaves (force a
           spill with --vram-target MiB), auto runs what the T*-aware walk chooses (this
           GPU's probe, or the profile's terms). Spilled cells need --device cuda.

Decode tok/s is measured over the greedy answer steps of the niah run (one token per step).

examples:
  spillway gate -m tiny.gguf --niah --tasks single_1,multikey_1 --lengths 1024 --depths 3
  spillway gate -m tiny.gguf --kl --tiers f32/f32,q8_0/q8_0,q4_0/q4_0 --kl-tokens 1024 --json
  spillway gate -m tests/data/trained/niah-llama.gguf --cells --device cuda --lengths 8192 \
      --vram-target 20 --compute-reserve-mib 0
  spillway gate --synthetic qwen2.5-14b --wtype q8_0 --cells --device cuda -c 65536 --vram-target 27000)";

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

// The one place a device is chosen. resident_cells < n_ctx keeps only that window in VRAM
// and streams the rest from pinned host RAM (the CUDA engine's spill).
std::unique_ptr<LogitsBackend> open_backend(const Runtime& rt, const GateModel& model, GateKv kv, uint32_t n_ctx,
                                            uint32_t resident_cells = UINT32_MAX) {
    if (rt.device == "cpu") {
        if (resident_cells < n_ctx) fail("a spilled KV cache needs the CUDA engine (--device cuda)");
        return make_cpu_logits_backend(model.cpu, kv, n_ctx, rt.chunk, rt.threads);
    }
    if (rt.device == "cuda") {
#ifdef SPILLWAY_HAVE_CUDA
        if (!cuda_device_available()) fail("--device cuda: no usable CUDA GPU on this machine");
        return make_cuda_logits_backend(model.cpu, kv, n_ctx, resident_cells, rt.chunk);
#else
        fail("--device cuda: this build has no CUDA engine (configure with -DSPILLWAY_CUDA=ON on a machine with nvcc)");
#endif
    }
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
std::vector<int32_t> kl_tokens_from(const ArgParser& args, const GateModel& model, uint64_t seed, std::string& source,
                                    uint32_t default_tokens = 2048) {
    const uint32_t n_tokens =
        (uint32_t)args.get_int("--kl-tokens", 2, 1 << 24).value_or(args.has("--file") ? 0 : default_tokens);
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

// A cache the gate runs: a tier and the cells of it kept in VRAM (UINT32_MAX: all).
struct CellCache {
    GateKv kv;
    uint32_t resident_cells = UINT32_MAX;
};

std::vector<LogitMetrics> run_kl(const Runtime& rt, const GateModel& model, GateKv reference,
                                 const std::vector<CellCache>& caches, const std::vector<int32_t>& tokens,
                                 const char* label) {
    const uint32_t n = (uint32_t)tokens.size();
    auto ref = open_backend(rt, model, reference, n);
    std::vector<std::unique_ptr<LogitsBackend>> owned;
    std::vector<LogitsBackend*> candidates;
    for (const CellCache& c : caches) {
        owned.push_back(open_backend(rt, model, c.kv, n, c.resident_cells));
        candidates.push_back(owned.back().get());
    }
    ProgressBar bar(label, n, "tokens");
    auto out = compare_logits(*ref, candidates, tokens, rt.chunk, [&](uint64_t done, uint64_t) { bar.update(done); });
    bar.finish();
    return out;
}

std::vector<LogitMetrics> run_kl(const Runtime& rt, const GateModel& model, GateKv reference,
                                 const std::vector<GateKv>& tiers, const std::vector<int32_t>& tokens,
                                 const char* label) {
    std::vector<CellCache> caches;
    for (const GateKv& t : tiers) caches.push_back({t});
    return run_kl(rt, model, reference, caches, tokens, label);
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

uint32_t resident_cells_of(const KvPlan& plan) {
    return plan.window.spilled_cells == 0 ? UINT32_MAX : (uint32_t)plan.window.resident_cells;
}

int gate_cells(const ArgParser& args, const Runtime& rt, const GateModel& model, const std::string& model_path, bool json) {
    NiahRunConfig config = niah_config_from(args);
    if (!args.has("--lengths")) config.lengths = {4096};
    const uint32_t n_ctx = *std::max_element(config.lengths.begin(), config.lengths.end());
    const uint64_t plan_ctx = (uint64_t)args.get_int("--ctx-size", 1, int64_t(1) << 31).value_or(n_ctx);
    GateThresholds thresholds;
    thresholds.niah_tolerance = args.get_double("--niah-tolerance").value_or(0.0);
    thresholds.tstar_drop = resolve_plan_knobs(knob_flags_from(args), process_env()).tstar_drop;
    const std::optional<GatePlans> plans = plan_gate_cells(args, rt.device == "cpu", model.cpu.spec, plan_ctx);
    std::optional<AutoDecision> decision;
    if (plans) decision = auto_decision_from(*plans);
    const std::vector<std::string> diagnostics = plans ? plans->automatic.diagnostics : std::vector<std::string>{};

    const GateKv f16{{KvType::f16, KvType::f16}, false};
    const GateKv q8{{KvType::q8_0, KvType::q8_0}, false};
    // The cells run on caches of plan_ctx cells, so the planner's window is the window run.
    const uint32_t cache_ctx = (uint32_t)std::max<uint64_t>(plan_ctx, n_ctx);

    // niah (and decode tok/s from its answer steps) of one cache.
    const std::vector<NiahPrompt> prompts = make_prompts_with_progress(model, config);
    auto run_cell = [&](GateCell cell, CellCache cache, const std::string& label) {
        CellResult r;
        r.cell = cell;
        r.kv_tier = gate_kv_name(cache.kv);
        auto backend = open_backend(rt, model, cache.kv, cache_ctx, cache.resident_cells);
        const NiahReport report = run_niah_with_progress(*backend, model, prompts, config, label);
        r.niah = report.score;
        if (report.decode_steps) r.decode_tok_s = report.decode_tok_s();
        r.spilled_mib = (double)backend->spilled_bytes() / (double)kMiB;
        return std::pair{r, report};
    };
    auto [f16_cell, f16_report] = run_cell(GateCell::f16_resident, {f16}, "f16/f16");
    f16_cell.kl_reference = true;
    auto [q8_cell, q8_report] = run_cell(GateCell::q8_resident, {q8}, "q8_0/q8_0");

    // A spilled cell is only meaningful when the prompts reach past the resident window.
    auto why_not_spilled = [&](const KvPlan& plan) -> std::optional<std::string> {
        if (rt.device != "cuda") return std::string("needs --device cuda (the spill is the CUDA engine's)");
        if (plan.window.spilled_cells == 0)
            return "f16/f16 fits the budget at ctx " + std::to_string(plan_ctx) + ": nothing spills (lower --vram-target)";
        if (plan.window.resident_cells == 0)
            return "the budget holds no f16 cell beside the staging ring (" + describe_budget(plan.budget) +
                   "): raise --vram-target";
        if (plan.window.resident_cells >= n_ctx)
            return "the window keeps " + std::to_string(plan.window.resident_cells) + " cells in VRAM and the prompts reach " +
                   std::to_string(n_ctx) + ": the tail is never read (lower --vram-target or raise --lengths)";
        return std::nullopt;
    };
    CellResult spill_cell, auto_cell;
    spill_cell.cell = GateCell::f16_spill;
    spill_cell.kv_tier = "f16/f16";
    auto_cell.cell = GateCell::auto_tier;
    std::optional<NiahReport> spill_report, auto_report;
    std::vector<CellCache> kl_caches = {{q8}};
    int spill_kl = -1, auto_kl = -1;
    if (!plans) {
        spill_cell.unavailable = "no plan: give --profile FILE, or run on --device cuda";
        auto_cell.unavailable = spill_cell.unavailable;
    } else {
        if (auto why = why_not_spilled(plans->f16)) {
            spill_cell.unavailable = *why;
        } else {
            auto [c, r] = run_cell(GateCell::f16_spill, {f16, resident_cells_of(plans->f16)}, "f16/f16 spilled");
            spill_cell = c;
            spill_report = r;
            spill_kl = (int)kl_caches.size();
            kl_caches.push_back({f16, resident_cells_of(plans->f16)});
        }
        auto_cell.chosen_tier = decision->tier;
        const KvPlan& ap = plans->automatic;
        const GateKv auto_kv{ap.tier, false};
        if (rt.device != "cuda" && ap.window.spilled_cells > 0) {
            auto_cell.unavailable = "its tier spills: needs --device cuda";
            auto_cell.chosen_note = "planned, not run";
        } else if (ap.window.spilled_cells > 0 && ap.window.resident_cells == 0) {
            auto_cell.unavailable = "the budget holds no cell of its tier (" + describe_budget(ap.budget) + ")";
            auto_cell.chosen_note = "planned, not run";
        } else {
            auto [c, r] = run_cell(GateCell::auto_tier, {auto_kv, resident_cells_of(ap)}, "auto " + kv_tier_name(ap.tier));
            c.chosen_tier = decision->tier;
            c.chosen_note = ap.probed ? "planned with this machine's measurements" : "planned";
            auto_cell = c;
            auto_report = r;
            auto_kl = (int)kl_caches.size();
            kl_caches.push_back({auto_kv, resident_cells_of(ap)});
        }
    }

    // KL vs f16_resident over a text at least as long as the prompts, so spilled cells are
    // compared where their tail is read.
    std::string kl_source;
    const std::vector<int32_t> kl_tokens = kl_tokens_from(args, model, config.seed, kl_source,
                                                          std::max<uint32_t>(2048, std::min<uint32_t>(n_ctx, cache_ctx)));
    const std::vector<LogitMetrics> kl = run_kl(rt, model, f16, kl_caches, kl_tokens, "kl vs f16/f16");
    q8_cell.kl_vs_f16 = kl[0].mean_kl;
    q8_cell.top1_vs_f16 = kl[0].top1_agreement;
    if (spill_kl >= 0) {
        spill_cell.kl_vs_f16 = kl[spill_kl].mean_kl;
        spill_cell.top1_vs_f16 = kl[spill_kl].top1_agreement;
    }
    if (auto_kl >= 0) {
        auto_cell.kl_vs_f16 = kl[auto_kl].mean_kl;
        auto_cell.top1_vs_f16 = kl[auto_kl].top1_agreement;
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
        out["kl"] = nlohmann::json::object();
        out["kl"]["q8_resident"] = metrics_json(kl[0]);
        if (spill_kl >= 0) out["kl"]["f16_spill"] = metrics_json(kl[spill_kl]);
        if (auto_kl >= 0) out["kl"]["auto"] = metrics_json(kl[auto_kl]);
        out["niah"] = {{"f16_resident", niah_report_json(f16_report, false)},
                       {"q8_resident", niah_report_json(q8_report, false)}};
        if (spill_report) out["niah"]["f16_spill"] = niah_report_json(*spill_report, false);
        if (auto_report) out["niah"]["auto"] = niah_report_json(*auto_report, false);
        if (plans) {
            out["f16_window"] = {{"resident_cells", plans->f16.window.resident_cells},
                                 {"spilled_cells", plans->f16.window.spilled_cells},
                                 {"spilled_bytes", plans->f16.window.spilled_bytes},
                                 {"staging_bytes", plans->f16.staging_bytes},
                                 {"budget", describe_budget(plans->f16.budget)}};
        }
        out["planner_diagnostics"] = diagnostics;
        std::printf("%s\n", dump_json(out).c_str());
        return 0;
    }
    std::printf("== quality gate (spec T5 cells), %s on %s\n", model_path.c_str(), rt.device.c_str());
    std::printf("niah: %zu tasks x lengths", config.tasks.size());
    for (uint32_t l : config.lengths) std::printf(" %u", l);
    std::printf(" x %u depths x %u samples; KL over %zu tokens of %s\n", config.n_depths, config.samples,
                kl_tokens.size(), kl_source.c_str());
    std::printf("decode tok/s: greedy answer steps of the niah run\n");
    if (plans)
        std::printf("f16 window at ctx %llu: %s; %llu cells resident, %llu spilled (%.1f MiB)\n",
                    (unsigned long long)plan_ctx, describe_budget(plans->f16.budget).c_str(),
                    (unsigned long long)plans->f16.window.resident_cells, (unsigned long long)plans->f16.window.spilled_cells,
                    (double)plans->f16.window.spilled_bytes / (double)kMiB);
    std::printf("\n%s\n", format_gate_table(cells).c_str());
    if (decision) {
        std::printf("auto: %s — %s [%s]\n", decision->tier.c_str(), decision->reason.c_str(), decision->source.c_str());
        for (const std::string& line : diagnostics) std::printf("  %s\n", line.c_str());
        std::printf("\n");
    } else {
        std::printf("auto: no planner decision (give --profile FILE, or run on --device cuda)\n\n");
    }
    std::printf("%s", format_gate_checks(checks).c_str());
    return 0;
}

}  // namespace

int cmd_gate(int argc, char** argv) {
    ArgParser args("gate", "Quality gate: RULER niah, logit metrics of KV tiers, and the spec's four-cell table.");
    args.option({"-m", "--model"}, "FILE", "GGUF model file");
    args.option({"--synthetic"}, "PRESET", "--cells on random weights built on the GPU (speed columns only; needs -c N)");
    args.option({"--wtype"}, "T", "--synthetic: weight type (f16, bf16, q8_0)", "q8_0");
    args.option({"--decode-steps"}, "N", "--synthetic: decode steps per cell, from depth ctx - N - 1", "32");
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
    args.option({"-c", "--ctx-size"}, "N", "--cells: context the planner decides for", "the longest niah length");
    add_plan_options(args, true);
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
    const bool json = args.has("--json");
    if (args.has("--synthetic")) {
        if (args.has("--model")) fail("give either -m FILE or --synthetic PRESET, not both");
        return gate_cells_synthetic(args, json);
    }
    const auto model_path = args.get("--model");
    if (!model_path) fail("-m FILE is required");
    Runtime rt;
    rt.device = args.get_or("--device", "cpu");
    if (rt.device != "cpu" && rt.device != "cuda") fail("--device: unknown device '" + rt.device + "' (expected cpu or cuda)");
    rt.chunk = (uint32_t)args.get_int("--batch-size", 1, 1 << 16).value_or(512);
    rt.threads = (unsigned)args.get_int("--threads", 1, 1024).value_or(std::max(1u, std::thread::hardware_concurrency()));

    const std::unique_ptr<GateModel> model = load_gate_model(*model_path, args.has("--chat"));
    if (args.has("--niah")) return gate_niah(args, rt, *model, *model_path, json);
    if (args.has("--kl")) return gate_kl(args, rt, *model, *model_path, json);
    return gate_cells(args, rt, *model, *model_path, json);
}

}  // namespace spillway
