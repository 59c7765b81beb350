// Lab knobs: environment switches that restore an earlier, measured-slower behaviour so that
// an A/B runs on one binary (README's knob table, docs/perf-notes.md). A value the knob does
// not know is an error, so a typo cannot silently measure the default twice.
#pragma once

#include <cstdlib>
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

}  // namespace spillway
