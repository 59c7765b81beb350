#pragma once
// The tiny preset as a test fixture for the GPU tests: written by make-model (seeded), loaded
// by the CPU engine, uploaded to the GPU once per (weight type, seed) and kept for the run.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "engine/cpu/cpu_model.h"
#include "engine/cuda/cuda_model.h"
#include "gguf/ggml_types.h"
#include "model/make_model.h"

namespace spillway::cuda_test {

struct TinyModel {
    CpuModel cpu;
    std::unique_ptr<CudaModel> gpu;
};

inline TinyModel& tiny_model(GgmlType wtype, uint64_t seed) {
    static std::map<std::pair<GgmlType, uint64_t>, TinyModel> models;
    const auto key = std::make_pair(wtype, seed);
    if (auto it = models.find(key); it != models.end()) return it->second;
    const auto dir = std::filesystem::temp_directory_path() / ("spillway_cuda_tiny_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    MakeModelOptions o;
    o.preset = "tiny";
    o.wtype = wtype;
    o.seed = seed;
    o.path = (dir / (std::string("tiny_") + ggml_type_name(wtype) + "_" + std::to_string(seed) + ".gguf")).string();
    o.show_progress = false;
    make_model(o);
    TinyModel t;
    t.cpu = load_cpu_model_file(o.path);
    std::filesystem::remove(o.path);
    t.gpu = std::make_unique<CudaModel>(upload_cuda_model(t.cpu, false));
    return models.emplace(key, std::move(t)).first->second;
}

}  // namespace spillway::cuda_test
