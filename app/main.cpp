#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "app/commands.h"
#include "common/error.h"

namespace {

struct Command {
    const char* name;
    int (*run)(int, char**);
    const char* summary;
};

const Command kCommands[] = {
    {"bench", spillway::cmd_bench, "measure prefill and decode speed of the CUDA engine against the roofline"},
    {"gate", spillway::cmd_gate, "quality gate: RULER niah, KL of KV tiers vs f16, the spec's four-cell table"},
    {"info", spillway::cmd_info, "show a GGUF model's shape, tensors and KV size per tier"},
    {"make-model", spillway::cmd_make_model, "write a synthetic GGUF model of a preset shape"},
    {"probe", spillway::cmd_probe, "measure (or load cached) GPU and host bandwidths and costs"},
    {"plan", spillway::cmd_plan, "decide the KV tier and spill for a model, context and GPU"},
    {"run", spillway::cmd_run, "generate text with a GGUF model (CPU or CUDA engine)"},
};

void print_usage(FILE* out) {
    std::fprintf(out, "usage: spillway <command> [options]   (spillway <command> --help for details)\n\ncommands:\n");
    for (const Command& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    std::string name = argv[1];
    if (name == "-h" || name == "--help" || name == "help") {
        print_usage(stdout);
        return 0;
    }
    for (const Command& c : kCommands) {
        if (name != c.name) continue;
        try {
            return c.run(argc - 2, argv + 2);
        } catch (const spillway::Error& e) {
            std::fprintf(stderr, "spillway %s: error: %s\n", c.name, e.what());
            return 1;
        } catch (const std::bad_alloc&) {
            std::fprintf(stderr, "spillway %s: error: out of host memory\n", c.name);
            return 1;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "spillway %s: internal error: %s\n", c.name, e.what());
            return 3;
        }
    }
    std::fprintf(stderr, "spillway: unknown command '%s'\n", name.c_str());
    print_usage(stderr);
    return 2;
}
