#pragma once
// The resident KV budget (spec: "free − already-used − compute-reserve, capped by
// --vram-target"), with every term kept so the diagnostics can show it.
#include <cstdint>
#include <optional>
#include <string>

#include "model/model_spec.h"

namespace spillway {

constexpr uint64_t kMiB = 1ull << 20;

struct BudgetInputs {
    uint64_t vram_free_bytes = 0;        // free device memory before the model is loaded
    uint64_t weight_bytes = 0;           // already used: the weights
    uint64_t buffer_bytes = 0;           // already used: other buffers (logits, staging, ...)
    uint64_t compute_reserve_bytes = 0;  // scratch the forward pass needs at its peak
    std::optional<uint64_t> vram_target_bytes;  // --vram-target: cap on the process's VRAM
};

struct Budget {
    BudgetInputs inputs;
    uint64_t cap_bytes = 0;      // min(free, vram-target)
    bool target_binds = false;   // --vram-target is below free VRAM
    int64_t raw_bytes = 0;       // cap − used − reserve; negative when the weights do not fit
    uint64_t bytes = 0;          // max(raw, 0): what the KV cache may hold in VRAM
};

Budget compute_budget(const BudgetInputs& inputs);

// Default compute reserve for a model when nothing better is known: f32 activations of a
// 512-token prefill micro-batch (residual and attention/FFN intermediates and one row of
// logits per token) plus 1 GiB for what a profile's "total VRAM" does not net out: the CUDA
// context and cuBLAS workspace, the double-buffered staging of a streamed tail, allocator
// slack. With Qwen2.5-14B this is ~1.4 GiB.
uint64_t default_compute_reserve_bytes(const ModelSpec& model);

// "budget 10581 MiB = min(free 49140, vram-target 27000) − used 14964 (weights 14964 + buffers 0) − reserve 1455"
std::string describe_budget(const Budget& budget);

}  // namespace spillway
