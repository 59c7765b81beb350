#include "quality/gate_cells.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace spillway {
namespace {

const CellResult* find_cell(const std::vector<CellResult>& cells, GateCell which) {
    for (const CellResult& c : cells)
        if (c.cell == which && !c.unavailable) return &c;
    return nullptr;
}

std::string fmt(const char* format, double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, x);
    return buf;
}

std::string missing(const std::vector<CellResult>& cells, GateCell which, const char* what) {
    for (const CellResult& c : cells)
        if (c.cell == which && c.unavailable) return std::string(gate_cell_name(which)) + " " + what + " not available: " + *c.unavailable;
    return std::string(gate_cell_name(which)) + " " + what + " not measured";
}

// The resident (or, for f16 when it spills, spilled) cell whose speed the tier auto chose
// should reproduce.
std::optional<GateCell> cell_of_tier(const AutoDecision& d) {
    if (d.tier == "f16/f16") return d.f16_spills ? GateCell::f16_spill : GateCell::f16_resident;
    if (d.tier == "q8_0/q8_0") return GateCell::q8_resident;
    return std::nullopt;
}

GateCheck check_auto_choice(const std::vector<CellResult>& cells, const std::optional<AutoDecision>& d) {
    GateCheck c{1, "the tier auto chose, and why", CheckStatus::not_available, ""};
    const CellResult* a = find_cell(cells, GateCell::auto_tier);
    std::string planned = d ? "the planner (" + d->source + ") chooses " + d->tier + ": " + d->reason
                            : "no planner decision (give --profile FILE)";
    if (!a || !a->chosen_tier) {
        c.detail = planned + "; " + missing(cells, GateCell::auto_tier, "cell");
        return c;
    }
    if (!d) {
        c.detail = "auto chose " + *a->chosen_tier + "; " + planned;
        return c;
    }
    c.status = *a->chosen_tier == d->tier ? CheckStatus::pass : CheckStatus::fail;
    c.detail = "auto chose " + *a->chosen_tier + ", " + planned;
    return c;
}

GateCheck check_spill_drop(const std::vector<CellResult>& cells, const std::optional<AutoDecision>& d,
                           const GateThresholds& t) {
    GateCheck c{2, "the spill's measured tok/s drop vs the target", CheckStatus::not_available, ""};
    const CellResult* res = find_cell(cells, GateCell::f16_resident);
    const CellResult* spill = find_cell(cells, GateCell::f16_spill);
    if (!res || !res->decode_tok_s) {
        c.detail = missing(cells, GateCell::f16_resident, "decode tok/s");
        return c;
    }
    if (!spill || !spill->decode_tok_s) {
        c.detail = missing(cells, GateCell::f16_spill, "decode tok/s");
        return c;
    }
    const double drop = 1.0 - *spill->decode_tok_s / *res->decode_tok_s;
    const std::string measured = "f16_spill drop " + fmt("%.1f%%", 100 * drop) + " (" + fmt("%.2f", *res->decode_tok_s) +
                                 " -> " + fmt("%.2f", *spill->decode_tok_s) + " tok/s), target " +
                                 fmt("%.0f%%", 100 * t.tstar_drop);
    if (!d) {
        c.detail = measured + "; no planner decision to check it against";
        return c;
    }
    if (!d->f16_spills) {
        c.detail = measured + "; f16 fits the budget (" + d->source +
                   "), so auto spills nothing and the drop decides nothing: force the spill with --vram-target";
        return c;
    }
    // Rejecting f16 is right when its spill costs more than the target; keeping it, when not.
    const bool kept_f16 = d->tier == "f16/f16";
    const bool ok = kept_f16 ? drop <= t.tstar_drop : drop > t.tstar_drop;
    c.status = ok ? CheckStatus::pass : CheckStatus::fail;
    c.detail = measured + (kept_f16 ? "; auto kept f16, so the drop must be within the target"
                                    : "; auto rejected f16, so the drop must exceed the target");
    return c;
}

