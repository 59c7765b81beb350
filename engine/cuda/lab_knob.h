// Lab knobs: environment switches that restore an earlier, measured-slower behaviour so that
// an A/B runs on one binary (README's knob table, docs/perf-notes.md). A value the knob does
// not know is an error, so a typo cannot silently measure the default twice.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "common/error.h"

namespace spillway {

// True when `name` is set to `value`; false when unset, empty or `default_value`.
inline bool lab_knob(const char* name, const char* value, const char* default_value) {
    const char* e = std::getenv(name);
    if (e == nullptr || *e == '\0') return false;
    const std::string v(e);
    if (v == value) return true;
    if (v == default_value) return false;
    fail(std::string(name) + " must be '" + value + "' or '" + default_value + "', got '" + v + "'");
}

// The unsigned value of `name` (base 0 also reads 0x... bit masks); default_value when unset
// or empty; anything but a number in 0..max is an error.
inline uint32_t lab_knob_uint(const char* name, uint32_t default_value, uint32_t max, int base = 10) {
    const char* e = std::getenv(name);
    if (e == nullptr || *e == '\0') return default_value;
    char* end = nullptr;
    const unsigned long v = std::strtoul(e, &end, base);
    if (*end != '\0' || *e == '-' || v > max)
        fail(std::string(name) + ": expected 0.." + std::to_string(max) + ", got '" + e + "'");
    return (uint32_t)v;
}

// Which of `values` `name` is set to (its index); -1 when unset or empty (the caller's
// default); any other value is an error that lists the choices.
inline int lab_knob_choice(const char* name, std::initializer_list<const char*> values) {
    const char* e = std::getenv(name);
    if (e == nullptr || *e == '\0') return -1;
    const std::string v(e);
    int i = 0;
    std::string choices;
    for (const char* value : values) {
        if (v == value) return i;
        choices += (i++ > 0 ? ", '" : "'") + std::string(value) + "'";
    }
    fail(std::string(name) + " must be one of " + choices + ", got '" + v + "'");
}

}  // namespace spillway
