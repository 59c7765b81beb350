// spillway info: a GGUF model's ModelSpec, its tensors by type, and KV cache size per tier.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "app/args.h"
#include "app/commands.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "model/model_spec.h"

namespace spillway {

namespace {

// The tiers the planner's ladder walks, plus the K-pinned mixes: (K, V).
const std::pair<KvType, KvType> kKvPairs[] = {
    {KvType::f16, KvType::f16},   {KvType::f16, KvType::q8_0},  {KvType::f16, KvType::q4_0},
    {KvType::q8_0, KvType::q8_0}, {KvType::q8_0, KvType::q4_0}, {KvType::q4_0, KvType::q4_0},
};

std::string human_bytes(uint64_t bytes) {
    char text[32];
    const double b = (double)bytes;
    if (bytes < 1024) std::snprintf(text, sizeof text, "%llu B", (unsigned long long)bytes);
    else if (bytes < (1ull << 20)) std::snprintf(text, sizeof text, "%.1f KiB", b / 1024);
    else if (bytes < (1ull << 30)) std::snprintf(text, sizeof text, "%.1f MiB", b / (1 << 20));
    else std::snprintf(text, sizeof text, "%.2f GiB", b / (1 << 30));
    return text;
}

const char* rope_type_name(RopeType t) { return t == RopeType::neox ? "neox" : "normal"; }

const char* rope_scaling_name(RopeScaling s) {
    switch (s) {
        case RopeScaling::none: return "none";
        case RopeScaling::linear: return "linear";
        case RopeScaling::yarn: return "yarn";
    }
    return "?";
}

bool pair_fits(const ModelSpec& spec, std::pair<KvType, KvType> kv) {
    return kv_type_fits(spec, kv.first) && kv_type_fits(spec, kv.second);
}

// Per-layer values as one number when all layers agree, else the whole list.
nlohmann::json per_layer_json(const ModelSpec& spec, uint32_t LayerSpec::*field) {
    std::vector<uint32_t> values;
    for (const LayerSpec& l : spec.layers) values.push_back(l.*field);
    bool uniform = true;
    for (uint32_t v : values) uniform = uniform && v == values.front();
    if (uniform && !values.empty()) return values.front();
    return values;
}

std::string per_layer_text(const ModelSpec& spec, uint32_t LayerSpec::*field) {
    nlohmann::json j = per_layer_json(spec, field);
    return j.is_array() ? "per layer " + j.dump() : std::to_string(j.get<uint32_t>());
}

nlohmann::json info_json(const std::string& path, const GgufFile& file, const ModelSpec& spec, uint64_t n_ctx) {
    nlohmann::json model = {
        {"arch", arch_name(spec.arch)},
        {"name", spec.name},
        {"n_layer", spec.n_layer},
        {"n_embd", spec.n_embd},
        {"n_head", per_layer_json(spec, &LayerSpec::n_head)},
        {"n_head_kv", per_layer_json(spec, &LayerSpec::n_head_kv)},
        {"head_dim_k", spec.head_dim_k},
        {"head_dim_v", spec.head_dim_v},
        {"n_ff", spec.n_ff},
        {"n_vocab", spec.n_vocab},
        {"n_ctx_train", spec.n_ctx_train},
        {"norm_eps", spec.norm_eps},
        {"rope",
         {{"type", rope_type_name(spec.rope.type)},
          {"freq_base", spec.rope.freq_base},
          {"n_dims", spec.rope.n_dims},
          {"scaling", rope_scaling_name(spec.rope.scaling)},
          {"scaling_factor", spec.rope.scaling_factor},
          {"original_context", spec.rope.original_context}}},
        {"swa_window", spec.swa_window},
        {"tied_embeddings", spec.tied_embeddings},
        {"has_qkv_bias", spec.has_qkv_bias},
    };
    std::vector<uint32_t> local;
    for (uint32_t il = 0; il < spec.layers.size(); ++il)
        if (spec.layers[il].is_local) local.push_back(il);
    model["local_layers"] = local;

    nlohmann::json by_type = nlohmann::json::object();
    for (const auto& [type, bytes] : spec.weight_bytes_by_type)
        by_type[ggml_type_name(type)] = {{"count", spec.tensor_count_by_type.at(type)}, {"bytes", bytes}};
    std::vector<uint64_t> per_layer;
    for (const LayerSpec& l : spec.layers) per_layer.push_back(l.weight_bytes);
    nlohmann::json weights = {{"total_bytes", spec.weight_bytes_total},
                              {"non_layer_bytes", spec.weight_bytes_non_layer},
                              {"per_layer_bytes", per_layer},
                              {"tensor_count", file.header().tensors.size()},
                              {"by_type", by_type}};

    nlohmann::json tiers = nlohmann::json::array();
    for (auto kv : kKvPairs) {
        nlohmann::json t = {{"k", kv_type_name(kv.first)}, {"v", kv_type_name(kv.second)}};
        if (pair_fits(spec, kv)) {
            t["bytes_per_cell"] = kv_bytes_per_cell(spec, kv.first, kv.second);
            t["total_bytes"] = kv_cache_bytes(spec, n_ctx, kv.first, kv.second);
        } else {
            t["bytes_per_cell"] = nullptr;
            t["total_bytes"] = nullptr;
        }
        tiers.push_back(t);
    }
    return {{"file", path},
            {"file_bytes", file.file_size()},
            {"gguf_version", file.header().version},
            {"model", model},
            {"weights", weights},
            {"kv", {{"n_ctx", n_ctx}, {"tiers", tiers}}},
            {"notes", spec.notes}};
}

void print_info(const std::string& path, const GgufFile& file, const ModelSpec& spec, uint64_t n_ctx) {
    std::printf("file        %s (%s, GGUF v%u)\n", path.c_str(), human_bytes(file.file_size()).c_str(),
                file.header().version);
    std::printf("model       %s%s%s\n", arch_name(spec.arch), spec.name.empty() ? "" : ": ", spec.name.c_str());
    std::printf("layers      %u\n", spec.n_layer);
    std::printf("embedding   %u\n", spec.n_embd);
    std::printf("heads       %s query, %s KV (head dim K %u, V %u)\n", per_layer_text(spec, &LayerSpec::n_head).c_str(),
                per_layer_text(spec, &LayerSpec::n_head_kv).c_str(), spec.head_dim_k, spec.head_dim_v);
    std::printf("ffn         %u\n", spec.n_ff);
    std::printf("vocab       %u\n", spec.n_vocab);
    std::printf("context     %u (trained)\n", spec.n_ctx_train);
    std::printf("rope        %s, base %g, %u dims, scaling %s", rope_type_name(spec.rope.type), spec.rope.freq_base,
                spec.rope.n_dims, rope_scaling_name(spec.rope.scaling));
    if (spec.rope.scaling != RopeScaling::none)
        std::printf(" x%g (original context %u)", spec.rope.scaling_factor, spec.rope.original_context);
    std::printf("\nnorm eps    %g\n", spec.norm_eps);
    if (spec.swa_window > 0) {
        uint32_t n_local = 0;
        for (const LayerSpec& l : spec.layers) n_local += l.is_local;
        std::printf("sliding     window %u on %u of %u layers\n", spec.swa_window, n_local, spec.n_layer);
    }
    std::printf("embeddings  %s\n", spec.tied_embeddings ? "tied (no output.weight)" : "separate output.weight");
    std::printf("qkv bias    %s\n", spec.has_qkv_bias ? "yes" : "no");

    std::printf("\nweights     %s total, %s in layers (%s per layer), %s outside\n",
                human_bytes(spec.weight_bytes_total).c_str(),
                human_bytes(spec.weight_bytes_total - spec.weight_bytes_non_layer).c_str(),
                human_bytes(spec.layers.empty() ? 0 : spec.layers[0].weight_bytes).c_str(),
                human_bytes(spec.weight_bytes_non_layer).c_str());
    std::printf("  %-8s %8s %14s\n", "type", "tensors", "bytes");
    for (const auto& [type, bytes] : spec.weight_bytes_by_type)
        std::printf("  %-8s %8llu %14s\n", ggml_type_name(type), (unsigned long long)spec.tensor_count_by_type.at(type),
                    human_bytes(bytes).c_str());

    std::printf("\nKV cache at context %llu\n", (unsigned long long)n_ctx);
    std::printf("  %-5s %-5s %14s %14s\n", "K", "V", "per cell", "total");
    for (auto kv : kKvPairs) {
        if (!pair_fits(spec, kv)) {
            std::printf("  %-5s %-5s %14s %14s\n", kv_type_name(kv.first), kv_type_name(kv.second), "n/a", "n/a");
            continue;
        }
        std::printf("  %-5s %-5s %14s %14s\n", kv_type_name(kv.first), kv_type_name(kv.second),
                    human_bytes(kv_bytes_per_cell(spec, kv.first, kv.second)).c_str(),
                    human_bytes(kv_cache_bytes(spec, n_ctx, kv.first, kv.second)).c_str());
    }
    for (const std::string& note : spec.notes) std::printf("\nnote: %s\n", note.c_str());
}

}  // namespace

int cmd_info(int argc, char** argv) {
    ArgParser args("info", "Show a GGUF model's shape (ModelSpec), its tensors by type, and the KV cache size\n"
                           "per tier (f16, q8_0, q4_0 and mixed K/V) at a context length.");
    args.option({"-m", "--model"}, "FILE", "GGUF model file");
    args.option({"-c", "--ctx-size"}, "N", "context length for the KV sizes", "the model's trained context");
    args.flag({"--json"}, "print everything as JSON");
    args.parse(argc, argv);
    if (args.help_requested()) {
        std::fputs(args.help().c_str(), stdout);
        return 0;
    }
    auto path = args.get("--model");
    if (!path) fail("-m FILE is required (the GGUF model to describe)");
    const std::optional<int64_t> ctx_arg = args.get_int("--ctx-size", 1, int64_t{1} << 40);
    std::unique_ptr<GgufFile> file = GgufFile::open(*path);
    ModelSpec spec = model_spec_from_gguf(file->header());
    const uint64_t n_ctx = ctx_arg ? (uint64_t)*ctx_arg : spec.n_ctx_train;

    if (args.has("--json")) std::printf("%s\n", info_json(*path, *file, spec, n_ctx).dump(2).c_str());
    else print_info(*path, *file, spec, n_ctx);
    return 0;
}

}  // namespace spillway