GateCheck check_q8_quality(const std::vector<CellResult>& cells, const GateThresholds& t) {
    GateCheck c{3, "q8 niah vs f16 niah", CheckStatus::not_available, ""};
    const CellResult* f16 = find_cell(cells, GateCell::f16_resident);
    const CellResult* q8 = find_cell(cells, GateCell::q8_resident);
    if (!f16 || !f16->niah) {
        c.detail = missing(cells, GateCell::f16_resident, "niah");
        return c;
    }
    if (!q8 || !q8->niah) {
        c.detail = missing(cells, GateCell::q8_resident, "niah");
        return c;
    }
    std::string kl = q8->kl_vs_f16 ? ", KL vs f16 " + fmt("%.3g", *q8->kl_vs_f16) + " nats" : "";
    c.detail = "q8 niah " + fmt("%.1f", *q8->niah) + ", f16 niah " + fmt("%.1f", *f16->niah) + kl;
    // A model that cannot retrieve at f16 says nothing about what q8 costs.
    if (*f16->niah <= 0) {
        c.detail += "; f16 niah is 0, so this model cannot retrieve and the comparison is vacuous (needs a trained model)";
        return c;
    }
    c.status = *q8->niah >= *f16->niah - t.niah_tolerance ? CheckStatus::pass : CheckStatus::fail;
    if (t.niah_tolerance > 0) c.detail += " (tolerance " + fmt("%.1f", t.niah_tolerance) + " points)";
    return c;
}

GateCheck check_fallback_speed(const std::vector<CellResult>& cells, const std::optional<AutoDecision>& d,
                               const GateThresholds& t) {
    GateCheck c{4, "the fallback is at least as fast as the rejected spill; auto matches its tier",
                CheckStatus::not_available, ""};
    const CellResult* spill = find_cell(cells, GateCell::f16_spill);
    const CellResult* a = find_cell(cells, GateCell::auto_tier);
    if (!d) {
        c.detail = "no planner decision (give --profile FILE)";
        return c;
    }
    if (!a || !a->decode_tok_s) {
        c.detail = missing(cells, GateCell::auto_tier, "decode tok/s");
        return c;
    }
    const auto tier_cell = cell_of_tier(*d);
    if (!tier_cell) {
        c.detail = "auto chose " + d->tier + ", which has no cell of its own to compare with";
        return c;
    }
    const CellResult* chosen = find_cell(cells, *tier_cell);
    if (!chosen || !chosen->decode_tok_s) {
        c.detail = missing(cells, *tier_cell, "decode tok/s");
        return c;
    }
    const double match = std::fabs(*a->decode_tok_s / *chosen->decode_tok_s - 1.0);
    bool ok = match <= t.auto_match_tolerance;
    c.detail = "auto " + fmt("%.2f", *a->decode_tok_s) + " tok/s vs " + gate_cell_name(*tier_cell) + " " +
               fmt("%.2f", *chosen->decode_tok_s) + " (" + fmt("%.1f%%", 100 * match) + " apart, tolerance " +
               fmt("%.0f%%", 100 * t.auto_match_tolerance) + ")";
    if (*tier_cell != GateCell::f16_spill && *tier_cell != GateCell::f16_resident) {
        if (!spill || !spill->decode_tok_s) {
            c.detail += "; " + missing(cells, GateCell::f16_spill, "decode tok/s");
            return c;
        }
        ok = ok && *chosen->decode_tok_s >= *spill->decode_tok_s;
        c.detail += "; fallback " + fmt("%.2f", *chosen->decode_tok_s) + " vs rejected spill " +
                    fmt("%.2f", *spill->decode_tok_s) + " tok/s";
    }
    c.status = ok ? CheckStatus::pass : CheckStatus::fail;
    return c;
}

std::string opt_text(const std::optional<double>& v, const char* format) { return v ? fmt(format, *v) : "-"; }

}  // namespace

const char* gate_cell_name(GateCell cell) {
    switch (cell) {
        case GateCell::f16_resident: return "f16_resident";
        case GateCell::f16_spill: return "f16_spill";
        case GateCell::q8_resident: return "q8_resident";
        case GateCell::auto_tier: return "auto";
    }
    return "?";
}

