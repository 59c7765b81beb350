#pragma once
// The CLI tests' one way to run a command as a user's script would: through the shell, keeping
// the exit status and stdout (a command that wants stderr too ends in `2>&1`).
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace spillway::cli_test {

struct CommandRun {
    int status = -1;  // the exit status; -1 if the command could not start or was killed
    std::string out;
};

inline CommandRun run_command(const std::string& cmd) {
    CommandRun r;
    FILE* pipe = popen(cmd.c_str(), "r");
    if (!pipe) return r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
    const int st = pclose(pipe);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

}  // namespace spillway::cli_test
