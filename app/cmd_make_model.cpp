// spillway make-model: a preset's shape with reproducible random weights, as a GGUF file.
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "app/args.h"
#include "app/commands.h"
#include "common/error.h"
#include "model/make_model.h"
#include "model/presets.h"

namespace spillway {

namespace {

std::string joined_preset_names() {
    std::string out;
    for (const std::string& name : preset_names()) out += (out.empty() ? "" : ", ") + name;
    return out;
}

GgmlType parse_wtype(const std::string& name) {
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0})
        if (name == ggml_type_name(t)) return t;
    fail("--wtype: unsupported weight type '" + name + "' (use f32, f16, bf16 or q8_0)");
}

}  // namespace

int cmd_make_model(int argc, char** argv) {
    ArgParser args("make-model", "Write a synthetic GGUF model: a preset's real shape, tokenizer metadata and\n"
                                 "reproducible random weights (same seed, same bytes).");
    args.option({"--preset"}, "NAME", "model shape: " + joined_preset_names());
    args.option({"--wtype"}, "T", "weight type of the matrices: f32, f16, bf16, q8_0 (norms and biases stay f32)",
                "q8_0");
    args.option({"--seed"}, "S", "random seed (a non-negative integer)", "0");
    args.option({"-o", "--output"}, "FILE", "where to write the model");
    args.flag({"--json"}, "print the result as JSON");
    args.flag({"--no-progress"}, "do not draw a progress bar");
    args.epilog("Example:\n  spillway make-model --preset tiny --wtype f16 --seed 7 -o tiny.gguf\n"
                "Sizes with q8_0 weights: tiny ~4 MiB, qwen2.5-0.5b ~0.5 GB, qwen2.5-7b ~8.1 GB,\n"
                "llama3-8b ~8.5 GB, qwen2.5-14b ~15.7 GB (written in bounded memory).");
    args.parse(argc, argv);
    if (args.help_requested()) {
        std::fputs(args.help().c_str(), stdout);
        return 0;
    }

    MakeModelOptions options;
    auto preset = args.get("--preset");
    if (!preset) fail("--preset is required (presets: " + joined_preset_names() + ")");
    options.preset = *preset;
    options.wtype = parse_wtype(args.get_or("--wtype", "q8_0"));
    options.seed = (uint64_t)args.get_int("--seed", 0, INT64_MAX).value_or(0);
    auto output = args.get("--output");
    if (!output || output->empty()) fail("-o FILE is required (where to write the model)");
    options.path = *output;
    options.show_progress = !args.has("--no-progress");

    MakeModelResult result = make_model(options);

    if (args.has("--json")) {
        nlohmann::json j = {
            {"path", options.path},
            {"preset", options.preset},
            {"wtype", ggml_type_name(options.wtype)},
            {"seed", options.seed},
            {"file_bytes", result.file_bytes},
            {"tensors", result.tensor_count},
            {"parameters", result.parameter_count},
            {"seconds", result.seconds},
        };
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("wrote %s: preset %s, %s weights, seed %llu, %.2fM parameters in %llu tensors, %.1f MiB in %.1f s\n",
                    options.path.c_str(), options.preset.c_str(), ggml_type_name(options.wtype),
                    (unsigned long long)options.seed, result.parameter_count / 1e6,
                    (unsigned long long)result.tensor_count, result.file_bytes / 1048576.0, result.seconds);
    }
    return 0;
}

}  // namespace spillway