const char* check_status_name(CheckStatus status) {
    switch (status) {
        case CheckStatus::pass: return "PASS";
        case CheckStatus::fail: return "FAIL";
        case CheckStatus::not_available: return "NOT AVAILABLE";
    }
    return "?";
}

std::vector<GateCheck> evaluate_gate_checks(const std::vector<CellResult>& cells,
                                            const std::optional<AutoDecision>& decision,
                                            const GateThresholds& thresholds) {
    return {check_auto_choice(cells, decision), check_spill_drop(cells, decision, thresholds),
            check_q8_quality(cells, thresholds), check_fallback_speed(cells, decision, thresholds)};
}

std::string format_gate_table(const std::vector<CellResult>& cells) {
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%-13s %-10s %11s %6s %16s %12s  %s\n", "cell", "KV tier", "spilled MiB", "niah",
                  "KL vs f16_res", "decode tok/s", "chosen tier");
    out += line;
    for (const CellResult& c : cells) {
        if (c.unavailable) {
            std::string chosen = c.chosen_tier ? "   chosen tier: " + *c.chosen_tier + (c.chosen_note.empty() ? "" : " (" + c.chosen_note + ")") : "";
            std::snprintf(line, sizeof line, "%-13s not available: %s%s\n", gate_cell_name(c.cell), c.unavailable->c_str(),
                          chosen.c_str());
            out += line;
            continue;
        }
        std::string kl = c.kl_reference ? "ref" : opt_text(c.kl_vs_f16, "%.3g");
        std::string chosen = c.chosen_tier ? *c.chosen_tier + (c.chosen_note.empty() ? "" : " (" + c.chosen_note + ")") : "-";
        std::snprintf(line, sizeof line, "%-13s %-10s %11s %6s %16s %12s  %s\n", gate_cell_name(c.cell), c.kv_tier.c_str(),
                      opt_text(c.spilled_mib, "%.0f").c_str(), opt_text(c.niah, "%.1f").c_str(), kl.c_str(),
                      opt_text(c.decode_tok_s, "%.2f").c_str(), chosen.c_str());
        out += line;
    }
    return out;
}

std::string format_gate_checks(const std::vector<GateCheck>& checks) {
    std::string out;
    for (const GateCheck& c : checks)
        out += "(" + std::to_string(c.number) + ") " + check_status_name(c.status) + "  " + c.title + "\n    " + c.detail + "\n";
    return out;
}

nlohmann::json gate_cells_json(const std::vector<CellResult>& cells, const std::vector<GateCheck>& checks,
                               const std::optional<AutoDecision>& decision) {
    auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    nlohmann::json j;
    j["cells"] = nlohmann::json::array();
    for (const CellResult& c : cells)
        j["cells"].push_back({{"cell", gate_cell_name(c.cell)},
                              {"available", !c.unavailable.has_value()},
                              {"unavailable_reason", opt(c.unavailable)},
                              {"kv_tier", c.unavailable ? nlohmann::json(nullptr) : nlohmann::json(c.kv_tier)},
                              {"spilled_mib", opt(c.spilled_mib)},
                              {"niah", opt(c.niah)},
                              {"kl_reference", c.kl_reference},
                              {"kl_vs_f16_resident", opt(c.kl_vs_f16)},
                              {"top1_vs_f16_resident", opt(c.top1_vs_f16)},
                              {"decode_tok_s", opt(c.decode_tok_s)},
                              {"chosen_tier", opt(c.chosen_tier)},
                              {"chosen_note", c.chosen_note}});
    j["checks"] = nlohmann::json::array();
    for (const GateCheck& c : checks)
        j["checks"].push_back({{"number", c.number}, {"title", c.title}, {"status", check_status_name(c.status)},
                               {"detail", c.detail}});
    if (decision)
        j["auto_decision"] = {{"tier", decision->tier}, {"reason", decision->reason},
                              {"f16_spills", decision->f16_spills}, {"source", decision->source}};
    else
        j["auto_decision"] = nullptr;
    return j;
}

}  // namespace spillway
