#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "common/log.h"
#include "plan/planner.h"
#include "plan_test_models.h"

using namespace spillway;
using namespace spillway::plan_test;

namespace {

constexpr double MiB = (double)kMiB;

BudgetInputs budget_for(const ModelSpec& m, const ProbeValues& v, std::optional<uint64_t> target_mib = std::nullopt) {
    BudgetInputs b;
    b.vram_free_bytes = (uint64_t)(*v.vram_total_mib * MiB);
    b.weight_bytes = m.weight_bytes_total;
    b.compute_reserve_bytes = default_compute_reserve_bytes(m);
    if (target_mib) b.vram_target_bytes = *target_mib * kMiB;
    return b;
}

// The spec's numbers (T5, the 3090 drop response) come from its serial drop model, so these
// tests pin it; the overlap model (our default) has its own tests.
PlanKnobs auto_on() {
    PlanKnobs k;
    k.auto_tier = true;
    k.drop_model = DropModel::serial;
    return k;
}

}  // namespace

// --- ladder and bytes -------------------------------------------------------------------

TEST(KvTiers, LadderOrderAndMixedStepKeepsKAtLeastAsPreciseAsV) {
    std::vector<KvTier> ladder = default_kv_ladder();
    ASSERT_EQ(ladder.size(), 4u);
    EXPECT_EQ(kv_tier_name(ladder[0]), "f16/f16");
    EXPECT_EQ(kv_tier_name(ladder[1]), "q8_0/q8_0");
    EXPECT_EQ(kv_tier_name(ladder[2]), "q8_0/q4_0");
    EXPECT_EQ(kv_tier_name(ladder[3]), "q4_0/q4_0");
    ModelSpec m = qwen14b_q8();
    for (size_t i = 1; i < ladder.size(); ++i)  // strictly less to store at every step
        EXPECT_LT(kv_footprint(m, 4096, ladder[i]).total_bytes(), kv_footprint(m, 4096, ladder[i - 1]).total_bytes());
}

TEST(KvTiers, FootprintMatchesTheModelsRealPerLayerStructure) {
    ModelSpec m = qwen14b_q8();
    // 48 layers x (K + V) x 8 heads x 128 dims: f16 192 KiB per cell, q8_0 102 KiB.
    EXPECT_EQ(kv_footprint(m, 1, {KvType::f16, KvType::f16}).total_bytes(), 48u * 2 * 1024 * 2);
    EXPECT_EQ(kv_footprint(m, 65536, {KvType::f16, KvType::f16}).total_bytes(), 12288ull * kMiB);
    EXPECT_EQ(kv_footprint(m, 65536, {KvType::q8_0, KvType::q8_0}).total_bytes(), 6528ull * kMiB);
    EXPECT_EQ(kv_footprint(m, 7, {KvType::q8_0, KvType::q4_0}).total_bytes(),
              kv_cache_bytes(m, 7, KvType::q8_0, KvType::q4_0));

    // Local layers hold at most the window and never spill.
    ModelSpec s = swa_model();
    KvFootprint f = kv_footprint(s, 4096, {KvType::f16, KvType::f16});
    EXPECT_EQ(f.local_cells, 1024u);
    EXPECT_EQ(f.global_bytes_per_cell, 2u * 2 * 128 * 2);
    EXPECT_EQ(f.total_bytes(), kv_cache_bytes(s, 4096, KvType::f16, KvType::f16));
    SpillWindow w = spill_window(f, f.local_bytes() + 100 * f.global_bytes_per_cell + 5);
    EXPECT_EQ(w.resident_cells, 100u);
    EXPECT_EQ(w.spilled_cells, 3996u);
    EXPECT_EQ(w.spilled_bytes, 3996u * f.global_bytes_per_cell);
    EXPECT_EQ(w.resident_bytes + w.spilled_bytes, f.total_bytes());
}

