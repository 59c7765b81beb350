#pragma once
// The model a command works on: `-m FILE` (a GGUF) or `--preset NAME [--wtype T]` (a
// preset's shape without any file). Shared by plan, probe and bench.
#include <string>

#include "app/args.h"
#include "model/model_spec.h"

namespace spillway {

// Declares -m/--model, --preset and --wtype on the parser.
void add_model_options(ArgParser& args, bool preset_allowed = true);

struct ModelChoice {
    ModelSpec spec;
    std::string label;  // the file path, or "preset qwen2.5-14b (q8_0 weights)"
};

// default_preset: used when neither -m nor --preset is given ("" = one of them is required).
ModelChoice model_from_args(const ArgParser& args, const std::string& default_preset = "");

}  // namespace spillway
