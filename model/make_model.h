#pragma once
// Synthetic models: a preset's shape with reproducible random weights, written as a GGUF
// in bounded memory. Speed depends on shapes, not values, so these stand in for real
// weights in benchmarks; quality needs trained weights.
#include <cstdint>
#include <string>

#include "gguf/ggml_types.h"

namespace spillway {

struct GgufHeader;

struct MakeModelOptions {
    std::string preset;             // a name from preset_names()
    GgmlType wtype = GgmlType::Q8_0;  // f32, f16, bf16 or q8_0 for the matrices
    uint64_t seed = 0;
    std::string path;
    bool show_progress = true;      // a bar on stderr when it is a terminal
};

struct MakeModelResult {
    uint64_t file_bytes = 0;
    uint64_t tensor_count = 0;
    uint64_t parameter_count = 0;
    double seconds = 0;
};

MakeModelResult make_model(const MakeModelOptions& options);

// How a tensor's values are drawn, chosen by its name: matrices and embeddings ~ N(0, 0.02²),
// norm weights ~ 1 + N(0, 0.05²), biases ~ N(0, 0.02²).
enum class WeightInit { matrix, norm, bias };
WeightInit weight_init_for(const std::string& tensor_name);

// Values [first, first + n) of tensor number `tensor_index` (its position in the header).
// Each value depends only on (seed, tensor_index, element index), so any chunking gives the
// same tensor, and a bench can build the same weights in memory without the file.
void synthetic_values(uint64_t seed, uint64_t tensor_index, WeightInit init, uint64_t first, float* out, size_t n);

}  // namespace spillway
