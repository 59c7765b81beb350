#pragma once
// Decode GEMV for Q8_0 weights kept on the GPU in the "split" layout: each matrix's int8
// codes row after row ([rows][cols], 16-byte aligned), then the blocks' f16 scales
// ([rows][cols / 32]). The same 34 bytes per 32 weights as GGUF's blocks, rearranged at
// upload so that a lane loads 16 codes with one aligned 16-byte load straight into registers
// (GGUF's 34-byte blocks have to be staged through shared memory to be read with whole
// words: matvec.cu's q16x kernel). x is pre-quantized to int16 blocks as for q16x
// (act_quant.cuh): the products are exact in W and differ from the f32-x product only by
// x's rounding (~2e-5 relative). The engine converts its Q8_0 decode matrices to this layout
// after upload (cuda_model.h, SPILLWAY_Q8_SPLIT) and decodes them with the sweep kernel
// (session 27: sweep1r2, +4-9% decode tok/s over GGUF layout with q16x; docs/perf-notes.md).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_quant.cuh"
#include "model/model_spec.h"

namespace spillway {

struct Q8Split {
    int8_t* codes = nullptr;     // [rows][cols]
    uint16_t* scales = nullptr;  // [rows][cols / 32], f16 bits
};
struct Q8SplitConst {
    const int8_t* codes = nullptr;
    const uint16_t* scales = nullptr;
};

// GGUF Q8_0 rows (device, rows x cols / 32 blocks of 34 bytes) -> the split layout (device,
// regions that must not overlap the source), on `stream`. cols % 32 == 0, codes 16-byte aligned.
void q8_0_to_split_cuda(const void* gguf_rows, uint32_t rows, uint32_t cols, Q8Split out, cudaStream_t stream);

// Whether the GEMV takes this row length: cols % 512 == 0 (a lane's 16 codes per row and
// step, 32 lanes) and cols <= 32768 (x in shared memory).
bool matvec_q8s_fits(uint32_t cols);

// Variants (bench and tests; docs/perf-notes.md session 23): warps per block (8 or 4) and
// 16-byte code loads in flight per row and lane (4 or 8); p: two register groups, the next
// group's loads issued before the current one is summed; nc: W through the read-only path
// instead of evict-first streaming loads; sweep1 / sweep2: a block per contiguous row range,
// its 16 warps interleaved over the range's 512-code segments in address order, 1 or 2
// blocks per SM (session 27); sweep1r2: as sweep1 with row pairs per warp step, x's loads
// shared by the pair (the default); sweep1r4 / sweep1r8: groups of 4 rows with 2 units in
// flight, 8 rows with 1 (session 28). The sweep variants stay last (matvec_q8s_fused_fits).
enum class MatvecQ8sKernel : uint8_t { w8u4, w8u8, w4u4, w8u4p, w8u4nc, sweep1, sweep2, sweep1r2, sweep1r4, sweep1r8 };
// Pure: the variant matvec_q8s_cuda uses (SPILLWAY_Q8S_KERNEL=<name> overrides it, lab).
MatvecQ8sKernel matvec_q8s_kernel_for(uint32_t rows, uint32_t cols);

// y[rows] = W x, x given as int16 blocks. release_at_entry as for matvec_q8_0_q16x_cuda
// (matvec.cuh): the next kernel on the stream may be scheduled at this one's entry.
void matvec_q8s_cuda(Q8SplitConst w, ActQ16 x, float* y, uint32_t rows, uint32_t cols, cudaStream_t stream,
                     bool release_at_entry = false);
void matvec_q8s_cuda_with(MatvecQ8sKernel kernel, Q8SplitConst w, ActQ16 x, float* y, uint32_t rows, uint32_t cols,
                          cudaStream_t stream, bool release_at_entry = false);
// Lab (bench "q8s hop timeline"): sweep1r2 with global-timer stamps, 5 per block at
// stamps[block * 5 + k]: entry, producer wait returned, x in shared memory, sweep done, end
// (nanoseconds, thread 0). Returns the number of blocks (stamps needs 5 per block).
uint32_t matvec_q8s_stamped_cuda(Q8SplitConst w, ActQ16 x, float* y, uint32_t rows, uint32_t cols,
                                 cudaStream_t stream, bool release_at_entry, uint64_t* stamps);

// Decode's gate|up GEMV with SwiGLU in its epilogue: w holds ff gate rows, then ff up rows
// (one split matrix of 2 ff x cols, as uploaded); out = act_q16 of silu(gate x) * (up x),
// ff values, bit-equal to matvec_q8s_cuda over the 2 ff rows followed by swiglu_q16_cuda
// (same sums in the same order, same quantization), with no launch and no f32 gate / up
// between them. Each block quantizes the 32-value blocks of its pairs; a block cut between
// two grid blocks is finished by the later one through the scratch.
// How a 32-value block cut between two grid blocks is finished (lab: SPILLWAY_HANDOVER in the
// engine). lean (the default since session 37: 0.2-0.8% faster than fence on every KV tier and
// depth on the H200, 0.1-0.5% on the H100): each holder counts its arrival with one acq_rel
// atomic, and the last one zeroes the count, with nothing waiting for that store, and reads the
// others' values. fence: a fence before a relaxed arrival and, for the last, one more before
// its reads (the grid barrier's pattern); same bits. skip: no hand-over at all, each holder
// quantizes the block from its own values (WRONG output; the timing floor, for the bench only).
enum class HandOver : uint8_t { fence, lean, skip };
struct GluScratch {
    float* stage = nullptr;        // ff floats
    uint32_t* arrivals = nullptr;  // ff / 32 counts: zero before the first launch, left zero
    HandOver hand_over = HandOver::lean;
};
bool matvec_q8s_swiglu_fits(uint32_t ff, uint32_t cols);

// RMSNorm split across two decode GEMVs, so no launch sits between them. The producer (wo,
// down: matvec_q8s_norm_out_cuda) adds W x into the residual stream and writes the stream
// times the norm's weight quantized per 32 values (act_q16 scales without 1 / rms) and, per
// block, the sum of squares of the new stream. The consumer (q|k|v, gate|up, the head) reads
// that x and scales its sums by inv_rms = 1 / sqrt(sum / cols + eps), from those partial sums
// in a fixed order: W (x inv_rms) = inv_rms (W x). Not the bits of rmsnorm_cuda (its x * inv_rms
// is rounded before the quantization); the same to within f32 rounding.
constexpr uint32_t kNormOutMaxBlocks = 1024;
struct NormedX {
    const float* partials = nullptr;  // the producer's sums of squares; nullptr: x is not normed
    uint32_t n_partials = 0;          // matvec_q8s_norm_out_cuda's return value
    float eps = 0.0f;
};
struct NormOut {
    float* stream = nullptr;        // [rows], += W x
    const float* weight = nullptr;  // [rows], the next RMSNorm's weight
    float* partials = nullptr;      // one per block: matvec_q8s_norm_out_cuda returns the count (<= kNormOutMaxBlocks)
    ActQ16 out;                     // [rows] stream * weight, quantized; must not be x
    GluScratch scratch;             // rows floats and rows / 32 arrival counts, as for the SwiGLU epilogue
    // Lab (SPILLWAY_CHAIN_WO bit 4): let the next kernel launch when this one's producer wait
    // returns, not at its entry (release_at_entry false) nor at its exit. Hands over with fence
    // whatever scratch.hand_over says (same bits), so as not to add instances for a lab variant.
    bool release_after_wait = false;
};

// out must not be x; release_at_entry as for matvec_q8s_cuda. Launches on one scratch must
// not overlap (stream order, or a programmatic successor that waits, as every engine kernel
// does). norm: x came from a norm epilogue (gate and up scaled by its inv_rms).
// The chained sweeps return their block count; stamps (lab, bench "q8s hop timeline
// norm-chain"): their stamped twins, 5 global-timer stamps per block as matvec_q8s_stamped_cuda.
uint32_t matvec_q8s_swiglu_cuda(Q8SplitConst w, ActQ16 x, uint32_t ff, uint32_t cols, ActQ16 out, GluScratch scratch,
                                cudaStream_t stream, bool release_at_entry = false, const NormedX& norm = {},
                                uint64_t* stamps = nullptr);
// rows % 32 == 0 (whole quantized blocks), rows <= 32768, cols as matvec_q8s_fits.
bool matvec_q8s_norm_out_fits(uint32_t rows, uint32_t cols);
// Returns the number of partial sums written (the consumer's NormedX::n_partials).
uint32_t matvec_q8s_norm_out_cuda(Q8SplitConst w, ActQ16 x, uint32_t rows, uint32_t cols, const NormOut& norm,
                                  cudaStream_t stream, bool release_at_entry = false, uint64_t* stamps = nullptr);
// y = inv_rms (W x) for x from a norm epilogue.
uint32_t matvec_q8s_normed_cuda(Q8SplitConst w, ActQ16 x, const NormedX& norm, float* y, uint32_t rows, uint32_t cols,
                                cudaStream_t stream, bool release_at_entry = false, uint64_t* stamps = nullptr);

// Lab (SPILLWAY_QKV_EPILOGUE=1 in the engine): decode's q|k|v GEMV (x from a norm epilogue)
// with the post-QKV work in its epilogue, so no qkv_post launch sits before the attention:
// bias, NeoX RoPE over the whole head, q written rotated, the new cell's K and V written in
// the cache's tiers. A unit of the sweep is one rotation pair, rows i and i + head_dim / 2 of
// a head (the matrix as uploaded), so every block holds whole pairs. Quantized K / V: the 32
// units from a multiple of 32 hold two 32-value cache blocks (dims i and i + head_dim / 2),
// and a group cut between two grid blocks is finished by its last holder through kv_scratch
// (the fence hand-over of the SwiGLU epilogue). Bits: matvec_q8s_normed_cuda followed by
// qkv_post_cuda with the rope table.
struct QkvRope {
    float* q = nullptr;                   // [n_head * head_dim], rotated
    uint8_t* k_row = nullptr;             // the new cell's K row (n_head_kv * head_dim values in k_type)
    uint8_t* v_row = nullptr;             // and its V row
    const float* bias = nullptr;          // q|k|v biases back to back, or null
    const float2* rope_table = nullptr;   // this token's cos / sin, [head_dim / 2]
    uint32_t n_head = 0, n_head_kv = 0, head_dim = 0;
    KvType k_type = KvType::f16, v_type = KvType::f16;
    // Quantized K or V: 2 n_head_kv head_dim floats and n_head_kv head_dim / 32 counts (zero
    // before the first launch; launches leave them zero).
    GluScratch kv_scratch;
};
// head_dim a multiple of 64 (whole 32-value blocks in each half of a head), (n_head + 2
// n_head_kv) head_dim / 2 pairs spread over the SMs at most head_dim / 2 per block, cols as
// matvec_q8s_fits.
bool matvec_q8s_qkv_rope_fits(uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, uint32_t cols);
uint32_t matvec_q8s_qkv_rope_cuda(Q8SplitConst w, ActQ16 x, const NormedX& norm, uint32_t cols, const QkvRope& rope,
                                  cudaStream_t stream, bool release_at_entry = false);

// Decode fusion (session 28): the sweep GEMV forms x itself from what the previous ops left
// in f32, so no RMSNorm or SwiGLU launch sits between two GEMVs, and adds W x into the
// residual stream itself, so no launch is needed for the add. Every block computes the same
// x with the same operations in the same order as rmsnorm_cuda's one-row kernel and
// swiglu_q16_cuda, quantized as act_q16: the bits of the separate path.
enum class GemvXFrom : uint8_t {
    q16,      // x already quantized (q16)
    rmsnorm,  // x = RMSNorm(a) * b: a the residual stream, b the norm's weight, eps
    swiglu,   // x = silu(a) * b: a gate, b up
};
struct GemvX {
    GemvXFrom from = GemvXFrom::q16;
    ActQ16 q16;
    const float* a = nullptr;
    const float* b = nullptr;
    float eps = 0.0f;
};
// Whether matvec_q8s_fused_cuda takes this row length: matvec_q8s_fits and cols <= 20480
// (two f32 vectors staged in shared memory), and no non-sweep variant forced by the lab knob.
// (rmsnorm_cuda's one-row kernel, whose bits the fused RMSNorm repeats, takes dim <= 16384.)
bool matvec_q8s_fused_fits(uint32_t cols);
// y = W x, or y += W x when accumulate (y[r] + (W x)[r], as rmsnorm_cuda's residual add);
// inputs 16-byte aligned. release_at_entry as for matvec_q8s_cuda.
void matvec_q8s_fused_cuda(Q8SplitConst w, const GemvX& x, float* y, bool accumulate, uint32_t rows, uint32_t cols,
                           cudaStream_t stream, bool release_at_entry = false);

}  // namespace spillway