// The spill's staging ring is paid from the same budget: resident bytes + staging never
// exceed it, a cache that fits pays nothing, and a one-cell spill stages only that cell.
TEST(KvTiers, StagingRingIsPaidFromTheBudget) {
    ModelSpec m = qwen14b_q8();
    const KvTier f16{KvType::f16, KvType::f16};
    KvFootprint f = kv_footprint(m, 65536, f16);
    StagedSpillWindow fits = spill_window_with_staging(f, f.total_bytes());
    EXPECT_EQ(fits.window.spilled_cells, 0u);
    EXPECT_EQ(fits.staging_bytes, 0u);
    for (uint64_t budget : {f.total_bytes() - 1, f.total_bytes() - 100 * kMiB, f.total_bytes() / 2, 70 * kMiB,
                            (uint64_t)1}) {
        StagedSpillWindow s = spill_window_with_staging(f, budget);
        EXPECT_GT(s.window.spilled_cells, 0u) << budget;
        EXPECT_EQ(s.staging_bytes, spill_staging_bytes(s.window.spilled_bytes, f.global_layers)) << budget;
        EXPECT_LE(s.window.resident_bytes + s.staging_bytes, std::max<uint64_t>(budget, s.staging_bytes)) << budget;
        EXPECT_LE(s.staging_bytes, kSpillStagingBuffers * kSpillChunkBytes);
        // Not more conservative than needed: one more resident cell would not fit.
        if (s.window.resident_cells + 1 < f.n_ctx && budget > s.staging_bytes)
            EXPECT_GT(s.window.resident_bytes + f.global_bytes_per_cell + s.staging_bytes, budget) << budget;
    }
    // A big spill pays the full ring: 2 x 32 MiB.
    EXPECT_EQ(spill_window_with_staging(f, f.total_bytes() / 2).staging_bytes, 64 * kMiB);
    EXPECT_EQ(f.global_layers, 48u);
    EXPECT_EQ(spill_staging_bytes(0, 48), 0u);
    // A small tail: two buffers of one layer's share of it (rounded up).
    EXPECT_EQ(spill_staging_bytes(4800, 48), 200u);
    EXPECT_EQ(spill_staging_bytes(4801, 48), 202u);
}

TEST(DropModel, SerialModelMatchesTheSpecFormula) {
    DropTerms t{30.0, 0.8, 6.7};
    // drop(tail) = (c_engage + tail/bw_eff) / t_resident
    uint64_t tail = 67'000'000;  // 10 ms at 6.7 GB/s
    EXPECT_NEAR(predicted_drop(DropModel::serial, t, tail), (0.8 + 10.0) / 30.0, 1e-9);
    EXPECT_EQ(predicted_drop(DropModel::serial, t, 0), 0.0);
    // T* = (target * t_resident - c_engage) * bw_eff, and drop(T*) == target.
    uint64_t tstar = tolerable_spill_bytes(DropModel::serial, t, 0.2);
    EXPECT_NEAR((double)tstar, (0.2 * 30.0 - 0.8) * 6.7e6, 1.0);
    EXPECT_NEAR(predicted_drop(DropModel::serial, t, tstar), 0.2, 1e-6);
    EXPECT_EQ(tolerable_spill_bytes(DropModel::serial, t, 0.02), 0u);  // c_engage > 0.02 * t
    EXPECT_EQ(effective_bandwidth(51.2, 9.3).gbps, 9.3);
    EXPECT_STREQ(effective_bandwidth(51.2, 9.3).binding, "host-RAM-bound");
    EXPECT_STREQ(effective_bandwidth(6.7, 11.5).binding, "PCIe-bound");
}

