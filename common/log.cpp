#include "common/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace spillway {
namespace {

std::mutex g_log_mutex;
LogSink g_sink;

LogLevel initial_level() {
    const char* env = std::getenv("SPILLWAY_LOG");
    if (!env) return LogLevel::warn;
    if (!std::strcmp(env, "error")) return LogLevel::error;
    if (!std::strcmp(env, "info")) return LogLevel::info;
    if (!std::strcmp(env, "debug")) return LogLevel::debug;
    return LogLevel::warn;
}

LogLevel& level_ref() {
    static LogLevel level = initial_level();
    return level;
}

}  // namespace

const char* log_level_name(LogLevel level) {
    switch (level) {
        case LogLevel::error: return "error";
        case LogLevel::warn: return "warn";
        case LogLevel::info: return "info";
        case LogLevel::debug: return "debug";
    }
    return "?";
}

void log_message(LogLevel level, const std::string& message) {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    if (static_cast<int>(level) > static_cast<int>(level_ref())) return;
    if (g_sink) {
        g_sink(level, message);
        return;
    }
    std::fprintf(stderr, "spillway %s: %s\n", log_level_name(level), message.c_str());
}

void set_log_level(LogLevel level) {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    level_ref() = level;
}

LogLevel log_level() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    return level_ref();
}

LogSink set_log_sink(LogSink sink) {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    LogSink previous = std::move(g_sink);
    g_sink = std::move(sink);
    return previous;
}

ScopedLogCapture::ScopedLogCapture(LogLevel level) : previous_level_(log_level()) {
    set_log_level(level);
    previous_ = set_log_sink([this](LogLevel l, const std::string& m) {
        text_ += std::string(log_level_name(l)) + ": " + m + "\n";
        counts_[static_cast<int>(l)]++;
    });
}

ScopedLogCapture::~ScopedLogCapture() {
    set_log_sink(std::move(previous_));
    set_log_level(previous_level_);
}

int ScopedLogCapture::count(LogLevel level) const { return counts_[static_cast<int>(level)]; }

}  // namespace spillway
