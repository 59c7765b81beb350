#include "probe/probe_cache.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "probe/profile.h"

namespace spillway {
namespace {

using nlohmann::json;

double now_unix_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The same field names as a --profile file, so an entry's "values" is a valid profile.
json values_to_json(const ProbeValues& v) {
    json j;
    j["gpu_name"] = v.gpu_name;
    auto put = [&](const char* name, const std::optional<double>& x) {
        if (x) j[name] = *x;
    };
    put("vram_total_mib", v.vram_total_mib);
    put("vram_free_mib", v.vram_free_mib);
    put("vram_bw_gbps", v.vram_bw_gbps);
    put("pcie_h2d_gbps", v.pcie_h2d_gbps);
    put("host_ram_gbps", v.host_ram_gbps);
    put("c_engage_ms", v.c_engage_ms);
    if (!v.attn_ms_per_cell.empty()) {
        json a = json::object();
        for (const auto& [type, ms] : v.attn_ms_per_cell) a[kv_type_name(type)] = ms;
        j["attn_ms_per_cell"] = a;
    }
    return j;
}

std::optional<json> read_cache_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::stringstream buffer;
    buffer << in.rdbuf();
    try {
        json doc = json::parse(buffer.str());
        if (!doc.is_object() || !doc.contains("entries") || !doc["entries"].is_object()) {
            log_info("probe cache " + path + ": unexpected layout, ignoring it");
            return std::nullopt;
        }
        return doc;
    } catch (const json::exception& e) {
        log_info("probe cache " + path + ": corrupt (" + std::string(e.what()) + "), ignoring it");
        return std::nullopt;
    }
}

}  // namespace

std::string attention_shape_class(const ModelSpec& model) {
    uint32_t group = 1;
    if (!model.layers.empty() && model.layers[0].n_head_kv)
        group = model.layers[0].n_head / model.layers[0].n_head_kv;
    return "hk" + std::to_string(model.head_dim_k) + "-hv" + std::to_string(model.head_dim_v) + "-g" +
           std::to_string(group);
}

std::string probe_cache_path() {
    if (const char* dir = std::getenv("SPILLWAY_CACHE_DIR"); dir && *dir) return std::string(dir) + "/probes.json";
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/spillway/probes.json";
    if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/spillway/probes.json";
    return "./.spillway-cache/probes.json";
}

std::optional<ProbeValues> load_cached_probe(const std::string& path, const ProbeCacheKey& key, double max_age_days) {
    auto doc = read_cache_file(path);
    if (!doc) return std::nullopt;
    const json& entries = (*doc)["entries"];
    auto it = entries.find(key.to_string());
    if (it == entries.end()) return std::nullopt;
    const json& entry = *it;
    try {
        if (entry.value("version", 0) != kProbeCacheVersion) {
            log_info("probe cache: entry for " + key.to_string() + " is from another probe version, re-measuring");
            return std::nullopt;
        }
        double age_days = (now_unix_seconds() - entry.at("measured_at").get<double>()) / 86400.0;
        if (!(age_days >= -1.0 && age_days <= max_age_days)) {
            log_info("probe cache: entry for " + key.to_string() + " is stale, re-measuring");
            return std::nullopt;
        }
        ProbeValues values = parse_probe_profile(entry.at("values").dump(), "probe cache " + path);
        values.origin = "cache " + path;
        return values;
    } catch (const json::exception& e) {
        log_info("probe cache: entry for " + key.to_string() + " is corrupt (" + e.what() + "), re-measuring");
    } catch (const Error& e) {
        log_info(std::string("probe cache: ") + e.what() + ", re-measuring");
    }
    return std::nullopt;
}

void store_cached_probe(const std::string& path, const ProbeCacheKey& key, const ProbeValues& values) {
    json doc = read_cache_file(path).value_or(json{{"entries", json::object()}});
    doc["format"] = "spillway probe cache";
    doc["entries"][key.to_string()] = json{{"version", kProbeCacheVersion},
                                           {"measured_at", now_unix_seconds()},
                                           {"gpu_uuid", key.gpu_uuid},
                                           {"driver", key.driver},
                                           {"shape_class", key.shape_class},
                                           {"values", values_to_json(values)}};
    std::filesystem::path target(path);
    std::error_code ec;
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) fail("probe cache: cannot create " + target.parent_path().string() + ": " + ec.message());
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) fail("probe cache: cannot write " + tmp + ": " + std::strerror(errno));
        out << doc.dump(2) << "\n";
        out.flush();
        if (!out) {
            std::remove(tmp.c_str());
            fail("probe cache: write to " + tmp + " failed: " + std::strerror(errno));
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::string why = std::strerror(errno);
        std::remove(tmp.c_str());
        fail("probe cache: cannot move " + tmp + " to " + path + ": " + why);
    }
}

}  // namespace spillway
