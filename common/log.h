#pragma once
// One levelled logger for the library. The CLI prints results on stdout; the library
// reports decisions and progress through this (stderr by default). Tests install a sink.
#include <functional>
#include <string>

namespace spillway {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

using LogSink = std::function<void(LogLevel, const std::string&)>;

void log_message(LogLevel level, const std::string& message);
inline void log_error(const std::string& m) { log_message(LogLevel::error, m); }
inline void log_warn(const std::string& m) { log_message(LogLevel::warn, m); }
inline void log_info(const std::string& m) { log_message(LogLevel::info, m); }
inline void log_debug(const std::string& m) { log_message(LogLevel::debug, m); }

// Messages above this level are dropped. Default: warn (overridable by SPILLWAY_LOG=error|warn|info|debug).
void set_log_level(LogLevel level);
LogLevel log_level();

// Replaces the stderr sink; returns the previous one. An empty sink restores stderr.
LogSink set_log_sink(LogSink sink);

// Installs a sink for the lifetime of the object (tests use this to capture lines).
class ScopedLogCapture {
public:
    explicit ScopedLogCapture(LogLevel level = LogLevel::debug);
    ~ScopedLogCapture();
    ScopedLogCapture(const ScopedLogCapture&) = delete;
    ScopedLogCapture& operator=(const ScopedLogCapture&) = delete;
    const std::string& text() const { return text_; }
    int count(LogLevel level) const;

private:
    std::string text_;
    int counts_[4] = {0, 0, 0, 0};
    LogSink previous_;
    LogLevel previous_level_;
};

const char* log_level_name(LogLevel level);

}  // namespace spillway
