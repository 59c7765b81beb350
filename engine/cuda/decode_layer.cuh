#pragma once
// One token's Q8_0 GEMVs of a layer as ONE persistent kernel (sm_90): wo, gate|up, down and
// the next layer's q|k|v, with the small ops between them (residual adds, RMSNorm, SwiGLU and
// the int16 quantization of each x) done inside it.
//
// Why: separate launches lose ~5 us per GEMV to the ramp (the first weight bytes arrive ~1-2
// us after a launch) and the tail (the last warps stream alone), and the small kernels
// between them are time in which HBM idles (docs/perf-notes.md, sessions 9-11: the four
// GEMVs of a 14B layer take ~88 us for a 65 us floor). Here every warp streams its share of
// each phase's weights through its own ring of bulk copies, and the stream runs on across
// the grid-wide barriers between phases (the ring fills with the next phase's weights while
// the warp waits), and each block builds the next x itself (the activations are tiny: a
// 5120-value x is 20 KB, read from L2). A lab path (SPILLWAY_DECODE_LAYER=1); its measured
// speed against the separate kernels is in docs/perf-notes.md (sessions 15, 25).
//
// Each phase: y = W x with W [rows][cols] Q8_0 rows, x quantized to int16 blocks of 32 with
// the rounding of act_quant.cuh (so the products are those of matvec_q8_0_q16x_cuda on the
// same x). The grid is one block per SM, all resident (the barrier needs every block to run);
// the work of a phase is split over all warps as the q16x matvec splits it (by chunks, a row
// cut between two warps handed over through a slot), so every output is written by exactly
// one thread, with a fixed summation order: results are deterministic.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_quant.cuh"

namespace spillway {

// Where a phase's x comes from.
enum class DecodeX : uint32_t {
    act_q16,         // DecodeLayerArgs::x_q16, written before the launch (e.g. by the attention merge)
    stream_rmsnorm,  // RMSNorm of the residual stream times norm_weight, quantized by every block
    swiglu,          // silu(gate) * up from gate_up ([cols] gate values, then [cols] up values)
    f32,             // the f32 vector x_f32 (e.g. the previous phase's swiglu_pairs output)
};
// Where its y goes.
enum class DecodeY : uint32_t {
    store,          // out[row] = y
    add_to_stream,  // stream[row] += y (the residual add; rows == the stream's length)
    swiglu_pairs,   // rows = 2n (gate rows, then up rows): out[j] = silu(y[j]) * y[n + j], j < n;
                    // each warp computes gate row j and up row j together, so SwiGLU needs no
                    // pass of its own and the next phase reads n values instead of 2n
};

struct DecodeGemvPhase {
    const void* w = nullptr;  // Q8_0 [rows][cols], 16-byte aligned
    uint32_t rows = 0, cols = 0;
    DecodeX x = DecodeX::act_q16;
    DecodeY y = DecodeY::store;
    const float* norm_weight = nullptr;  // stream_rmsnorm: [cols]
    const float* gate_up = nullptr;      // swiglu: [2 * cols]
    float* out = nullptr;                // store: [rows]; swiglu_pairs: [rows / 2]
    const float* x_f32 = nullptr;        // f32: [cols]
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

// The kernel's state between launches: the grid barrier's two words and the slots in which
// warps hand over the partial sums of rows split between them. `decode_layer_scratch_bytes()`
// bytes of device memory, zero before the first launch; every launch leaves it ready for
// the next (the arrival count and every slot zero; the barrier's generation word only grows).
// One per stream that launches. Every block must be resident at once (one per SM): a launch
// must not run beside another of these or any kernel that holds SMs for long; a barrier that
// waits for seconds stops the kernel with an error (a device trap) instead of hanging.
size_t decode_layer_scratch_bytes();

// Runs the phases in order (each phase's x may depend on every earlier phase's output).
// Launched with programmatic dependent launch on sm_90: the weight stream starts before the
// previous kernel on the stream has finished; x_q16 and the stream are read only after it.
// Fails (throws) on an unsupported device, shape or argument, or aliasing the kernel cannot
// honour (a phase may not write what its own x is read from).
// timeline (lab; null in the engine): decode_layer_grid_blocks() x kDecodeTimelineSlots
// globaltimer stamps per launch: [0] start, [1] after the dependency wait, then per phase p
// [2 + 3p] x ready, [3 + 3p] the block's warps done, [4 + 3p] grid barrier passed (p < last),
// then [2 + 3 * kDecodeMaxPhases + p * kDecodeLayerWarps + w] warp w's weight loop done, then
// [2 + 3 * kDecodeMaxPhases + (kDecodeMaxPhases + p) * kDecodeLayerWarps + w] warp w's ring
// when phase p's x was ready: chunks in flight (low 32 bits) and landed (high; TMA rings).
constexpr uint32_t kDecodeLayerWarps = 16;
constexpr uint32_t kDecodeTimelineSlots = 2 + 3 * kDecodeMaxPhases + 2 * kDecodeMaxPhases * kDecodeLayerWarps;
uint32_t decode_layer_grid_blocks();

// The weight ring (lab): 16-byte cp.async by every lane or bulk copies (TMA) by one, and
// block pairs per chunk x chunks in flight per warp (140-175 KB per SM), running on across
// the phases ("-phase": a phase's chunks only once its x is built; "-rcp": x quantized by a
// reciprocal multiply; "r4": 4 rows per warp unit instead of 2). The default is
// SPILLWAY_DECODE_RING's choice (the names below, e.g. "cp32x2"), else tma16x5-rcp.
enum class DecodeRing : uint32_t { tma16x5, tma16x5_rcp, tma32x2, cp32x2, cp32x2_phase, tma16x2r4_rcp };
constexpr uint32_t kDecodeRingShapes = 6;
const char* decode_ring_name(DecodeRing ring);
DecodeRing decode_ring_default();

void decode_layer_cuda(const DecodeLayerArgs& args, void* scratch, cudaStream_t stream, uint64_t* timeline = nullptr,
                       DecodeRing ring = decode_ring_default());

// Bench only: what the default ring's launch would take without the waits between blocks
// (bound 1: no grid barrier, each block still syncs its warps and builds every x) or without
// any phase boundary (bound 2: no barrier, no sync, x built once). The outputs are WRONG
// (phases read x before it is written); the arguments are checked as decode_layer_cuda's.
void decode_layer_timing_bound_cuda(const DecodeLayerArgs& args, void* scratch, cudaStream_t stream, int bound);

}  // namespace spillway