TEST(DropModel, OverlapModelHidesTheCopyUnderTheResidentRead) {
    DropTerms t;
    t.t_resident_ms = 6.0;
    t.c_engage_ms = 0.1;
    t.bw_eff_gbps = 9.6;  // the serial model's link; the overlap model must not use it
    t.h2d_gbps = 50.0;
    EXPECT_EQ(predicted_token_ms(DropModel::overlap, t, 0), 6.0);
    // 100 MB at 50 GB/s = 2 ms < 6 ms: hidden, only the engagement step remains.
    EXPECT_NEAR(predicted_token_ms(DropModel::overlap, t, 100'000'000), 6.1, 1e-9);
    // 500 MB = 10 ms of copy: the copy is the token time.
    EXPECT_NEAR(predicted_token_ms(DropModel::overlap, t, 500'000'000), 10.1, 1e-9);
    EXPECT_NEAR(predicted_drop(DropModel::overlap, t, 500'000'000), 10.1 / 6.0 - 1.0, 1e-9);
    // T*: max(t, tail/h2d) + c = 1.2 t  =>  tail = (1.2 * 6 - 0.1) * 50e6 bytes.
    uint64_t tstar = tolerable_spill_bytes(DropModel::overlap, t, 0.2);
    EXPECT_NEAR((double)tstar, (1.2 * 6.0 - 0.1) * 50e6, 1.0);
    EXPECT_NEAR(predicted_drop(DropModel::overlap, t, tstar), 0.2, 1e-6);
    // Far above the serial model's T* on the same terms: the copy no longer adds.
    EXPECT_GT(tstar, 10 * tolerable_spill_bytes(DropModel::serial, t, 0.2));
    // c_engage alone over the target: never spill, as in the serial model.
    t.c_engage_ms = 2.0;
    EXPECT_EQ(tolerable_spill_bytes(DropModel::overlap, t, 0.2), 0u);
    // Without the copy bandwidth the model cannot predict: an error, not a guess.
    t.h2d_gbps = 0;
    EXPECT_THROW(predicted_token_ms(DropModel::overlap, t, 1), Error);
    EXPECT_STREQ(drop_model_name(DropModel::overlap), "overlap");
    EXPECT_EQ(drop_model_from_name("serial"), DropModel::serial);
    EXPECT_FALSE(drop_model_from_name("fast"));
}

// The knob reaches the walk: on the T5 terms the overlap model's T* (PCIe-class copy engine)
// is larger than the serial model's (host-RAM-bound), and the diagnostics name the model.
TEST(Planner, DropModelKnobChangesTStarAndIsNamedInTheDiagnostics) {
    ModelSpec m = qwen14b_q8();
    PlanKnobs serial = auto_on();
    serial.drop_model = DropModel::serial;
    PlanKnobs overlap = auto_on();
    overlap.drop_model = DropModel::overlap;
    FixedProbeSource p1(rtx6000_bs2()), p2(rtx6000_bs2());
    ScopedLogCapture log;
    KvPlan a = plan_kv(m, 65536, budget_for(m, rtx6000_bs2(), 27000), serial, p1);
    KvPlan b = plan_kv(m, 65536, budget_for(m, rtx6000_bs2(), 27000), overlap, p2);
    ASSERT_TRUE(a.ladder[0].tstar_unclamped_bytes && b.ladder[0].tstar_unclamped_bytes);
    EXPECT_GT(*b.ladder[0].tstar_unclamped_bytes, 5 * *a.ladder[0].tstar_unclamped_bytes);
    auto mentions = [](const KvPlan& p, const std::string& what) {
        for (const std::string& d : p.diagnostics)
            if (d.find(what) != std::string::npos) return true;
        return false;
    };
    EXPECT_TRUE(mentions(a, "drop-model (serial)"));
    EXPECT_TRUE(mentions(b, "drop-model (overlap)"));
    EXPECT_TRUE(mentions(b, "h2d="));
    EXPECT_FALSE(mentions(a, "h2d="));
}

// --- the spec's T5 configuration ------------------------------------------------------

