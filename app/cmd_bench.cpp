// spillway bench: llama-bench-like speed test of the CUDA engine. Prefill tok/s, decode
// tok/s at each KV depth, achieved GB/s and % of the roofline (weights + KV bytes read per
// token over the HBM bandwidth measured in the same run), as a markdown table or --json.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "app/args.h"
#include "app/commands.h"
#include "app/env_record.h"
#include "app/plan_args.h"
#include "common/error.h"
#include "probe/device_probe.h"
#include "common/parse.h"
#include "gguf/ggml_types.h"
#include "model/model_spec.h"
#include "model/presets.h"
#include "gguf/gguf.h"
#include "plan/drop_model.h"
#ifdef SPILLWAY_HAVE_CUDA
#include "engine/cuda/cuda_bench.h"
#include "engine/cuda/cuda_model.h"
#endif

namespace spillway {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

std::vector<uint32_t> parse_uint_list(const std::string& text, const char* flag) {
    std::vector<uint32_t> out;
    for (const std::string& s : split_commas(text)) {
        char* end = nullptr;
        const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
        if (end == s.c_str() || *end != '\0' || v > (1ull << 26)) fail(std::string(flag) + ": bad number '" + s + "'");
        out.push_back((uint32_t)v);
    }
    if (out.empty()) fail(std::string(flag) + ": empty list");
    return out;
}

std::vector<uint64_t> parse_mib_list(const std::string& text, const char* flag) {
    std::vector<uint64_t> out;
    for (const std::string& s : split_commas(text)) {
        char* end = nullptr;
        const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
        if (end == s.c_str() || *end != '\0' || s[0] == '-' || v > (1ull << 24))
            fail(std::string(flag) + ": bad MiB value '" + s + "'");
        out.push_back(v);
    }
    if (out.empty()) fail(std::string(flag) + ": empty list");
    return out;
}

std::vector<KvType> parse_kv_list(const std::string& text, const char* flag) {
    std::vector<KvType> out;
    for (const std::string& s : split_commas(text)) {
        auto t = kv_type_from_name(s);
        if (!t) fail(std::string(flag) + ": unknown KV type '" + s + "' (expected f16, q8_0 or q4_0)");
        out.push_back(*t);
    }
    if (out.empty()) fail(std::string(flag) + ": empty list");
    return out;
}

#ifdef SPILLWAY_HAVE_CUDA
// The drop models' predictions for one spilled decode row, from terms measured in the same
// run: t_resident = the resident row of that depth and tier, c_engage = the one-cell spill
// row minus it, and the measured pinned H2D bandwidth for both models' link (the tail lives
// in pinned memory, so no host memcpy stands in its way).
struct SpillPrediction {
    size_t row = 0;                 // index into the report's rows
    DropTerms terms;
    double serial_ms = 0, overlap_ms = 0;
    double serial_err_pct = 0, overlap_err_pct = 0;  // (measured - predicted) / predicted
};

std::vector<SpillPrediction> spill_predictions(const CudaBenchReport& r) {
    std::vector<SpillPrediction> out;
    auto find = [&](const CudaBenchRow& like, bool engage) -> const CudaBenchRow* {
        for (const CudaBenchRow& x : r.rows)
            if (x.test == like.test && x.k_type == like.k_type && x.v_type == like.v_type && x.depth == like.depth &&
                (engage ? x.engage : x.spill_cells == 0))
                return &x;
        return nullptr;
    };
    for (size_t i = 0; i < r.rows.size(); ++i) {
        const CudaBenchRow& row = r.rows[i];
        if (row.spill_cells == 0) continue;
        const CudaBenchRow* resident = find(row, false);
        const CudaBenchRow* engage = find(row, true);
        if (!resident || !engage) continue;
        SpillPrediction p;
        p.row = i;
        p.terms.t_resident_ms = resident->ms_per_token;
        p.terms.c_engage_ms = std::max(0.0, engage->ms_per_token - resident->ms_per_token);
        p.terms.bw_eff_gbps = r.h2d_gb_s;
        p.terms.h2d_gbps = r.h2d_gb_s;
        p.serial_ms = predicted_token_ms(DropModel::serial, p.terms, row.tail_bytes_per_token);
        p.overlap_ms = predicted_token_ms(DropModel::overlap, p.terms, row.tail_bytes_per_token);
        p.serial_err_pct = 100.0 * (row.ms_per_token / p.serial_ms - 1.0);
        p.overlap_err_pct = 100.0 * (row.ms_per_token / p.overlap_ms - 1.0);
        out.push_back(p);
    }
    return out;
}
#endif

}  // namespace

