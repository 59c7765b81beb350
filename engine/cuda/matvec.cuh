#pragma once
// Decode matrix-vector product y = W x for weights in GGUF layout (row-major, each row
// `cols` values in the type's block layout), x and y in f32. A small batch of up to
// kMatvecMaxTokens vectors shares one pass over W (x: [n_tokens][cols], y: [n_tokens][rows]).
// Memory-bound: the kernels aim to read W once at HBM speed (see docs/perf-notes.md).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_quant.cuh"
#include "gguf/ggml_types.h"

namespace spillway {

constexpr uint32_t kMatvecMaxTokens = 8;

// F16, BF16 and Q8_0 weights. cols must be a multiple of 32 (Q8_0) or 8 (F16/BF16);
// w must be 16-byte aligned (cudaMalloc gives 256).
bool matvec_supports(GgmlType w_type);
void matvec_cuda(GgmlType w_type, const void* w, const float* x, float* y, uint32_t rows,
                 uint32_t cols, uint32_t n_tokens, cudaStream_t stream);

// Q8_0 kernel variants (docs/perf-notes.md, "Q8_0 GEMV streaming kernel").
//   staged: the first kernel (shared-memory slabs decoded in quarter blocks; any batch, any cols).
//   stream2 / stream3: one token, cols % 256 == 0 (rows start 16-byte aligned and hold a
//   multiple of 4 block pairs); each warp streams two rows through a 2- or 3-stage cp.async
//   ring and decodes 8 weights per lane from 4-byte-aligned words of each 68-byte block pair.
//   stream2_i8: stream2 with x quantized per 32 values to int8 (dp4a); NOT exact in x: results
//   differ from the f32-x product by x's rounding (~4e-3 relative); never picked by default.
enum class MatvecQ8Kernel : uint8_t { staged, stream2, stream3, stream2_i8 };
// Pure: the Q8_0 kernel matvec_cuda uses for this shape.
MatvecQ8Kernel matvec_q8_0_kernel_for(uint32_t cols, uint32_t n_tokens);
// Whether `kernel` can take this shape.
bool matvec_q8_0_kernel_fits(MatvecQ8Kernel kernel, uint32_t cols, uint32_t n_tokens);
// matvec_cuda for Q8_0 with the kernel forced (tests and benchmarks); fails if it does not fit.
void matvec_q8_0_cuda(MatvecQ8Kernel kernel, const void* w, const float* x, float* y, uint32_t rows,
                      uint32_t cols, uint32_t n_tokens, cudaStream_t stream);

// Q8_0, one token, x already quantized to int16 blocks by its producer (act_quant.cuh): the
// decode path of the engine (docs/perf-notes.md, "Q8_0 GEMV on pre-quantized x"). Results
// differ from the f32-x product only by x's 16-bit rounding (~2e-5 relative).
// Variants: x copied to shared memory per block (4 or 8 warps per block), or read via L1;
// two rows per warp, or one (_r1: finer work split for matrices with few rows per warp).
// smem4_s3: smem4 with a third ring stage (two chunks in flight per warp, fewer resident
// blocks): for the output head's long steady state (picked for matrices of >= 65536 rows);
// smem4_s4: a fourth stage (slower on every shape; bench and tests only).
enum class MatvecQ16xKernel : uint8_t { smem4, smem8, global4, smem4_r1, smem8_r1, smem4_s3, smem4_s4 };
// cols % 256 == 0 and cols <= 32768 (x in shared memory).
bool matvec_q8_0_q16x_fits(uint32_t cols);
// Pure: the variant matvec_q8_0_q16x_cuda uses for this shape.
MatvecQ16xKernel matvec_q8_0_q16x_kernel_for(uint32_t rows, uint32_t cols);
// release_at_entry: the kernel launched after this one on the stream may be scheduled as soon
// as this one starts (programmatic launch; it must wait for this one itself, as the engine's
// small kernels do) instead of once this one's last block exits. For a dependent GEMV this
// is slower (it competes for the SMs' memory queues while this one runs; session 17).
void matvec_q8_0_q16x_cuda(const void* w, ActQ16 x, float* y, uint32_t rows, uint32_t cols, cudaStream_t stream,
                           bool release_at_entry = false);
// Whether this variant splits the shape's work by chunks of a row pair rather than by whole
// row pairs (matvec.cu: when pairs do not divide evenly over the resident warps, e.g. 5120
// rows; SPILLWAY_Q16X_SPLIT=pairs turns it off). Queries the device's occupancy.
bool matvec_q8_0_q16x_splits_by_chunks(MatvecQ16xKernel kernel, uint32_t rows, uint32_t cols);
void matvec_q8_0_q16x_cuda_with(MatvecQ16xKernel kernel, const void* w, ActQ16 x, float* y, uint32_t rows,
                                uint32_t cols, cudaStream_t stream, bool release_at_entry = false);

}  // namespace spillway