// Qwen2.5-14B-1M, Q8_0 weights, ctx 65536, --vram-target 27000, RTX 6000 (bs2): f16 spills
// ~1.6 GiB, T* is tens of MiB at most, the walk quantizes to q8_0/q8_0, which fits.
TEST(Planner, SpecT5ConfigurationQuantizesToQ8) {
    ModelSpec m = qwen14b_q8();
    FixedProbeSource probe(rtx6000_bs2());
    ScopedLogCapture log;
    KvPlan plan = plan_kv(m, 65536, budget_for(m, rtx6000_bs2(), 27000), auto_on(), probe);

    EXPECT_EQ(probe.calls(), 1);
    EXPECT_EQ(plan.mode, PlanMode::full_walk);
    const LadderRow& f16 = plan.ladder[0];
    EXPECT_GT(f16.window.spilled_bytes / MiB, 1024.0);
    EXPECT_LT(f16.window.spilled_bytes / MiB, 2560.0);
    ASSERT_TRUE(f16.tstar_bytes);
    EXPECT_GT(*f16.tstar_bytes, 0u);
    EXPECT_LT(*f16.tstar_bytes / MiB, 100.0);
    EXPECT_EQ(f16.verdict, RowVerdict::spill_over_tstar);
    EXPECT_EQ(kv_tier_name(plan.tier), "q8_0/q8_0");
    EXPECT_EQ(plan.reason, "fits");
    EXPECT_EQ(plan.window.spilled_cells, 0u);
    EXPECT_EQ(plan.window.resident_cells, 65536u);
    ASSERT_TRUE(plan.terms);
    EXPECT_STREQ(plan.terms->bw.binding, "host-RAM-bound");
    // q8_0 resident is predicted faster than f16 with its spill (the spec measured 3.3x).
    EXPECT_GT(*plan.ladder[1].predicted_tok_s, 2.0 * *f16.predicted_tok_s);

    // The diagnostics carry the spec's content, at WARN.
    EXPECT_NE(log.text().find("top tier f16/f16 SPILLS by"), std::string::npos) << log.text();
    EXPECT_NE(log.text().find("T* tolerable spill"), std::string::npos);
    EXPECT_NE(log.text().find("bw_eff=9.3 host-RAM-bound, target_drop=0.20) → auto KV tier = q8_0/q8_0 (fits)"),
              std::string::npos)
        << log.text();
    EXPECT_NE(log.text().find("budget"), std::string::npos);
    EXPECT_NE(log.text().find("c_engage 0.82 ms"), std::string::npos);
    EXPECT_EQ(log.count(LogLevel::warn), (int)plan.diagnostics.size());
    EXPECT_EQ(log.count(LogLevel::error), 0);
}

// --- the spec's drop-response ----------------------------------------------------------

// 3090 (solidPC), 106k context, f16 spilling: T* grows with the target and is 0 at 0.02
// (c_engage alone exceeds 2% of t_resident). The spec measured 0 -> 62 -> 157 -> 235 MiB.
TEST(Planner, DropResponseOnThe3090IsMonotoneAndZeroAtTwoPercent) {
    ModelSpec m = qwen14b_q8();
    const double targets[] = {0.02, 0.30, 0.70, 0.99};
    std::vector<uint64_t> tstar;
    for (double target : targets) {
        PlanKnobs k = auto_on();
        k.tstar_drop = target;
        FixedProbeSource probe(rtx3090_solidpc());
        ScopedLogCapture quiet;
        KvPlan plan = plan_kv(m, 108544, budget_for(m, rtx3090_solidpc()), k, probe);
        ASSERT_GT(plan.ladder[0].window.spilled_bytes, 0u);
        ASSERT_TRUE(plan.ladder[0].tstar_bytes);
        EXPECT_EQ(*plan.ladder[0].tstar_bytes, *plan.ladder[0].tstar_unclamped_bytes);  // ceiling not involved
        tstar.push_back(*plan.ladder[0].tstar_bytes);
    }
    EXPECT_EQ(tstar[0], 0u);
    for (size_t i = 1; i < tstar.size(); ++i) EXPECT_GT(tstar[i], tstar[i - 1]);
    // Same order of magnitude as the spec's measurement (tens to hundreds of MiB).
    EXPECT_GT(tstar[1] / MiB, 20.0);
    EXPECT_LT(tstar[3] / MiB, 500.0);
}

// --- explicit axes -------------------------------------------------------------------------

struct AxisCase {
    const char* name;
    std::optional<KvType> k, v;
    uint64_t vram_target_mib;
    PlanMode mode;
    const char* tier;
    int probe_calls;
    std::vector<const char*> ladder;
};

class ExplicitAxes : public ::testing::TestWithParam<AxisCase> {};

