#include "common/parse.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "common/error.h"

namespace spillway {

double parse_double(const std::string& text, const std::string& what) {
    if (text.empty()) fail(what + ": expected a number, got an empty value");
    const char* begin = text.c_str();
    char* end = nullptr;
    errno = 0;
    double value = std::strtod(begin, &end);
    if (end == begin || *end != '\0') fail(what + ": '" + text + "' is not a number");
    if (errno == ERANGE || !std::isfinite(value)) fail(what + ": '" + text + "' is not a finite number");
    return value;
}

double parse_double_in(const std::string& text, const std::string& what, double lo, double hi) {
    double value = parse_double(text, what);
    if (value < lo || value > hi)
        fail(what + ": " + text + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return value;
}

int64_t parse_int(const std::string& text, const std::string& what) {
    if (text.empty()) fail(what + ": expected an integer, got an empty value");
    const char* begin = text.c_str();
    char* end = nullptr;
    errno = 0;
    long long value = std::strtoll(begin, &end, 10);
    if (end == begin || *end != '\0') fail(what + ": '" + text + "' is not an integer");
    if (errno == ERANGE) fail(what + ": '" + text + "' is out of range");
    return value;
}

int64_t parse_int_in(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
    int64_t value = parse_int(text, what);
    if (value < lo || value > hi)
        fail(what + ": " + text + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return value;
}

bool parse_bool(const std::string& text, const std::string& what) {
    std::string t = text;
    std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
    if (t == "1" || t == "true" || t == "on" || t == "yes") return true;
    if (t == "0" || t == "false" || t == "off" || t == "no") return false;
    fail(what + ": '" + text + "' is not a boolean (use 1/0, on/off, true/false)");
}

std::optional<std::string> env_lookup(std::initializer_list<const char*> names, std::string* found_name) {
    for (const char* name : names) {
        if (const char* value = std::getenv(name)) {
            if (found_name) *found_name = name;
            return std::string(value);
        }
    }
    return std::nullopt;
}

}  // namespace spillway
