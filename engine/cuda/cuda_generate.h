#pragma once
// The entry point `spillway run --device cuda` calls: uploads the model, prefills the
// prompt in chunks, then decodes with the graph-captured step. Greedy sampling without a
// repetition penalty stays on the GPU (argmax; the host reads one int per token); any other
// sampling copies the logits row and uses the CPU sampler, so the chain is identical.
// No CUDA types here: app/ code compiled by the host compiler includes this header.
#include <cstdint>
#include <functional>
#include <span>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/sampler.h"
#include "model/model_spec.h"

namespace spillway {

struct CudaGenerateOptions {
    uint32_t n_ctx = 4096;
    uint32_t batch = 512;          // prefill chunk; 0: cuda_long_prompt_chunk for the model (cuda_forward.h)
    KvType k_type = KvType::f16;
    KvType v_type = KvType::f16;
    bool show_progress = true;     // upload progress bar (on a terminal)
    // KV cells kept in VRAM; the rest of n_ctx lives in pinned host memory and is streamed
    // each step (engine/cuda/kv_spill.h). UINT32_MAX (or >= n_ctx): no spill.
    uint32_t resident_cells = UINT32_MAX;
};

struct CudaGenerateStats {
    double upload_s = 0, prefill_s = 0, decode_s = 0;
    uint32_t prefill_tokens = 0;
    uint32_t n_decoded = 0;        // forward passes of generated tokens
    uint64_t bytes_read = 0;       // weights + KV read by those passes
    uint64_t vram_weights = 0, vram_kv = 0, vram_scratch = 0, vram_graphs = 0;
    uint64_t spilled_bytes = 0;    // KV bytes in the pinned host tail (all layers, K + V)
    uint64_t staging_bytes = 0;    // VRAM of the spill's staging buffers (counts against the budget)
};

// Called with each sampled token; return false to stop (end of generation).
using TokenSink = std::function<bool(int32_t token)>;
// Called with every evaluated position's logits (n_vocab floats) when set (--logits-out).
using LogitsSink = std::function<void(int32_t token, int32_t position, const float* logits)>;

// Mirrors cmd_run's CPU loop: sample from the prompt's last logits, then for each of up to
// n_generate tokens: hand it to on_token, stop on false / n_generate / full context, else
// evaluate it. Throws spillway::Error without a GPU or on unsupported models.
CudaGenerateStats generate_cuda(const CpuModel& model, std::span<const int32_t> prompt, uint32_t n_generate,
                                const SamplerConfig& sampling, const CudaGenerateOptions& options,
                                const TokenSink& on_token, const LogitsSink& on_logits = nullptr);

}  // namespace spillway