TEST_P(ExplicitAxes, WalksOnlyTheFreeAxis) {
    const AxisCase& c = GetParam();
    ModelSpec m = qwen14b_q8();
    PlanKnobs k = auto_on();
    k.type_k = c.k;
    k.type_v = c.v;
    FixedProbeSource probe(rtx6000_bs2());
    ScopedLogCapture log;
    KvPlan plan = plan_kv(m, 65536, budget_for(m, rtx6000_bs2(), c.vram_target_mib), k, probe);
    EXPECT_EQ(plan.mode, c.mode);
    EXPECT_EQ(kv_tier_name(plan.tier), c.tier);
    EXPECT_EQ(probe.calls(), c.probe_calls);
    ASSERT_EQ(plan.ladder.size(), c.ladder.size());
    for (size_t i = 0; i < c.ladder.size(); ++i) EXPECT_EQ(kv_tier_name(plan.ladder[i].tier), c.ladder[i]);
    if (c.k) {
        for (const LadderRow& r : plan.ladder) EXPECT_EQ(r.tier.k, *c.k) << "K is pinned";
    }
    EXPECT_GT(log.count(LogLevel::warn), 0);  // the switch is on: the decision is explained
}

// T5 with --vram-target 27000: budget ~10.3 GiB; with 24000: ~7.4 GiB.
INSTANTIATE_TEST_SUITE_P(
    Planner, ExplicitAxes,
    ::testing::Values(
        // -ctv disables auto-tier even when the requested pair spills; nothing is measured.
        AxisCase{"ctv_only", std::nullopt, KvType::q8_0, 24000, PlanMode::explicit_v, "f16/q8_0", 0, {"f16/q8_0"}},
        AxisCase{"ctk_and_ctv", KvType::q4_0, KvType::q8_0, 27000, PlanMode::explicit_v, "q4_0/q8_0", 0, {"q4_0/q8_0"}},
        // -ctk pins K; V walks. q8_0/f16 (9408 MiB) spills at 24000, q8_0/q8_0 fits.
        AxisCase{"ctk_walks_v", KvType::q8_0, std::nullopt, 24000, PlanMode::v_walk, "q8_0/q8_0", 1,
                 {"q8_0/f16", "q8_0/q8_0", "q8_0/q4_0"}},
        // q8_0/f16 fits at 27000: the fast path, no measurement.
        AxisCase{"ctk_fast_path", KvType::q8_0, std::nullopt, 27000, PlanMode::v_walk, "q8_0/f16", 0,
                 {"q8_0/f16", "q8_0/q8_0", "q8_0/q4_0"}},
        // An explicit -ctk f16 pins f16 K (V walks) although it is the default type.
        AxisCase{"ctk_f16_pins", KvType::f16, std::nullopt, 27000, PlanMode::v_walk, "f16/q8_0", 1,
                 {"f16/f16", "f16/q8_0", "f16/q4_0"}},
        AxisCase{"both_default", std::nullopt, std::nullopt, 27000, PlanMode::full_walk, "q8_0/q8_0", 1,
                 {"f16/f16", "q8_0/q8_0", "q8_0/q4_0", "q4_0/q4_0"}}),
    [](const auto& info) { return std::string(info.param.name); });

// --- floor, ceiling, fast path, switch off ---------------------------------------------

TEST(Planner, FloorSpillsTheRestWhenEvenItExceedsTstar) {
    ModelSpec m = qwen14b_q8();
    FixedProbeSource probe(rtx3090_solidpc());
    ScopedLogCapture log;
    const uint64_t n_ctx = 524288;
    BudgetInputs b = budget_for(m, rtx3090_solidpc());
    KvPlan plan = plan_kv(m, n_ctx, b, auto_on(), probe);
    EXPECT_EQ(kv_tier_name(plan.tier), "q4_0/q4_0");
    EXPECT_EQ(plan.chosen, plan.ladder.size() - 1);
    EXPECT_EQ(plan.ladder.back().verdict, RowVerdict::spill_over_tstar);
    EXPECT_NE(plan.reason.find("floor"), std::string::npos) << plan.reason;
    EXPECT_GT(plan.window.spilled_cells, 0u);
    EXPECT_EQ(plan.window.resident_cells + plan.window.spilled_cells, n_ctx);
    EXPECT_LE(plan.window.resident_bytes, plan.budget.bytes);
    EXPECT_EQ(plan.window.resident_bytes + plan.window.spilled_bytes, plan.kv_bytes);
    EXPECT_NE(log.text().find("auto KV tier = q4_0/q4_0 (floor"), std::string::npos) << log.text();
}

