#pragma once
// Strict parsing of numbers given by users (flags, environment variables, profile files).
// "12abc", "", "nan", "1e999" are all rejected with a message naming the setting.
#include <cstdint>
#include <optional>
#include <string>

namespace spillway {

// `what` names the setting in the error message, e.g. "--vram-target" or "SPILLWAY_KV_TSTAR_DROP".
double parse_double(const std::string& text, const std::string& what);
double parse_double_in(const std::string& text, const std::string& what, double lo, double hi);
int64_t parse_int(const std::string& text, const std::string& what);
int64_t parse_int_in(const std::string& text, const std::string& what, int64_t lo, int64_t hi);
// Accepts 1/0, true/false, on/off, yes/no (case-insensitive).
bool parse_bool(const std::string& text, const std::string& what);

// Value of the first set variable among `names` (the SPILLWAY_ name first, then aliases).
// `found_name`, when given, receives the name that was set.
std::optional<std::string> env_lookup(std::initializer_list<const char*> names,
                                      std::string* found_name = nullptr);

}  // namespace spillway
