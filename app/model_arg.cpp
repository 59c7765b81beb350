#include "app/model_arg.h"

#include "common/error.h"
#include "gguf/gguf.h"
#include "model/presets.h"

namespace spillway {

void add_model_options(ArgParser& args, bool preset_allowed) {
    args.option({"-m", "--model"}, "FILE", "GGUF model file");
    if (preset_allowed) {
        std::string names;
        for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
        args.option({"--preset"}, "NAME", "a preset model shape instead of a file: " + names);
        args.option({"--wtype"}, "T", "weight type of --preset (f32, f16, bf16, q8_0)", "q8_0");
    }
}

ModelChoice model_from_args(const ArgParser& args, const std::string& default_preset) {
    auto file = args.get("--model");
    auto preset = args.get("--preset");
    if (file && preset) fail("give either -m FILE or --preset NAME, not both");
    if (!file && !preset) {
        if (default_preset.empty()) fail("give a model: -m FILE or --preset NAME");
        preset = default_preset;
    }
    ModelChoice m;
    if (file) {
        auto gguf = GgufFile::open(*file);
        m.spec = model_spec_from_gguf(gguf->header());
        m.label = *file;
        return m;
    }
    std::string wname = args.get_or("--wtype", "q8_0");
    auto wtype = ggml_type_from_name(wname);
    if (!wtype) fail("--wtype: unknown weight type '" + wname + "' (f32, f16, bf16, q8_0)");
    m.spec = model_spec_from_gguf(preset_header(*preset, *wtype));
    m.label = "preset " + *preset + " (" + wname + " weights)";
    return m;
}

}  // namespace spillway
