#pragma once
// The spec's T5 gate (spec/tstar_auto_spill.md, "T5 verdict"): four cells — f16_resident,
// f16_spill, q8_resident, auto — and four checks. This file turns what was measured into
// the table and the PASS/FAIL verdicts; it measures nothing itself, and a value that was not
// measured stays empty and is printed as such, never estimated.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace spillway {

enum class GateCell { f16_resident, f16_spill, q8_resident, auto_tier };
const char* gate_cell_name(GateCell cell);  // "f16_resident", ..., "auto"

struct CellResult {
    GateCell cell = GateCell::f16_resident;
    std::optional<std::string> unavailable;  // why the cell did not run ("needs the spill engine (issue 6)")
    std::string kv_tier;                     // the tier the cell runs ("f16/f16"); for auto, what it chose
    std::optional<double> spilled_mib;
    std::optional<double> niah;              // 0..100
    bool kl_reference = false;               // this cell is the KL reference (f16_resident)
    std::optional<double> kl_vs_f16;         // mean KL(f16_resident || cell), nats
    std::optional<double> top1_vs_f16;       // top-1 agreement with f16_resident, 0..1
    std::optional<double> decode_tok_s;
    std::optional<std::string> chosen_tier;  // auto only: the tier its boot chose
    std::string chosen_note;                 // e.g. "planned, not run"
};

// What the auto-tier decision is (from the planner, with the profile's terms) and why.
struct AutoDecision {
    std::string tier;     // "q8_0/q8_0"
    std::string reason;   // the planner's reason line
    bool f16_spills = false;  // f16/f16 does not fit the budget (the spill cell is meaningful)
    std::string source;   // "planner with profile FILE"
};

struct GateThresholds {
    double tstar_drop = 0.20;         // the target per-token drop of the spec
    double niah_tolerance = 0.0;      // q8 niah may be this many points below f16 niah
    double auto_match_tolerance = 0.05;  // auto's tok/s within this fraction of its tier's cell
};

enum class CheckStatus { pass, fail, not_available };
const char* check_status_name(CheckStatus status);  // "PASS", "FAIL", "NOT AVAILABLE"

struct GateCheck {
    int number = 0;
    std::string title;
    CheckStatus status = CheckStatus::not_available;
    std::string detail;
};

// cells: any subset in any order (a missing cell counts as unavailable).
std::vector<GateCheck> evaluate_gate_checks(const std::vector<CellResult>& cells,
                                            const std::optional<AutoDecision>& decision,
                                            const GateThresholds& thresholds);

std::string format_gate_table(const std::vector<CellResult>& cells);
std::string format_gate_checks(const std::vector<GateCheck>& checks);
nlohmann::json gate_cells_json(const std::vector<CellResult>& cells, const std::vector<GateCheck>& checks,
                               const std::optional<AutoDecision>& decision);

}  // namespace spillway
