#pragma once
// A one-line progress bar on stderr for long work (load, prefill, writing a model).
// Drawn only when stderr is a terminal, so logs and pipes stay clean.
#include <chrono>
#include <cstdint>
#include <string>

namespace spillway {

class ProgressBar {
public:
    ProgressBar(std::string label, uint64_t total, std::string unit = "");
    ~ProgressBar();
    void update(uint64_t done);
    void finish();

private:
    std::string label_, unit_;
    uint64_t total_;
    uint64_t last_drawn_ = UINT64_MAX;
    bool enabled_;
    bool finished_ = false;
    std::chrono::steady_clock::time_point start_, last_time_;
};

}  // namespace spillway
