// The four checks of the spec's T5 gate, on the spec's own measured table and on variations.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "quality/gate_cells.h"

using namespace spillway;

namespace {

CellResult measured(GateCell cell, const char* tier, double niah, double tok_s) {
    CellResult c;
    c.cell = cell;
    c.kv_tier = tier;
    c.niah = niah;
    c.decode_tok_s = tok_s;
    c.spilled_mib = cell == GateCell::f16_spill ? 1630 : 0;
    return c;
}

CellResult unavailable(GateCell cell) {
    CellResult c;
    c.cell = cell;
    c.unavailable = "needs the spill engine (issue 6)";
    return c;
}

// The spec's T5 verdict table (Qwen2.5-14B-1M, ctx 65536).
std::vector<CellResult> spec_table() {
    CellResult a = measured(GateCell::auto_tier, "q8_0/q8_0", 100.0, 35.28);
    a.chosen_tier = "q8_0/q8_0";
    return {measured(GateCell::f16_resident, "f16/f16", 100.0, 50.2), measured(GateCell::f16_spill, "f16/f16", 100.0, 10.81),
            measured(GateCell::q8_resident, "q8_0/q8_0", 100.0, 35.26), a};
}

AutoDecision q8_decision() { return {"q8_0/q8_0", "f16 spills 1630 MiB > T* 14 MiB; q8_0/q8_0 fits", true, "test"}; }

}  // namespace

TEST(GateChecks, SpecTableFromT5PassesAllFour) {
    const auto checks = evaluate_gate_checks(spec_table(), q8_decision(), {});
    ASSERT_EQ(checks.size(), 4u);
    for (const GateCheck& c : checks) EXPECT_EQ(c.status, CheckStatus::pass) << c.number << ": " << c.detail;
    EXPECT_NE(checks[1].detail.find("78.5%"), std::string::npos) << checks[1].detail;  // 50.2 -> 10.81
}

TEST(GateChecks, EachCheckFailsOnItsOwnDefect) {
    {   // (1) auto ran a different tier than the planner chose.
        auto cells = spec_table();
        cells[3].chosen_tier = "q4_0/q4_0";
        EXPECT_EQ(evaluate_gate_checks(cells, q8_decision(), {})[0].status, CheckStatus::fail);
    }
    {   // (2) the spill was cheap (5% drop) yet auto rejected f16.
        auto cells = spec_table();
        cells[1].decode_tok_s = 47.7;
        EXPECT_EQ(evaluate_gate_checks(cells, q8_decision(), {})[1].status, CheckStatus::fail);
        // ... and with f16 kept, a cheap spill is the right call.
        AutoDecision keep{"f16/f16", "spill within T*", true, "test"};
        cells[3].chosen_tier = "f16/f16";
        cells[3].decode_tok_s = 47.5;
        const auto checks = evaluate_gate_checks(cells, keep, {});
        EXPECT_EQ(checks[1].status, CheckStatus::pass);
        EXPECT_EQ(checks[3].status, CheckStatus::pass) << checks[3].detail;  // auto ~ f16_spill
    }
    {   // (3) q8 lost a needle; a tolerance can admit it.
        auto cells = spec_table();
        cells[2].niah = 97.5;
        EXPECT_EQ(evaluate_gate_checks(cells, q8_decision(), {})[2].status, CheckStatus::fail);
        GateThresholds loose;
        loose.niah_tolerance = 5;
        EXPECT_EQ(evaluate_gate_checks(cells, q8_decision(), loose)[2].status, CheckStatus::pass);
    }
    {   // (4) auto's speed does not match the tier it chose.
        auto cells = spec_table();
        cells[3].decode_tok_s = 30.0;
        EXPECT_EQ(evaluate_gate_checks(cells, q8_decision(), {})[3].status, CheckStatus::fail);
    }
    {   // (4) the fallback is slower than the spill it rejected.
        auto cells = spec_table();
        cells[1].decode_tok_s = 40.0;
        EXPECT_EQ(evaluate_gate_checks(cells, q8_decision(), {})[3].status, CheckStatus::fail);
    }
}

TEST(GateChecks, CellsWithoutTheSpillEngineAreNotAvailableNeverGuessed) {
    auto table = spec_table();
    std::vector<CellResult> cells = {table[0], unavailable(GateCell::f16_spill), table[2], unavailable(GateCell::auto_tier)};
    cells[3].chosen_tier = "q8_0/q8_0";
    const auto checks = evaluate_gate_checks(cells, q8_decision(), {});
    EXPECT_EQ(checks[0].status, CheckStatus::not_available);
    EXPECT_NE(checks[0].detail.find("chooses q8_0/q8_0"), std::string::npos) << checks[0].detail;
    EXPECT_NE(checks[0].detail.find("issue 6"), std::string::npos) << checks[0].detail;
    EXPECT_EQ(checks[1].status, CheckStatus::not_available);
    EXPECT_EQ(checks[2].status, CheckStatus::pass);
    EXPECT_EQ(checks[3].status, CheckStatus::not_available);

    const std::string table_text = format_gate_table(cells);
    EXPECT_NE(table_text.find("f16_spill     not available: needs the spill engine (issue 6)"), std::string::npos) << table_text;
    const nlohmann::json j = gate_cells_json(cells, checks, q8_decision());
    EXPECT_EQ(j["cells"][1]["available"], false);
    EXPECT_TRUE(j["cells"][1]["decode_tok_s"].is_null());
    EXPECT_TRUE(j["cells"][1]["niah"].is_null());
    EXPECT_EQ(j["checks"][2]["status"], "PASS");
    EXPECT_EQ(j["checks"][0]["status"], "NOT AVAILABLE");
    EXPECT_EQ(j["auto_decision"]["tier"], "q8_0/q8_0");
}

TEST(GateChecks, ModelThatCannotRetrieveMakesQualityCheckVacuous) {
    auto cells = spec_table();
    cells[0].niah = 0;
    cells[2].niah = 0;
    const auto checks = evaluate_gate_checks(cells, q8_decision(), {});
    EXPECT_EQ(checks[2].status, CheckStatus::not_available);
    EXPECT_NE(checks[2].detail.find("cannot retrieve"), std::string::npos);
}

TEST(GateChecks, SpillDropDecidesNothingWhenF16Fits) {
    AutoDecision fits{"f16/f16", "fits", false, "test"};
    auto cells = spec_table();
    cells[3].chosen_tier = "f16/f16";
    cells[3].decode_tok_s = 50.0;
    const auto checks = evaluate_gate_checks(cells, fits, {});
    EXPECT_EQ(checks[1].status, CheckStatus::not_available);
    EXPECT_NE(checks[1].detail.find("--vram-target"), std::string::npos);
    EXPECT_EQ(checks[3].status, CheckStatus::pass) << checks[3].detail;  // auto ~ f16_resident
}

TEST(GateChecks, NoPlannerDecisionLeavesDecisionChecksOpen) {
    const auto checks = evaluate_gate_checks(spec_table(), std::nullopt, {});
    EXPECT_EQ(checks[0].status, CheckStatus::not_available);
    EXPECT_EQ(checks[1].status, CheckStatus::not_available);
    EXPECT_NE(checks[1].detail.find("78.5%"), std::string::npos);  // the measured drop is still shown
    EXPECT_EQ(checks[2].status, CheckStatus::pass);
    EXPECT_EQ(checks[3].status, CheckStatus::not_available);
}
