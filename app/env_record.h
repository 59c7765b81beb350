#pragma once
// The SPILLWAY_* settings a command runs under. Lab knobs change the engine's path (README's
// knob table) and some of them are timing bounds whose output is wrong on purpose, so a bench
// result records them and both `bench` and `run` say when a timing bound is on: a knob left
// set after an A/B would otherwise pass its tok/s off as the engine's, or its noise as text.
#include <string>
#include <vector>

namespace spillway {

struct EnvSetting {
    std::string name;
    std::string value;
};

// Every SPILLWAY_* variable of env (a null-terminated "NAME=VALUE" array, as `environ`) set to a
// non-empty value, sorted by name; the test harness's SPILLWAY_TEST_* are left out.
std::vector<EnvSetting> spillway_env_settings(const char* const* env);

// The same for this process.
std::vector<EnvSetting> spillway_env_settings();

// Whether the setting makes the engine skip or falsify work to time what is left (the README
// rows marked "wrong output").
bool is_timing_bound(const EnvSetting& setting);

// "NAME=VALUE, NAME=VALUE" ("none" when empty).
std::string env_settings_text(const std::vector<EnvSetting>& settings);

// Prints one line on stderr per timing bound among settings, naming it; returns how many.
size_t warn_timing_bounds(const std::vector<EnvSetting>& settings, const char* command);

}  // namespace spillway
