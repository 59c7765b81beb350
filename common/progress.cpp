#include "common/progress.h"

#include <unistd.h>

#include <cstdio>

namespace spillway {

ProgressBar::ProgressBar(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total ? total : 1),
      enabled_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()), last_time_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t done) {
    if (!enabled_ || finished_) return;
    auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_time_ < std::chrono::milliseconds(100)) return;
    last_time_ = now;
    const int width = 30;
    double fraction = done >= total_ ? 1.0 : (double)done / (double)total_;
    int filled = (int)(fraction * width);
    double seconds = std::chrono::duration<double>(now - start_).count();
    std::string bar(filled, '=');
    bar.resize(width, ' ');
    std::fprintf(stderr, "\r%s [%s] %5.1f%% %.1fs", label_.c_str(), bar.c_str(), fraction * 100.0, seconds);
    std::fflush(stderr);
    last_drawn_ = done;
}

void ProgressBar::finish() {
    if (!enabled_ || finished_) return;
    last_time_ = {};
    update(total_);
    std::fprintf(stderr, "\n");
    finished_ = true;
}

}  // namespace spillway
