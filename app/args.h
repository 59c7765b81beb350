#pragma once
// A small llama.cpp-style argument parser: multi-letter short flags (-ctk, -ngl), long flags,
// "--flag=value" and "--flag value", --help. CLI11 cannot express "-ctk", hence our own.
#include <optional>
#include <string>
#include <vector>

namespace spillway {

class ArgParser {
public:
    ArgParser(std::string command, std::string summary);

    // names: every spelling, e.g. {"-m", "--model"}; the first long one is the canonical key.
    void flag(std::vector<std::string> names, std::string help);
    void option(std::vector<std::string> names, std::string value_name, std::string help,
                std::string default_text = "");
    // Free text shown after the option list (examples, environment variables).
    void epilog(std::string text) { epilog_ = std::move(text); }

    // Throws spillway::Error on an unknown option, a missing value or a stray positional.
    void parse(int argc, char** argv);

    bool help_requested() const { return help_requested_; }
    std::string help() const;

    // Any spelling of the option may be used to ask.
    bool has(const std::string& name) const;
    std::optional<std::string> get(const std::string& name) const;  // last occurrence
    std::string get_or(const std::string& name, const std::string& fallback) const;
    std::vector<std::string> get_all(const std::string& name) const;
    // Typed, with the option's name in the error message.
    std::optional<double> get_double(const std::string& name) const;
    std::optional<int64_t> get_int(const std::string& name, int64_t lo, int64_t hi) const;

private:
    struct Spec {
        std::vector<std::string> names;
        std::string value_name, help, default_text;
        bool takes_value = false;
    };
    const Spec* find(const std::string& name) const;
    std::string display_name(const Spec& spec) const;

    std::string command_, summary_, epilog_;
    std::vector<Spec> specs_;
    std::vector<std::pair<const Spec*, std::string>> values_;
    bool help_requested_ = false;
};

}  // namespace spillway
