#include "app/args.h"

#include <sstream>

#include "common/error.h"
#include "common/parse.h"

namespace spillway {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void ArgParser::flag(std::vector<std::string> names, std::string help) {
    specs_.push_back({std::move(names), "", std::move(help), "", false});
}

void ArgParser::option(std::vector<std::string> names, std::string value_name, std::string help,
                       std::string default_text) {
    specs_.push_back({std::move(names), std::move(value_name), std::move(help), std::move(default_text), true});
}

const ArgParser::Spec* ArgParser::find(const std::string& name) const {
    for (const Spec& spec : specs_)
        for (const std::string& n : spec.names)
            if (n == name) return &spec;
    return nullptr;
}

std::string ArgParser::display_name(const Spec& spec) const {
    for (const std::string& n : spec.names)
        if (n.rfind("--", 0) == 0) return n;
    return spec.names.front();
}

void ArgParser::parse(int argc, char** argv) {
    for (int i = 0; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            help_requested_ = true;
            continue;
        }
        if (arg.size() < 2 || arg[0] != '-')
            fail("unexpected argument '" + arg + "' (see: spillway " + command_ + " --help)");
        std::string name = arg, value;
        bool inline_value = false;
        if (arg.rfind("--", 0) == 0) {
            size_t eq = arg.find('=');
            if (eq != std::string::npos) {
                name = arg.substr(0, eq);
                value = arg.substr(eq + 1);
                inline_value = true;
            }
        }
        const Spec* spec = find(name);
        if (!spec) fail("unknown option '" + name + "' (see: spillway " + command_ + " --help)");
        if (!spec->takes_value) {
            if (inline_value) fail("option '" + name + "' takes no value");
            values_.push_back({spec, "1"});
            continue;
        }
        if (!inline_value) {
            if (i + 1 >= argc) fail("option '" + name + "' needs a value (" + spec->value_name + ")");
            value = argv[++i];
        }
        values_.push_back({spec, value});
    }
}

std::string ArgParser::help() const {
    std::ostringstream out;
    out << "usage: spillway " << command_ << " [options]\n\n" << summary_ << "\n\noptions:\n";
    out << "  -h, --help" << std::string(26, ' ') << "show this help\n";
    for (const Spec& spec : specs_) {
        std::string left = "  ";
        for (size_t k = 0; k < spec.names.size(); ++k) left += (k ? ", " : "") + spec.names[k];
        if (spec.takes_value) left += " " + spec.value_name;
        if (left.size() < 36) left.resize(36, ' ');
        else left += "\n" + std::string(36, ' ');
        out << left << spec.help;
        if (!spec.default_text.empty()) out << " (default: " << spec.default_text << ")";
        out << "\n";
    }
    if (!epilog_.empty()) out << "\n" << epilog_ << "\n";
    return out.str();
}

bool ArgParser::has(const std::string& name) const {
    const Spec* spec = find(name);
    for (const auto& [s, v] : values_)
        if (s == spec) return true;
    return false;
}

std::optional<std::string> ArgParser::get(const std::string& name) const {
    const Spec* spec = find(name);
    std::optional<std::string> result;
    for (const auto& [s, v] : values_)
        if (s == spec) result = v;
    return result;
}

std::string ArgParser::get_or(const std::string& name, const std::string& fallback) const {
    auto v = get(name);
    return v ? *v : fallback;
}

std::vector<std::string> ArgParser::get_all(const std::string& name) const {
    const Spec* spec = find(name);
    std::vector<std::string> result;
    for (const auto& [s, v] : values_)
        if (s == spec) result.push_back(v);
    return result;
}

std::optional<double> ArgParser::get_double(const std::string& name) const {
    auto v = get(name);
    if (!v) return std::nullopt;
    return parse_double(*v, name);
}

std::optional<int64_t> ArgParser::get_int(const std::string& name, int64_t lo, int64_t hi) const {
    auto v = get(name);
    if (!v) return std::nullopt;
    return parse_int_in(*v, name, lo, hi);
}

}  // namespace spillway
