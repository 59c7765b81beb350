#pragma once
// The probe cache: measured values in one JSON file under $XDG_CACHE_HOME/spillway/
// (SPILLWAY_CACHE_DIR overrides), keyed by GPU UUID, driver version and the attention shape
// class, so a different GPU, driver or model shape re-measures. A corrupt, unreadable or
// stale file is never fatal: it is reported at INFO and measured again.
#include <cstdint>
#include <optional>
#include <string>

#include "probe/probe_values.h"

namespace spillway {

// Bumped whenever what or how we measure changes; older entries are stale.
constexpr int kProbeCacheVersion = 2;  // 2: pinned H2D measured on the tail's copy pattern

struct ProbeCacheKey {
    std::string gpu_uuid;
    std::string driver;
    std::string shape_class;  // e.g. "hk128-hv128-g5": head dims and query heads per KV head
    std::string to_string() const { return gpu_uuid + "|" + driver + "|" + shape_class; }
};

std::string attention_shape_class(const ModelSpec& model);

// $SPILLWAY_CACHE_DIR/probes.json, else $XDG_CACHE_HOME/spillway/probes.json, else
// $HOME/.cache/spillway/probes.json.
std::string probe_cache_path();

// nullopt when the file or the entry is missing, corrupt, of another version, or older
// than max_age_days; the reason goes to the INFO log.
std::optional<ProbeValues> load_cached_probe(const std::string& path, const ProbeCacheKey& key,
                                             double max_age_days = 30.0);

// Adds or replaces the entry, keeping other valid entries; writes a temporary file and
// renames it so a crash never leaves half a cache. Throws spillway::Error on I/O failure.
void store_cached_probe(const std::string& path, const ProbeCacheKey& key, const ProbeValues& values);

}  // namespace spillway
