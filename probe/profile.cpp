#include "probe/profile.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace spillway {

namespace {

using nlohmann::json;

struct NumberField {
    const char* key;
    std::optional<double> ProbeValues::*member;
    bool required;
    bool zero_allowed;
};

const NumberField kNumberFields[] = {
    {"vram_total_mib", &ProbeValues::vram_total_mib, true, false},
    {"vram_free_mib", &ProbeValues::vram_free_mib, false, false},
    {"vram_bw_gbps", &ProbeValues::vram_bw_gbps, true, false},
    {"pcie_h2d_gbps", &ProbeValues::pcie_h2d_gbps, true, false},
    {"host_ram_gbps", &ProbeValues::host_ram_gbps, true, false},
    // The engagement step may measure as zero on some hosts; it may not be negative.
    {"c_engage_ms", &ProbeValues::c_engage_ms, true, true},
};

const std::set<std::string> kTextFields = {"name", "gpu_name", "source", "notes", "attn_ms_per_cell"};

// A JSON number that is finite and positive (or >= 0); otherwise a message.
std::optional<std::string> check_number(const json& value, bool zero_allowed, double* out) {
    if (!value.is_number()) return std::string("must be a number, got ") + value.type_name();
    double x = value.get<double>();
    if (!std::isfinite(x)) return "must be a finite number";
    if (x < 0) return "must not be negative (got " + value.dump() + ")";
    if (x == 0 && !zero_allowed) return "must be greater than 0";
    *out = x;
    return std::nullopt;
}

}  // namespace

ProbeValues parse_probe_profile(const std::string& text, const std::string& what) {
    json doc;
    try {
        doc = json::parse(text);
    } catch (const json::exception& e) {  // syntax errors, and numbers like 1e999 (out_of_range)
        fail(what + ": not valid JSON: " + e.what());
    }
    if (!doc.is_object()) fail(what + ": a profile must be a JSON object");

    ProbeValues values;
    values.origin = "profile " + what;
    std::vector<std::string> errors;
    for (const NumberField& f : kNumberFields) {
        auto it = doc.find(f.key);
        if (it == doc.end()) {
            if (f.required) errors.push_back(std::string("missing field \"") + f.key + "\"");
            continue;
        }
        double x = 0;
        if (auto err = check_number(*it, f.zero_allowed, &x))
            errors.push_back(std::string("field \"") + f.key + "\" " + *err);
        else
            values.*f.member = x;
    }
    if (auto it = doc.find("gpu_name"); it != doc.end()) {
        if (it->is_string()) values.gpu_name = it->get<std::string>();
        else errors.push_back("field \"gpu_name\" must be a string");
    } else {
        errors.push_back("missing field \"gpu_name\"");
    }
    if (auto it = doc.find("attn_ms_per_cell"); it != doc.end()) {
        if (!it->is_object()) {
            errors.push_back("field \"attn_ms_per_cell\" must be an object like {\"f16\": 6.2e-4}");
        } else {
            for (auto& [tier, value] : it->items()) {
                std::string field = "attn_ms_per_cell." + tier;
                auto type = kv_type_from_name(tier);
                double x = 0;
                if (!type) errors.push_back("field \"" + field + "\": unknown KV type (f16, q8_0, q4_0)");
                else if (auto err = check_number(value, false, &x)) errors.push_back("field \"" + field + "\" " + *err);
                else values.attn_ms_per_cell[*type] = x;
            }
        }
    }
    if (values.vram_free_mib && values.vram_total_mib && *values.vram_free_mib > *values.vram_total_mib)
        errors.push_back("field \"vram_free_mib\" exceeds \"vram_total_mib\"");
    // Unknown keys are usually typos ("pcie_gbps"); silently ignoring one would let a
    // default stand in for a number the user meant to give.
    for (auto& [key, value] : doc.items()) {
        bool known = kTextFields.count(key) > 0;
        for (const NumberField& f : kNumberFields) known = known || key == f.key;
        if (!known) errors.push_back("unknown field \"" + key + "\"");
    }
    if (!errors.empty()) {
        std::string msg = what + ": invalid profile:";
        for (const std::string& e : errors) msg += "\n  " + e;
        fail(msg);
    }
    return values;
}

ProbeValues load_probe_profile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("--profile " + path + ": cannot open the file");
    std::stringstream buffer;
    buffer << in.rdbuf();
    if (in.bad()) fail("--profile " + path + ": read error");
    return parse_probe_profile(buffer.str(), path);
}

void apply_probe_overrides(ProbeValues& v, const ProbeOverrides& o) {
    auto apply = [&](std::optional<double> ProbeValues::*member, const std::optional<double>& value,
                     const char* label) {
        if (!value) return;
        v.*member = *value;
        v.overridden.push_back(label);
    };
    apply(&ProbeValues::vram_free_mib, o.vram_free_mib, "vram_free_mib (--vram-free-mib)");
    apply(&ProbeValues::vram_bw_gbps, o.vram_bw_gbps, "vram_bw_gbps (--vram-bw-gbps)");
    apply(&ProbeValues::pcie_h2d_gbps, o.pcie_h2d_gbps, "pcie_h2d_gbps (--pcie-gbps)");
    apply(&ProbeValues::host_ram_gbps, o.host_ram_gbps, "host_ram_gbps (--host-ram-gbps)");
    apply(&ProbeValues::c_engage_ms, o.c_engage_ms, "c_engage_ms (--c-engage-ms)");
}

std::string missing_measurements_message(const ProbeValues& v) {
    struct Need {
        bool missing;
        const char* what;
        const char* flag;
    };
    const Need needs[] = {
        {!v.vram_bw_gbps, "VRAM bandwidth", "--vram-bw-gbps G"},
        {!v.pcie_h2d_gbps, "pinned PCIe H2D bandwidth", "--pcie-gbps G"},
        {!v.host_ram_gbps, "host RAM bandwidth", "--host-ram-gbps G or SPILLWAY_KV_HOST_RAM_GBPS"},
        {!v.c_engage_ms, "streaming engagement cost c_engage", "--c-engage-ms MS"},
    };
    std::string msg = "the auto KV tier needs host/GPU measurements that do not exist here:";
    for (const Need& n : needs)
        if (n.missing) msg += std::string("\n  ") + n.what + " (" + n.flag + ")";
    msg += "\nno profile, override or cached measurement supplies them; pass --profile FILE "
           "(profiles/rtx3090-pcie4-ddr4.json, profiles/rtx6000ada-pcie5-ddr5.json, profiles/h200-sxm.json) "
           "or the flags above";
    return msg;
}

}  // namespace spillway