TEST(Planner, WeightsThatDoNotFitLeaveAZeroBudgetAndSpillEverything) {
    ModelSpec m = qwen14b_q8();
    ProbeValues small = rtx3090_solidpc();
    small.vram_total_mib = 8192;
    FixedProbeSource probe(small);
    ScopedLogCapture quiet;
    KvPlan plan = plan_kv(m, 4096, budget_for(m, small), auto_on(), probe);
    EXPECT_LT(plan.budget.raw_bytes, 0);
    EXPECT_EQ(plan.budget.bytes, 0u);
    EXPECT_EQ(kv_tier_name(plan.tier), "q4_0/q4_0");
    EXPECT_EQ(plan.window.resident_cells, 0u);
    EXPECT_EQ(plan.window.spilled_cells, 4096u);
}

// A host with a fast link, so the unclamped T* is large: the DCA ceiling decides whether
// f16 keeps its ~1.6 GiB spill (Policy C) or is quantized.
struct CeilingCase {
    double max_spill_mib;
    const char* tier;
    bool clamped;
};

class DcaCeiling : public ::testing::TestWithParam<CeilingCase> {};

TEST_P(DcaCeiling, ClampsTstar) {
    const CeilingCase& c = GetParam();
    ModelSpec m = qwen14b_q8();
    ProbeValues fast = rtx6000_bs2();
    fast.vram_bw_gbps = 150;   // slow VRAM: large t_resident (~185 ms)
    fast.host_ram_gbps = 120;  // fast host path
    fast.pcie_h2d_gbps = 128;
    PlanKnobs k = auto_on();
    k.max_spill_mib = c.max_spill_mib;
    FixedProbeSource probe(fast);
    ScopedLogCapture log;
    KvPlan plan = plan_kv(m, 65536, budget_for(m, fast, 27000), k, probe);
    const LadderRow& f16 = plan.ladder[0];
    ASSERT_TRUE(f16.tstar_unclamped_bytes);
    EXPECT_GT(*f16.tstar_unclamped_bytes / MiB, 3000.0);  // (0.2 * ~185 ms - 0.82) * 120 GB/s
    EXPECT_EQ(*f16.tstar_bytes, std::min<uint64_t>(*f16.tstar_unclamped_bytes, (uint64_t)(c.max_spill_mib * MiB)));
    EXPECT_EQ(kv_tier_name(plan.tier), c.tier);
    EXPECT_EQ(log.text().find("clamped from") != std::string::npos, c.clamped) << log.text();
    if (std::string(c.tier) == "f16/f16") {
        EXPECT_GT(plan.window.spilled_bytes, 0u);  // f16 kept, the window spills its tail
        EXPECT_NE(plan.reason.find("<= T*"), std::string::npos);
    }
}

INSTANTIATE_TEST_SUITE_P(Planner, DcaCeiling,
                         ::testing::Values(CeilingCase{800, "q8_0/q8_0", true},   // default: 1.6 GiB > 800 MiB
                                           CeilingCase{0, "q8_0/q8_0", true},     // 0: never spill by T*
                                           CeilingCase{2500, "f16/f16", true},    // ceiling above the spill
                                           CeilingCase{1e6, "f16/f16", false}));  // ceiling out of the way

TEST(Planner, FastPathCallsNoProbe) {
    ModelSpec m = qwen14b_q8();
    FixedProbeSource probe(rtx6000_bs2());
    ScopedLogCapture log;
    KvPlan plan = plan_kv(m, 65536, budget_for(m, rtx6000_bs2()), auto_on(), probe);  // 48 GiB, no target
    EXPECT_EQ(probe.calls(), 0);
    EXPECT_FALSE(plan.probed);
    EXPECT_EQ(kv_tier_name(plan.tier), "f16/f16");
    EXPECT_EQ(plan.window.spilled_cells, 0u);
    EXPECT_FALSE(plan.ladder[0].tstar_bytes);  // nothing measured, nothing predicted
    EXPECT_NE(log.text().find("auto KV tier = f16/f16 (fits; no measurement needed)"), std::string::npos) << log.text();

    // The fast path needs no measurements at all: an empty probe is never consulted.
    FixedProbeSource empty(ProbeValues{});
    EXPECT_NO_THROW(plan_kv(m, 65536, budget_for(m, rtx6000_bs2()), auto_on(), empty));
    EXPECT_EQ(empty.calls(), 0);
}

