#pragma once
// One error type for everything the user can cause (bad file, bad flag, out of memory):
// callers catch spillway::Error at the CLI boundary and print its message on one line.
#include <stdexcept>
#include <string>

namespace spillway {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

}  // namespace spillway
