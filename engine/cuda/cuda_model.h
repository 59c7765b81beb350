#pragma once
// The Llama/Qwen2 weights on the GPU: one device arena holding every tensor, uploaded once
// from a CpuModel (views into the GGUF mmap) or filled with random values directly on the
// GPU for benchmarks (`--synthetic`: speed depends on shapes, not values).
//
// Layout choices that the forward relies on:
//  - wq, wk, wv of a layer sit back to back (same type and n_in), so for one decode token
//    they are one matrix of q_dim + k_dim + v_dim rows: one matvec instead of three.
//    ffn_gate and ffn_up likewise. `fused_qkv` / `fused_gate_up` say whether that holds.
//  - bq, bk, bv sit back to back too (one bias add of q_dim + k_dim + v_dim values).
//  - norms and biases are f32.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cpu/rope.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/rope.cuh"
#include "gguf/ggml_types.h"
#include "model/model_spec.h"

namespace spillway {

struct CpuModel;

// A weight matrix on the device: n_out rows of n_in values, in GGUF layout, or for Q8_0
// matrices the decode GEMV takes in the split layout (matvec_q8s.cuh): then `data` holds the
// int8 codes (row stride n_in bytes) and q8_scales the blocks' f16 scales (row stride n_in /
// 32); the same bytes in all (row_bytes stays GGUF's).
struct CudaMatrix {
    GgmlType type = GgmlType::F32;
    const uint8_t* data = nullptr;
    uint32_t n_in = 0;
    uint32_t n_out = 0;
    uint64_t row_bytes = 0;
    const uint16_t* q8_scales = nullptr;  // non-null: split layout
    uint64_t bytes() const { return row_bytes * n_out; }
};

struct CudaLayerWeights {
    const float* attn_norm = nullptr;
    CudaMatrix wq, wk, wv, wo;
    const float* bqkv = nullptr;  // [q_dim + k_dim + v_dim] or null (no QKV bias)
    const float* ffn_norm = nullptr;
    CudaMatrix ffn_gate, ffn_up, ffn_down;
    bool fused_qkv = false;       // wq|wk|wv contiguous and of one type
    bool fused_gate_up = false;   // ffn_gate|ffn_up contiguous and of one type
};

// SPILLWAY_Q8_SPLIT=<bit mask> (lab; 31, every site, by default; 0 keeps GGUF layout
// everywhere, cuda_model.cu): the decode sites whose Q8_0 matrices are converted to the split
// layout after upload (1 q|k|v, 2 wo, 4 gate|up, 8 down, 16 head), where the split-layout GEMV
// takes their rows; fused q|k|v and gate|up convert as one matrix each (their decode GEMV
// stays one launch); a tied head stays GGUF (the embedding reads its rows).
struct CudaModel {
    ModelSpec spec;
    uint32_t n_head_kv = 0;
    CudaMatrix token_embd;
    CudaMatrix output;            // == token_embd when tied
    const float* output_norm = nullptr;
    std::vector<CudaLayerWeights> layers;
    RopeTables rope;              // host copy (the device tables point into rope_* below)
    RopeDeviceTables rope_dev;
    DeviceBuffer<uint8_t> arena;  // every weight, norm and bias
    DeviceBuffer<double> rope_inv_freq;
    DeviceBuffer<float> rope_ramp_mix;
    uint64_t weight_bytes = 0;    // bytes of the arena in use
};

// True when the CUDA engine can run this weight type (matvec + prefill dequantization).
bool cuda_weight_type_supported(GgmlType type);

// Copies every tensor of `cpu` to the GPU (pinned staging, a progress bar on a terminal).
// Throws spillway::Error on unsupported types or shapes, or when VRAM runs out.
CudaModel upload_cuda_model(const CpuModel& cpu, bool show_progress);

// A preset's shape (model/presets.h) with random weights of `wtype` (f16, bf16 or q8_0)
// generated on the GPU: valid f16 scales, values ~ the make-model distributions.
CudaModel make_synthetic_cuda_model(const std::string& preset, GgmlType wtype, uint64_t seed);

// Bytes one decode token reads from the weights: every matrix once, one embedding row,
// and the norms (the head is read whole, also when tied).
uint64_t cuda_decode_weight_bytes(const CudaModel& model);

}  // namespace spillway