TEST(Planner, SwitchOffCallsNoProbeAndLogsNothing) {
    ModelSpec m = qwen14b_q8();
    struct Case {
        std::optional<KvType> k, v;
        const char* tier;
    };
    for (Case c : {Case{std::nullopt, std::nullopt, "f16/f16"}, Case{KvType::q8_0, std::nullopt, "q8_0/f16"},
                   Case{KvType::q8_0, KvType::q4_0, "q8_0/q4_0"}}) {
        PlanKnobs k;  // auto_tier defaults to off
        k.type_k = c.k;
        k.type_v = c.v;
        FixedProbeSource probe(ProbeValues{});  // nothing measured: must not be needed
        ScopedLogCapture log;
        KvPlan plan = plan_kv(m, 65536, budget_for(m, rtx6000_bs2(), 20000), k, probe);
        EXPECT_EQ(probe.calls(), 0);
        EXPECT_EQ(log.text(), "");
        EXPECT_TRUE(plan.diagnostics.empty());
        EXPECT_EQ(plan.mode, PlanMode::auto_off);
        EXPECT_EQ(kv_tier_name(plan.tier), c.tier);
        // The spill window is still computed.
        EXPECT_GT(plan.window.spilled_cells, 0u);
        EXPECT_EQ(plan.window.resident_cells + plan.window.spilled_cells, 65536u);
    }
}

TEST(Planner, MissingMeasurementsNameTheirSources) {
    ModelSpec m = qwen14b_q8();
    ProbeValues partial;
    partial.vram_bw_gbps = 960;
    FixedProbeSource probe(partial);
    ScopedLogCapture quiet;
    try {
        plan_kv(m, 65536, budget_for(m, rtx6000_bs2(), 27000), auto_on(), probe);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        std::string msg = e.what();
        EXPECT_NE(msg.find("--profile"), std::string::npos) << msg;
        EXPECT_NE(msg.find("--host-ram-gbps"), std::string::npos) << msg;
        EXPECT_NE(msg.find("--pcie-gbps"), std::string::npos) << msg;
        EXPECT_NE(msg.find("--c-engage-ms"), std::string::npos) << msg;
        EXPECT_EQ(msg.find("--vram-bw-gbps"), std::string::npos) << "VRAM bandwidth was given: " << msg;
    }
    // The host-RAM knob fills in for a missing probe value.
    ProbeValues no_ram = rtx6000_bs2();
    no_ram.host_ram_gbps.reset();
    PlanKnobs k = auto_on();
    k.host_ram_gbps = 9.3;
    FixedProbeSource probe2(no_ram);
    KvPlan plan = plan_kv(m, 65536, budget_for(m, rtx6000_bs2(), 27000), k, probe2);
    EXPECT_EQ(kv_tier_name(plan.tier), "q8_0/q8_0");
}

TEST(Budget, TermsAndVramTargetCap) {
    BudgetInputs in;
    in.vram_free_bytes = 49152 * kMiB;
    in.weight_bytes = 15000 * kMiB;
    in.compute_reserve_bytes = 1400 * kMiB;
    Budget b = compute_budget(in);
    EXPECT_FALSE(b.target_binds);
    EXPECT_EQ(b.bytes, (49152 - 15000 - 1400) * kMiB);
    in.vram_target_bytes = 27000 * kMiB;
    b = compute_budget(in);
    EXPECT_TRUE(b.target_binds);
    EXPECT_EQ(b.bytes, (27000 - 15000 - 1400) * kMiB);
    EXPECT_NE(describe_budget(b).find("min(free 49152, vram-target 27000)"), std::string::npos) << describe_budget(b);
    in.vram_target_bytes = 60000 * kMiB;  // a target above free VRAM does not raise the budget
    EXPECT_EQ(compute_budget(in).bytes, (49152 - 15000 - 1400) * kMiB);
}
