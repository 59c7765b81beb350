#pragma once
// One token's Q8_0 GEMVs of a layer as ONE persistent kernel (sm_90): wo, gate|up, down and
// the next layer's q|k|v, with the small ops between them (residual adds, RMSNorm, SwiGLU and
// the int16 quantization of each x) done inside it.
//
// Why: separate launches lose ~5 us per GEMV to the ramp (the first weight bytes arrive ~1-2
// us after a launch) and the tail (the last warps stream alone), and the small kernels
// between them are time in which HBM idles (docs/perf-notes.md, sessions 9-11: the four
// GEMVs of a 14B layer take ~88 us for a 65 us floor). Here one producer thread per block
// streams its rows of every phase's weight matrix into a shared-memory ring with bulk copies
// (TMA), without waiting for anything but ring space: weights do not depend on activations,
// so while the consumers wait at the grid-wide barrier between two phases, the next phase's
// weights are already in flight. The activations are tiny (a 5120-value x is 20 KB, read
// from L2 by every block).
//
// Each phase: y = W x with W [rows][cols] Q8_0 rows, x quantized to int16 blocks of 32 with
// the rounding of act_quant.cuh (so the products are those of matvec_q8_0_q16x_cuda on the
// same x). The grid is one block per SM, all resident (the barrier needs every block to run);
// a block owns a contiguous range of each phase's rows, so every output is written by
// exactly one thread, with a fixed summation order: results are deterministic.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_quant.cuh"

namespace spillway {

// Where a phase's x comes from.
enum class DecodeX : uint32_t {
    act_q16,         // DecodeLayerArgs::x_q16, written before the launch (e.g. by the attention merge)
    stream_rmsnorm,  // RMSNorm of the residual stream times norm_weight, quantized by every block
    swiglu,          // silu(gate) * up from gate_up ([cols] gate values, then [cols] up values)
};
// Where its y goes.
enum class DecodeY : uint32_t {
    store,          // out[row] = y
    add_to_stream,  // stream[row] += y (the residual add; rows == the stream's length)
};

struct DecodeGemvPhase {
    const void* w = nullptr;  // Q8_0 [rows][cols], 16-byte aligned
    uint32_t rows = 0, cols = 0;
    DecodeX x = DecodeX::act_q16;
    DecodeY y = DecodeY::store;
    const float* norm_weight = nullptr;  // stream_rmsnorm: [cols]
    const float* gate_up = nullptr;      // swiglu: [2 * cols]
    float* out = nullptr;                // store: [rows]
};

constexpr uint32_t kDecodeMaxPhases = 4;

struct DecodeLayerArgs {
    DecodeGemvPhase phases[kDecodeMaxPhases];
    uint32_t n_phases = 0;
    float* stream = nullptr;  // the residual stream (read by stream_rmsnorm, updated by add_to_stream)
    ActQ16 x_q16;             // act_q16's x
    float eps = 1e-6f;        // RMSNorm
};

// Whether this device runs the kernel (sm_90+ with room for its shared memory), and whether
// a phase's shape fits it (cols % 256 == 0, cols <= 14336, rows >= 1).
bool decode_layer_supported();
bool decode_layer_phase_fits(uint32_t rows, uint32_t cols);

// The grid barrier's state: two uint32 words, zero before the first launch; the kernel leaves
// them ready for the next one. One per stream that launches (two launches running at once
// must not share it). `barrier` must be device memory.
constexpr size_t kDecodeBarrierWords = 2;

// Runs the phases in order (each phase's x may depend on every earlier phase's output).
// Launched with programmatic dependent launch on sm_90: the weight stream starts before the
// previous kernel on the stream has finished; x_q16 and the stream are read only after it.
// Fails (throws) on an unsupported device, shape or argument, or aliasing the kernel cannot
// honour (a phase may not write what its own x is read from).
void decode_layer_cuda(const DecodeLayerArgs& args, uint32_t* barrier, cudaStream_t stream);

}  // namespace spillway
