#include "app/env_record.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

extern char** environ;

namespace spillway {

std::vector<EnvSetting> spillway_env_settings(const char* const* env) {
    std::vector<EnvSetting> settings;
    constexpr const char* kPrefix = "SPILLWAY_";
    for (const char* const* e = env; e != nullptr && *e != nullptr; ++e) {
        const char* entry = *e;
        if (std::strncmp(entry, kPrefix, std::strlen(kPrefix)) != 0) continue;
        if (std::strncmp(entry, "SPILLWAY_TEST_", 14) == 0) continue;
        const char* eq = std::strchr(entry, '=');
        if (eq == nullptr || eq[1] == '\0') continue;
        settings.push_back({std::string(entry, eq), std::string(eq + 1)});
    }
    std::sort(settings.begin(), settings.end(),
              [](const EnvSetting& a, const EnvSetting& b) { return a.name < b.name; });
    return settings;
}

std::vector<EnvSetting> spillway_env_settings() { return spillway_env_settings(environ); }

bool is_timing_bound(const EnvSetting& s) {
    // Any SPILLWAY_LAB_SKIP_* switch that is on; the hand-over skipped; the short kernel's
    // empty / per-KV-head bounds.
    if (s.name.rfind("SPILLWAY_LAB_SKIP_", 0) == 0) return s.value == "1";
    if (s.name == "SPILLWAY_HANDOVER") return s.value == "skip";
    if (s.name == "SPILLWAY_SHORT_ATTENTION_LAB") return s.value == "empty" || s.value == "kvheads";
    return false;
}

std::string env_settings_text(const std::vector<EnvSetting>& settings) {
    if (settings.empty()) return "none";
    std::string text;
    for (const EnvSetting& s : settings) text += (text.empty() ? "" : ", ") + s.name + "=" + s.value;
    return text;
}

size_t warn_timing_bounds(const std::vector<EnvSetting>& settings, const char* command) {
    size_t n = 0;
    for (const EnvSetting& s : settings)
        if (is_timing_bound(s)) {
            std::fprintf(stderr,
                         "spillway %s: warning: %s=%s is a lab timing bound: the engine skips work on purpose "
                         "and its output is wrong (unset it for real results)\n",
                         command, s.name.c_str(), s.value.c_str());
            ++n;
        }
    return n;
}

}  // namespace spillway
