#pragma once
// `spillway bench` on the GPU: prefill tok/s, decode tok/s at several KV depths, achieved
// GB/s and % of the roofline ((weights + KV bytes read per token) / HBM bandwidth measured
// in the same run by a streaming-read kernel). Plain data in and out; app/cmd_bench.cpp
// formats it. No CUDA types here (app/ includes it with the host compiler).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf/ggml_types.h"
#include "model/model_spec.h"

namespace spillway {

struct CudaBenchOptions {
    std::string model_path;           // a GGUF file, or
    std::string synthetic_preset;     // a preset built with random weights on the GPU
    GgmlType wtype = GgmlType::Q8_0;  // weight type of the synthetic model
    uint32_t n_prompt = 512;          // prefill test (0: skip)
    uint32_t n_gen = 128;             // decode steps per depth (0: skip)
    uint32_t batch = 512;             // prefill chunk
    std::vector<uint32_t> depths = {0};
    std::vector<std::pair<KvType, KvType>> kv_types = {{KvType::f16, KvType::f16}};
    uint64_t seed = 1;
    bool use_graph = true;            // false: direct launches per step (to measure what the graph saves)
    bool show_progress = true;
    // Spilled decode: for each depth, MiB of the filled cache moved to the pinned host tail
    // (the last cells before the depth; the tail grows by the decoded cells). 0 = resident.
    // With any nonzero spill the bench also measures spill 0 and an "engage" row (a spill
    // of one cell) at each depth: t_resident and c_engage of the drop models.
    std::vector<uint64_t> spill_mib = {0};
    // Each timed test this many times (llama-bench's -r): a row's tok/s is the mean of the
    // repetitions' tok/s and tok_s_sd their sample standard deviation.
    uint32_t repetitions = 1;
};

struct CudaBenchRow {
    KvType k_type = KvType::f16, v_type = KvType::f16;
    std::string test;                 // "pp512", "tg128"
    uint32_t depth = 0;
    double tok_s = 0;
    double tok_s_sd = 0;              // over the repetitions (0 with one)
    double ms_per_token = 0;          // the repetitions' mean
    double gb_s = 0;                  // decode: bytes read per token / time per token
    double roofline_pct = 0;          // decode: (bytes / HBM bandwidth) / time per token
    uint64_t bytes_per_token = 0;
    double capture_us = 0;            // decode: host time to capture + update one step's graph
    uint64_t vram_kv = 0;
    // Spilled decode rows (decode rows with spill_cells > 0; spill_mib 0 and engage false
    // for the resident rows).
    uint64_t spill_mib = 0;           // requested
    bool engage = false;              // the one-cell row that measures c_engage
    uint32_t spill_cells = 0;         // tail cells at the first step
    uint64_t tail_bytes_per_token = 0;  // mean bytes streamed H2D per step (all layers, K + V)
    uint64_t staging_bytes = 0;       // VRAM of the staging buffers
    uint64_t spilled_bytes = 0;       // pinned host tail
};

struct CudaBenchReport {
    std::string device;
    std::string model;                // file path or "synthetic PRESET (TYPE)"
    double hbm_gb_s = 0;              // measured streaming read
    uint64_t vram_weights = 0, vram_scratch = 0, vram_graphs = 0;
    std::vector<std::pair<std::string, uint64_t>> vram_scratch_parts;  // by buffer, summing to vram_scratch
    uint64_t kv_cells = 0;            // cache size in cells (max depth + n_gen + 1)
    double h2d_gb_s = 0;              // pinned host->device copy bandwidth, measured when spilling
    std::vector<CudaBenchRow> rows;
};

// Cells a spill of `mib` MiB takes (rounded up) for a cache whose cell is `cell_bytes` over
// all layers, K + V.
uint64_t spill_cells_for_mib(uint64_t mib, uint64_t cell_bytes);

// Throws spillway::Error without a usable GPU, with a message that says so.
CudaBenchReport run_cuda_bench(const CudaBenchOptions& options);

}  // namespace spillway