int cmd_bench(int argc, char** argv) {
    ArgParser args("bench", "measure prefill and decode speed of the CUDA engine against the HBM roofline");
    args.option({"-m", "--model"}, "FILE", "GGUF model file");
    args.option({"--synthetic"}, "PRESET", "random weights of a preset shape built on the GPU (tiny, qwen2.5-14b, ...)");
    args.option({"--wtype"}, "T", "weight type of --synthetic: f16, bf16, q8_0", "q8_0");
    args.option({"-p", "--n-prompt"}, "N", "prefill test length (0 = skip)", "512");
    args.option({"-n", "--n-gen"}, "N", "decode steps per depth (0 = skip)", "128");
    args.option({"-b", "--batch-size"}, "N", "prefill chunk", "512");
    args.option({"-d", "--depth"}, "LIST", "KV depths for the decode test, comma separated", "0");
    args.option({"-ctk", "--cache-type-k"}, "LIST", "K cache types, comma separated", "f16");
    args.option({"-ctv", "--cache-type-v"}, "LIST", "V cache types, comma separated (paired with -ctk)", "same as -ctk");
    args.option({"-s", "--seed"}, "S", "seed of the synthetic weights and prompt", "1");
    args.option({"-r", "--repetitions"}, "N", "run each test N times: tok/s is their mean, +- their sample sd", "1");
    args.option({"--spill"}, "LIST",
                "MiB of the KV cache at each depth streamed from pinned host RAM, comma separated; each "
                "spilled row is printed with the serial and overlap drop models' predictions",
                "0");
    args.flag({"--no-graph"}, "decode with direct kernel launches instead of the per-step CUDA graph");
    args.option({"-c", "--ctx-size"}, "N",
                "with --kv-auto-tier: plan the KV cache for N cells on this GPU and bench what the plan chose "
                "(its tier, and its spill at depth N - n_gen - 1)");
    add_plan_options(args, false);
    args.flag({"--json"}, "print one JSON object instead of the table");
    args.epilog(
        "-ctk and -ctv lists pair up element by element (a single entry pairs with every entry of\n"
        "the other list). Example:\n"
        "  spillway bench --synthetic qwen2.5-14b --wtype q8_0 -d 0,8192,65536 -ctk f16,q8_0,q4_0\n");
    args.parse(argc, argv);
    if (args.help_requested()) {
        std::printf("%s", args.help().c_str());
        return 0;
    }
    if (args.has("--model") == args.has("--synthetic")) fail("give exactly one of -m FILE or --synthetic PRESET");
    const std::vector<KvType> ks = parse_kv_list(args.get_or("--cache-type-k", "f16"), "-ctk");
    const std::vector<KvType> vs =
        args.has("--cache-type-v") ? parse_kv_list(*args.get("--cache-type-v"), "-ctv") : ks;
    if (ks.size() != vs.size() && ks.size() != 1 && vs.size() != 1)
        fail("-ctk and -ctv lists must have the same length (or one entry)");
    std::vector<std::pair<KvType, KvType>> pairs;
    for (size_t i = 0; i < std::max(ks.size(), vs.size()); ++i)
        pairs.push_back({ks[ks.size() == 1 ? 0 : i], vs[vs.size() == 1 ? 0 : i]});
    const auto wtype = ggml_type_from_name(args.get_or("--wtype", "q8_0"));
    if (!wtype) fail("--wtype: unknown type '" + args.get_or("--wtype", "") + "'");
    const std::vector<uint32_t> depths = parse_uint_list(args.get_or("--depth", "0"), "-d");
    const uint32_t n_prompt = (uint32_t)args.get_int("--n-prompt", 0, 1 << 20).value_or(512);
    const uint32_t n_gen = (uint32_t)args.get_int("--n-gen", 0, 1 << 20).value_or(128);
    const uint32_t batch = (uint32_t)args.get_int("--batch-size", 1, 1 << 16).value_or(512);
    const uint64_t seed = (uint64_t)args.get_int("--seed", 0, INT64_MAX).value_or(1);
    const uint32_t repetitions = (uint32_t)args.get_int("--repetitions", 1, 1000).value_or(1);
    const bool json = args.has("--json");
    const bool no_graph = args.has("--no-graph");
    const std::vector<uint64_t> spill_mib = parse_mib_list(args.get_or("--spill", "0"), "--spill");

    // What the user named is checked before any GPU work: a wrong preset, file or weight type
    // and a run with nothing to measure are reported as such on every machine, not as a missing
    // GPU or after a 14B model has been built on it. (An unknown preset fails with the list.)
    if (n_prompt == 0 && n_gen == 0) fail("-p 0 and -n 0 leave nothing to measure");
    // Recorded with the results, and said before any GPU work when one is a timing bound.
    const std::vector<EnvSetting> env_settings = spillway_env_settings();
    const bool timing_bound = warn_timing_bounds(env_settings, "bench") > 0;
    if (n_gen == 0 && std::any_of(spill_mib.begin(), spill_mib.end(), [](uint64_t m) { return m > 0; }))
        fail("--spill measures decode; -n must be > 0");
#ifdef SPILLWAY_HAVE_CUDA
    if (args.has("--synthetic") && !cuda_weight_type_supported(*wtype))
        fail("--wtype: the CUDA engine does not take " + std::string(ggml_type_name(*wtype)) + " weights");
#endif
    const ModelSpec spec = args.has("--synthetic")
                               ? model_spec_from_gguf(preset_header(*args.get("--synthetic"), *wtype))
                               : model_spec_from_gguf(GgufFile::open(*args.get("--model"))->header());

    // --kv-auto-tier: the planner decides (from this GPU's measurements) instead of -ctk/-ctv,
    // -d and --spill, and the bench measures its choice. Without the switch none of this runs.
    // -ctk/-ctv here are the bench's lists of tiers, not the planner's explicit axis: with the
    // switch on the plan picks the tier, so only a single type reaches the planner.
    KnobFlags knob_flags = knob_flags_from(args);
    if (ks.size() > 1 || vs.size() > 1) knob_flags.type_k = knob_flags.type_v = std::nullopt;
    const PlanKnobs knobs = resolve_plan_knobs(knob_flags, process_env());
    std::optional<KvPlan> plan;
    std::vector<uint32_t> bench_depths = depths;
    std::vector<uint64_t> bench_spill = spill_mib;
    if (knobs.auto_tier) {
        auto ctx_text = args.get("-c");
        if (!ctx_text) fail("--kv-auto-tier: give -c N, the context to plan for");
        if (args.has("--depth") || args.has("--spill"))
            fail("--kv-auto-tier: -d and --spill follow from the plan (depth N - n_gen - 1); leave them out");
        const uint64_t n_ctx = (uint64_t)parse_int_in(*ctx_text, "-c", 2, int64_t(1) << 31);
        if (n_gen == 0 || n_gen + 1 >= n_ctx) fail("--kv-auto-tier: -n must be at least 1 and below -c - 1");
        if (!cuda_device_available()) fail("bench --kv-auto-tier plans this machine's GPU, and none is usable here");
        const PlanSource source = plan_source_from(args);
        const BudgetInputs budget = budget_inputs_from(args, spec, source.values, knobs);
        plan = plan_from_source(spec, n_ctx, budget, knobs, source);
        pairs = {{plan->tier.k, plan->tier.v}};
        const uint32_t depth = (uint32_t)(n_ctx - n_gen - 1);
        bench_depths = {depth};
        // The bench spills MiB of the filled cache: the cells of the depth past the window.
        const uint64_t tail_cells = depth > plan->window.resident_cells ? depth - plan->window.resident_cells : 0;
        const uint64_t cell_bytes = kv_footprint(spec, 1, plan->tier).global_bytes_per_cell;
        bench_spill = {plan->window.spilled_cells ? (tail_cells * cell_bytes + kMiB - 1) / kMiB : 0};
        if (!json)
            std::printf("plan: %s for %llu cells — %s; %llu cells resident, %llu spilled; predicted %s tok/s\n",
                        kv_tier_name(plan->tier).c_str(), (unsigned long long)n_ctx, plan->reason.c_str(),
                        (unsigned long long)plan->window.resident_cells, (unsigned long long)plan->window.spilled_cells,
                        plan->predicted_tok_s ? std::to_string((int)std::lround(*plan->predicted_tok_s)).c_str() : "-");
    } else if (args.has("-c")) {
        fail("-c plans the cache and needs --kv-auto-tier");
    }

#ifndef SPILLWAY_HAVE_CUDA
    (void)bench_depths, (void)bench_spill, (void)pairs, (void)timing_bound, (void)wtype, (void)depths, (void)n_prompt, (void)n_gen, (void)batch, (void)seed, (void)json, (void)no_graph, (void)repetitions,
        (void)spill_mib;
    fail("bench measures the CUDA engine, and this build has none (configure with -DSPILLWAY_CUDA=ON on a machine with nvcc)");
#else
    CudaBenchOptions o;
    o.model_path = args.get_or("--model", "");
    o.synthetic_preset = args.get_or("--synthetic", "");
    o.wtype = *wtype;
    o.n_prompt = n_prompt;
    o.n_gen = n_gen;
    o.batch = batch;
    o.depths = bench_depths;
    o.kv_types = pairs;
    o.seed = seed;
    o.use_graph = !no_graph;
    o.show_progress = !json;
    o.spill_mib = bench_spill;
    o.repetitions = repetitions;
    const CudaBenchReport r = run_cuda_bench(o);
    const std::vector<SpillPrediction> predictions = spill_predictions(r);

    auto mib = [](uint64_t b) { return (double)b / (1 << 20); };
    // The decode row that measured what the plan chose (its tier, spilled or not).
    const CudaBenchRow* planned_row = nullptr;
    if (plan)
        for (const CudaBenchRow& row : r.rows)
            if (row.test.rfind("tg", 0) == 0 && !row.engage &&
                (bench_spill[0] ? row.spill_cells > 0 && row.spill_mib == bench_spill[0] : row.spill_cells == 0))
                planned_row = &row;
    if (json) {
        nlohmann::json rows = nlohmann::json::array();
        for (size_t i = 0; i < r.rows.size(); ++i) {
            const CudaBenchRow& row = r.rows[i];
            nlohmann::json j = {{"ctk", kv_type_name(row.k_type)}, {"ctv", kv_type_name(row.v_type)},
                                {"test", row.test}, {"depth", row.depth}, {"tok_s", row.tok_s},
                                {"tok_s_sd", row.tok_s_sd}, {"repetitions", repetitions},
                                {"ms_per_token", row.ms_per_token}, {"gb_s", row.gb_s},
                                {"roofline_pct", row.roofline_pct}, {"bytes_per_token", row.bytes_per_token},
                                {"graph_capture_us", row.capture_us}, {"vram_kv_bytes", row.vram_kv},
                                {"spill_mib", row.spill_mib}};
            if (row.spill_cells > 0) {
                j["spill"] = {{"engage_row", row.engage}, {"cells", row.spill_cells},
                              {"tail_bytes_per_token", row.tail_bytes_per_token},
                              {"staging_bytes", row.staging_bytes}, {"spilled_bytes", row.spilled_bytes}};
                for (const SpillPrediction& p : predictions)
                    if (p.row == i)
                        j["spill"]["predicted"] = {{"t_resident_ms", p.terms.t_resident_ms},
                                                   {"c_engage_ms", p.terms.c_engage_ms},
                                                   {"h2d_gb_s", p.terms.h2d_gbps},
                                                   {"serial_ms", p.serial_ms}, {"serial_err_pct", p.serial_err_pct},
                                                   {"overlap_ms", p.overlap_ms},
                                                   {"overlap_err_pct", p.overlap_err_pct}};
            }
            rows.push_back(j);
        }
        nlohmann::json out = {{"device", r.device}, {"model", r.model}, {"hbm_read_gb_s", r.hbm_gb_s},
                              {"kv_cells", r.kv_cells}, {"decode_graph", !no_graph},
                              {"pinned_h2d_gb_s", r.h2d_gb_s},
                              {"vram_bytes", {{"weights", r.vram_weights}, {"scratch", r.vram_scratch},
                                              {"graphs", r.vram_graphs}}},
                              {"rows", rows}};
        out["env"] = nlohmann::json::object();
        for (const EnvSetting& e : env_settings) out["env"][e.name] = e.value;
        out["timing_bound"] = timing_bound;
        for (const auto& [name, bytes] : r.vram_scratch_parts) out["vram_bytes"]["scratch_parts"][name] = bytes;
        if (plan)
            out["plan"] = {{"tier", kv_tier_name(plan->tier)},
                           {"reason", plan->reason},
                           {"resident_cells", plan->window.resident_cells},
                           {"spilled_cells", plan->window.spilled_cells},
                           {"staging_bytes", plan->staging_bytes},
                           {"drop_model", drop_model_name(knobs.drop_model)},
                           {"predicted_tok_s", plan->predicted_tok_s ? nlohmann::json(*plan->predicted_tok_s)
                                                                     : nlohmann::json(nullptr)},
                           {"measured_tok_s", planned_row ? nlohmann::json(planned_row->tok_s) : nlohmann::json(nullptr)},
                           {"diagnostics", plan->diagnostics}};
        std::printf("%s\n", out.dump(1).c_str());
        return 0;
    }
    std::printf("device: %s, HBM read %.0f GB/s (measured now)\nmodel: %s; decode %s\n", r.device.c_str(),
                r.hbm_gb_s, r.model.c_str(), no_graph ? "with direct launches" : "as one CUDA graph per step");
    std::printf("VRAM: weights %.0f MiB, scratch %.1f MiB, graphs %.1f MiB, KV per tier below (%llu cells)\n",
                mib(r.vram_weights), mib(r.vram_scratch), mib(r.vram_graphs), (unsigned long long)r.kv_cells);
    std::printf("env: %s%s\n\n", env_settings_text(env_settings).c_str(),
                timing_bound ? " (a TIMING BOUND is on: wrong output on purpose, not the engine's speed)" : "");
    std::printf("| ctk | ctv | test | depth | tok/s | ms/tok | GB/s | %% roofline | capture us | KV MiB |\n");
    std::printf("|-----|-----|------|------:|------:|-------:|-----:|-----------:|-----------:|-------:|\n");
    for (const CudaBenchRow& row : r.rows) {
        if (row.spill_cells > 0) continue;  // in the spill table below
        const bool decode = row.test.rfind("tg", 0) == 0;
        char tok_s[64];  // "mean", or "mean ± sd" over repetitions as llama-bench prints it
        if (repetitions > 1) std::snprintf(tok_s, sizeof tok_s, "%.1f ± %.1f", row.tok_s, row.tok_s_sd);
        else std::snprintf(tok_s, sizeof tok_s, "%.1f", row.tok_s);
        std::printf("| %s | %s | %s | %u | %s | %.3f | %s | %s | %s | %.0f |\n", kv_type_name(row.k_type),
                    kv_type_name(row.v_type), row.test.c_str(), row.depth, tok_s, row.ms_per_token,
                    decode ? std::to_string((int)(row.gb_s + 0.5)).c_str() : "-",
                    decode ? (std::to_string((int)(row.roofline_pct * 10 + 0.5) / 10) + "." +
                              std::to_string((int)(row.roofline_pct * 10 + 0.5) % 10))
                                 .c_str()
                           : "-",
                    decode ? std::to_string((int)(row.capture_us + 0.5)).c_str() : "-", mib(row.vram_kv));
    }
    if (!predictions.empty()) {
        std::printf("\nSpilled decode (tail streamed from pinned host RAM; pinned H2D %.1f GB/s measured now).\n"
                    "serial: t_resident + c_engage + tail/bw; overlap: max(t_resident, tail/bw) + c_engage;\n"
                    "t_resident = the resident row above, c_engage = the 1-cell row minus it; err = measured vs "
                    "predicted.\n\n",
                    r.h2d_gb_s);
        std::printf("| ctk | ctv | depth | spill MiB | tail MiB/tok | staging MiB | ms/tok | serial ms | err %% | "
                    "overlap ms | err %% |\n");
        std::printf("|-----|-----|------:|----------:|-------------:|------------:|-------:|----------:|------:|"
                    "-----------:|------:|\n");
        for (const SpillPrediction& p : predictions) {
            const CudaBenchRow& row = r.rows[p.row];
            const std::string spill = row.engage ? "1 cell" : std::to_string(row.spill_mib);
            std::printf("| %s | %s | %u | %s | %.1f | %.1f | %.3f | %.3f | %+.1f | %.3f | %+.1f |\n",
                        kv_type_name(row.k_type), kv_type_name(row.v_type), row.depth, spill.c_str(),
                        mib(row.tail_bytes_per_token), mib(row.staging_bytes), row.ms_per_token, p.serial_ms,
                        p.serial_err_pct, p.overlap_ms, p.overlap_err_pct);
        }
        std::printf("\n");
        for (const SpillPrediction& p : predictions) {
            const CudaBenchRow& row = r.rows[p.row];
            if (row.engage)
                std::printf("c_engage %s/%s depth %u: %.3f ms = %.1f%% of t_resident %.3f ms\n",
                            kv_type_name(row.k_type), kv_type_name(row.v_type), row.depth, p.terms.c_engage_ms,
                            100.0 * p.terms.c_engage_ms / p.terms.t_resident_ms, p.terms.t_resident_ms);
        }
    }
    if (plan && planned_row) {
        // The planner's t_resident is the spec's roofline ((weights + KV) / VRAM bandwidth), so
        // its tok/s is an upper bound; the ratio says how close this engine runs to it.
        std::printf("\nplan check: %s predicted %s tok/s (roofline t_resident, %s drop model), measured %.1f tok/s",
                    kv_tier_name(plan->tier).c_str(),
                    plan->predicted_tok_s ? std::to_string((int)std::lround(*plan->predicted_tok_s)).c_str() : "-",
                    drop_model_name(knobs.drop_model), planned_row->tok_s);
        if (plan->predicted_tok_s && *plan->predicted_tok_s > 0)
            std::printf(" = %.0f%% of the prediction", 100.0 * planned_row->tok_s / *plan->predicted_tok_s);
        std::printf("\n");
    }
    return 0;
#endif
}

}  // namespace spillway
