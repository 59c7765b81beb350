#include "engine/cuda/cuda_prefill.cuh"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "engine/cuda/attention.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kv_tile.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/op_times.h"
#include "engine/cuda/prefill_attention_m32.cuh"
#include "engine/cuda/prefill_attention_mma.cuh"
#include "engine/cuda/prefill_attention_wgmma.cuh"
#include "engine/cuda/prefill_gemm_q8s.cuh"
#include "engine/cuda/q8_half_device.cuh"

namespace spillway {
namespace {

__global__ void f32_to_f16_kernel(const float* in, __half* out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(in[i]);
}

// One thread per 8 consecutive values of the tile, written as one 16-byte store, so a warp
// writes 512 contiguous bytes (the first version wrote 32 two-byte values per thread with a
// 64-byte stride across the warp). Q8_0: the quants become halves by the 0x64 byte trick
// and one half2 multiply by d (d * q rounded once to f16, as from f32: the product is exact
// in f32). BF16: converted through f32; F16: copied.
__device__ __forceinline__ uint32_t u16_pair(const uint8_t* p) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return __byte_perm(h[0], h[1], 0x5410);
}

// One thread per 8 values of a quantized cache row (kv_tile::dequant8_quantized, the tile
// dequantization of the attention kernels), one 16-byte store.
template <KvType T>
__global__ void kv_rows_to_f16_kernel(const uint8_t* rows, uint64_t row_bytes, uint32_t n_rows, uint32_t row_values,
                                      __half* out) {
    const uint32_t units_per_row = row_values / 8;
    const uint64_t n = (uint64_t)n_rows * units_per_row;
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < n; u += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t row = u / units_per_row;
        const uint32_t j = (uint32_t)(u % units_per_row);
        reinterpret_cast<uint4*>(out + row * row_values)[j] = kv_tile::dequant8_quantized<T>(rows + row * row_bytes, j);
    }
}

__global__ void dequantize_rows_kernel(int type, const uint8_t* src, uint64_t row_bytes, uint32_t n_in,
                                       uint32_t n_rows, __half* out) {
    const uint32_t units_per_row = n_in / 8;
    const uint64_t n_units = (uint64_t)n_rows * units_per_row;
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < n_units; u += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = u / units_per_row, j = u % units_per_row;  // values 8j .. 8j+7 of row r
        const uint8_t* row = src + r * row_bytes;
        uint4 v;
        if (type == (int)GgmlType::Q8_0) {
            const uint8_t* blk = row + (j / 4) * 34;
            const __half2 d = __half2half2(*reinterpret_cast<const __half*>(blk));
            const uint32_t lo = u16_pair(blk + 2 + 8 * (j % 4)) ^ 0x80808080u;
            const uint32_t hi = u16_pair(blk + 6 + 8 * (j % 4)) ^ 0x80808080u;
            v = make_uint4(q8_pair_to_half2(lo, 0x4140, d), q8_pair_to_half2(lo, 0x4342, d),
                           q8_pair_to_half2(hi, 0x4140, d), q8_pair_to_half2(hi, 0x4342, d));
        } else {
            const unsigned short* x = reinterpret_cast<const unsigned short*>(row) + j * 8;
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (type == (int)GgmlType::BF16) {
                    const __half2 h = __floats2half2_rn(__uint_as_float((uint32_t)x[2 * i] << 16),
                                                        __uint_as_float((uint32_t)x[2 * i + 1] << 16));
                    w[i] = *reinterpret_cast<const uint32_t*>(&h);
                } else {
                    w[i] = (uint32_t)x[2 * i] | ((uint32_t)x[2 * i + 1] << 16);
                }
            }
            v = make_uint4(w[0], w[1], w[2], w[3]);
        }
        *reinterpret_cast<uint4*>(out + r * n_in + j * 8) = v;
    }
}

// The split layout (matvec_q8s.cuh): codes [n_rows][n_in] from `codes`, scales [n_rows][n_in / 32];
// the same conversion as the GGUF branch above, so the tile is bit-identical.
__global__ void dequantize_split_rows_kernel(const int8_t* codes, const uint16_t* scales, uint32_t n_in,
                                             uint32_t n_rows, __half* out) {
    const uint32_t units_per_row = n_in / 8;
    const uint64_t n_units = (uint64_t)n_rows * units_per_row;
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < n_units; u += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = u / units_per_row, j = u % units_per_row;  // values 8j .. 8j+7 of row r
        const uint2 q = *reinterpret_cast<const uint2*>(codes + r * n_in + j * 8);
        const __half2 d = __half2half2(__ushort_as_half(scales[r * (n_in / 32) + j / 4]));
        const uint32_t lo = q.x ^ 0x80808080u, hi = q.y ^ 0x80808080u;
        *reinterpret_cast<uint4*>(out + r * n_in + j * 8) =
            make_uint4(q8_pair_to_half2(lo, 0x4140, d), q8_pair_to_half2(lo, 0x4342, d),
                       q8_pair_to_half2(hi, 0x4140, d), q8_pair_to_half2(hi, 0x4342, d));
    }
}

unsigned grid_for(uint64_t n, unsigned threads) {
    return (unsigned)std::max<uint64_t>(1, std::min<uint64_t>((n + threads - 1) / threads, 132ull * 32));
}

// Value d of one head's slice of a cell, decoded from the tier's GGUF block layout.
__device__ __forceinline__ float kv_value(int type, const uint8_t* slice, uint32_t d) {
    if (type == (int)KvType::f16) return __half2float(reinterpret_cast<const __half*>(slice)[d]);
    if (type == (int)KvType::q8_0) {
        const uint8_t* b = slice + (d / 32) * 34;
        return __half2float(*reinterpret_cast<const __half*>(b)) * (float)(int8_t)b[2 + d % 32];
    }
    const uint8_t* b = slice + (d / 32) * 18;
    const uint32_t j = d % 32;
    const int q = j < 16 ? (b[2 + j] & 0x0F) : (b[2 + j - 16] >> 4);
    return __half2float(*reinterpret_cast<const __half*>(b)) * (float)(q - 8);
}

constexpr int kCells = 32;       // cells per tile (one per lane in the softmax)
constexpr int kMaxGroup = 16;
constexpr int kThreads = 128;

struct PrefillParams {
    const float* q;
    const uint8_t* k;
    const uint8_t* v;
    uint64_t k_row, v_row, k_slice, v_slice;
    int k_type, v_type;
    uint32_t n_head, n_group, pos0, cell_begin, cell_end;  // cells [cell_begin, cell_end) of the layer
    float scale;
    float* out;
    float* lse;  // may be null
};

// Block = (KV head, query token): the KV head's cells are read once for its G query heads.
// Per tile of 32 cells: K and V dequantized to f32 in shared memory, scores G x 32, online
// softmax (one warp per query head, one lane per cell), then acc = acc*alpha + P V.
// The token sees cells [cell_begin, min(cell_end, pos0 + t + 1)); p.k / p.v point at
// cell_begin. No visible cell: out = 0, lse = -inf (the merge identity).
template <int D>
__global__ void __launch_bounds__(kThreads) prefill_attention_kernel(PrefillParams p) {
    __shared__ float qs[kMaxGroup][D];
    __shared__ float ks[kCells][D + 1];  // +1: lanes reading different cells hit different banks
    __shared__ float vs[kCells][D];
    __shared__ float ps[kMaxGroup][kCells];
    __shared__ float run_max[kMaxGroup], run_sum[kMaxGroup], alpha[kMaxGroup];
    const uint32_t kv_head = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const uint32_t G = p.n_group;
    const uint32_t visible_end = min(p.cell_end, p.pos0 + t + 1);
    const uint32_t n_cells = visible_end > p.cell_begin ? visible_end - p.cell_begin : 0;
    for (uint32_t i = tid; i < G * D; i += kThreads) {
        const uint32_t g = i / D, d = i % D;
        qs[g][d] = p.q[((size_t)t * p.n_head + kv_head * G + g) * D + d] * p.scale;
    }
    if (tid < kMaxGroup) {
        run_max[tid] = -INFINITY;
        run_sum[tid] = 0.0f;
    }
    constexpr int kAcc = kMaxGroup * D / kThreads;
    float acc[kAcc];
#pragma unroll
    for (int j = 0; j < kAcc; ++j) acc[j] = 0.0f;
    const uint8_t* k_base = p.k + kv_head * p.k_slice;
    const uint8_t* v_base = p.v + kv_head * p.v_slice;

    for (uint32_t c0 = 0; c0 < n_cells; c0 += kCells) {
        __syncthreads();  // previous tile fully consumed
        for (uint32_t i = tid; i < kCells * D; i += kThreads) {
            const uint32_t c = i / D, d = i % D, cell = c0 + c;
            const bool ok = cell < n_cells;
            ks[c][d] = ok ? kv_value(p.k_type, k_base + cell * p.k_row, d) : 0.0f;
            vs[c][d] = ok ? kv_value(p.v_type, v_base + cell * p.v_row, d) : 0.0f;
        }
        __syncthreads();
        for (uint32_t i = tid; i < G * kCells; i += kThreads) {
            const uint32_t g = i / kCells, c = i % kCells;
            float s = 0.0f;
#pragma unroll 16
            for (int d = 0; d < D; ++d) s = fmaf(qs[g][d], ks[c][d], s);
            ps[g][c] = c0 + c < n_cells ? s : -INFINITY;
        }
        __syncthreads();
        for (uint32_t g = warp; g < G; g += kThreads / 32) {
            const float s = ps[g][lane];
            float m = s;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float m_old = run_max[g];
            const float m_new = fmaxf(m_old, m);  // finite: cell c0 is always valid
            const float e = __expf(s - m_new);
            float sum = e;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            ps[g][lane] = e;
            __syncwarp();
            if (lane == 0) {
                const float a = __expf(m_old - m_new);
                alpha[g] = a;
                run_sum[g] = run_sum[g] * a + sum;
                run_max[g] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kAcc; ++j) {
            const uint32_t idx = tid + kThreads * j, g = idx / D, d = idx % D;
            if (g < G) {
                float o = 0.0f;
#pragma unroll 8
                for (int c = 0; c < kCells; ++c) o = fmaf(ps[g][c], vs[c][d], o);
                acc[j] = acc[j] * alpha[g] + o;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < kAcc; ++j) {
        const uint32_t idx = tid + kThreads * j, g = idx / D, d = idx % D;
        if (g < G) {
            const size_t head = (size_t)t * p.n_head + kv_head * G + g;
            const bool seen = n_cells > 0;
            p.out[head * D + d] = seen ? acc[j] / run_sum[g] : 0.0f;
            if (p.lse && d == 0) p.lse[head] = seen ? run_max[g] + logf(run_sum[g]) : -INFINITY;
        }
    }
}

}  // namespace

void dequantize_rows_f16_cuda(const CudaMatrix& w, uint32_t r0, uint32_t n_rows, __half* out, cudaStream_t stream) {
    if (w.n_in % 32 != 0) fail("dequantize_rows_f16_cuda: n_in must be a multiple of 32");
    const uint64_t n_units = (uint64_t)n_rows * (w.n_in / 8);
    if (w.q8_scales != nullptr) {
        dequantize_split_rows_kernel<<<grid_for(n_units, 256), 256, 0, stream>>>(
            reinterpret_cast<const int8_t*>(w.data) + (uint64_t)r0 * w.n_in, w.q8_scales + (uint64_t)r0 * (w.n_in / 32),
            w.n_in, n_rows, out);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
        return;
    }
    dequantize_rows_kernel<<<grid_for(n_units, 256), 256, 0, stream>>>((int)w.type, w.data + (uint64_t)r0 * w.row_bytes,
                                                                       w.row_bytes, w.n_in, n_rows, out);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

uint32_t prefill_tile_rows(uint32_t n_out, uint32_t n_in, size_t tile_elems, bool greedy) {
    if (n_in == 0 || n_out == 0) return 0;
    const uint64_t fit = std::min<uint64_t>(n_out, tile_elems / n_in);
    if (fit == 0) return 0;
    if (fit == n_out) return n_out;
    if (greedy) return fit > 128 ? (uint32_t)(fit / 128 * 128) : (uint32_t)fit;
    const uint64_t n_tiles = (n_out + fit - 1) / fit;
    const uint64_t even = (n_out + n_tiles - 1) / n_tiles;
    const uint64_t rounded = (even + 127) / 128 * 128;
    return (uint32_t)(rounded <= fit ? rounded : even);
}

size_t prefill_tile_elems(const std::vector<std::pair<uint32_t, uint32_t>>& shapes, size_t cap_elems, bool greedy) {
    size_t widest = 0;
    for (const auto& [n_out, n_in] : shapes)
        widest = std::max(widest, (size_t)prefill_tile_rows(n_out, n_in, cap_elems, greedy) * n_in);
    return widest;
}

bool prefill_overlaps_dequant(uint32_t max_tokens) {
    static const int forced = lab_knob_choice("SPILLWAY_PREFILL_OVERLAP", {"0", "1"});
    if (forced >= 0) return forced == 1;
    // 1024-token chunks measured the same with one tile or two (session 41), so one: 50 MiB less.
    return max_tokens > 1024;
}

void prefill_act_to_f16_cuda(const float* x, size_t n, __half* act_f16, cudaStream_t stream) {
    f32_to_f16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, act_f16, n);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    op_times_mark("act f32->f16", stream);
}

bool matmul_prefill_codes_cuda(const CudaMatrix& w, uint32_t n_tokens, std::span<const GemmOutput> outs,
                               PrefillGemmScratch& sc, cudaStream_t stream, bool add_to_y) {
    // Lab: SPILLWAY_GEMM_BLOCK_TOKENS=128|256, the Hopper kernel's block width for all rows (else
    // chosen per shape, possibly two launches: prefill_gemm_q8s_split).
    static const uint32_t block_tokens = lab_knob_uint("SPILLWAY_GEMM_BLOCK_TOKENS", 0, 256);
    if (block_tokens != 0 && block_tokens != 128 && block_tokens != 256)
        fail("SPILLWAY_GEMM_BLOCK_TOKENS must be 128 or 256");
    const Q8sGemmSplit split = block_tokens == 256   ? Q8sGemmSplit{w.n_out, 0}
                               : block_tokens == 128 ? Q8sGemmSplit{0, w.n_out}
                                                     : Q8sGemmSplit{};
    // The partials' memory may be an output of this very launch (gate|up written as f32, without
    // the SwiGLU epilogue, lands in the half of gate_up they are kept in): then whole tiles only.
    GemmWorkspace workspace = sc.gemm_workspace;
    const auto* ws_begin = reinterpret_cast<const uint8_t*>(workspace.partials);
    const auto* ws_end = ws_begin + workspace.partial_floats * sizeof(float);
    for (const GemmOutput& o : outs) {
        const auto* y_begin = reinterpret_cast<const uint8_t*>(o.y);
        const auto* y_end = y_begin + (size_t)n_tokens * o.y_stride * sizeof(float);
        if (workspace.partials != nullptr && y_begin < ws_end && ws_begin < y_end) workspace = GemmWorkspace{};
    }
    return prefill_gemm_reads_codes(w) &&
           prefill_gemm_q8s_cuda(w, sc.act_f16, n_tokens, outs, add_to_y, stream, split, workspace);
}

bool prefill_gemm_reads_codes(const CudaMatrix& w) {
    // Lab: SPILLWAY_PREFILL_GEMM=cublas, every matrix through f16 tiles (the default before session 43).
    static const bool tiles_only = lab_knob("SPILLWAY_PREFILL_GEMM", "cublas", "wgmma");
    return !tiles_only && prefill_gemm_q8s_takes(w);
}

void matmul_prefill_f16act_cuda(cublasHandle_t cublas, const CudaMatrix& w, uint32_t n_tokens, float* y,
                                PrefillGemmScratch& sc, cudaStream_t stream, const char* op_label, bool add_to_y) {
    const GemmOutput out{y, w.n_out, w.n_out};
    if (matmul_prefill_codes_cuda(w, n_tokens, std::span<const GemmOutput>(&out, 1), sc, stream, add_to_y)) {
        op_times_mark(op_label, stream);
        return;
    }
    SPILLWAY_CUDA_CHECK(cublasSetStream(cublas, stream));
    const bool in_place = w.type == GgmlType::F16;
    const uint32_t tile_rows = in_place ? w.n_out : prefill_tile_rows(w.n_out, w.n_in, sc.tile_elems, sc.greedy_tiles);
    if (tile_rows == 0) fail("matmul_prefill_cuda: weight scratch smaller than one row");
    const bool overlap = !in_place && sc.tiles[1] != nullptr;
    if (sc.tiles[1] != nullptr && (sc.side == nullptr || !sc.dequant_done[0] || !sc.dequant_done[1] ||
                                   !sc.gemm_done[0] || !sc.gemm_done[1]))
        fail("matmul_prefill_cuda: two weight tiles need the side stream and its four events");
    const float one = 1.0f, beta = add_to_y ? 1.0f : 0.0f;
    for (uint32_t r0 = 0; r0 < w.n_out; r0 += tile_rows) {
        const uint32_t rows = std::min(tile_rows, w.n_out - r0);
        const __half* a;
        const uint32_t b = sc.next_tile;  // the tile buffer this GEMM reads (with overlap)
        if (in_place) {
            a = reinterpret_cast<const __half*>(w.data + (uint64_t)r0 * w.row_bytes);
        } else if (!overlap) {
            dequantize_rows_f16_cuda(w, r0, rows, sc.tiles[0], stream);
            op_times_mark("dequant weights -> f16", stream);
            a = sc.tiles[0];
        } else {
            // Tile b is free once the GEMM that last read it is done; the GEMM below waits
            // for its dequantization. (The side stream runs ahead by at most one tile.)
            sc.next_tile ^= 1u;
            SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(sc.side, sc.gemm_done[b], 0));
            dequantize_rows_f16_cuda(w, r0, rows, sc.tiles[b], sc.side);
            SPILLWAY_CUDA_CHECK(cudaEventRecord(sc.dequant_done[b], sc.side));
            SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(stream, sc.dequant_done[b], 0));
            op_times_mark("wait for the tile's dequantization", stream);
            a = sc.tiles[b];
        }
        // Column-major view: C (rows x T, ldc n_out) = A^T (rows x n_in) * B (n_in x T).
        SPILLWAY_CUDA_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n_tokens, (int)w.n_in, &one,
                                         a, CUDA_R_16F, (int)w.n_in, sc.act_f16, CUDA_R_16F, (int)w.n_in, &beta, y + r0,
                                         CUDA_R_32F, (int)w.n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (overlap) SPILLWAY_CUDA_CHECK(cudaEventRecord(sc.gemm_done[b], stream));
        op_times_mark(op_label, stream);
    }
}

void matmul_prefill_cuda(cublasHandle_t cublas, const CudaMatrix& w, const float* x, uint32_t n_tokens, float* y,
                         __half* act_f16, __half* w_tile, size_t w_tile_elems, cudaStream_t stream,
                         const char* op_label) {
    prefill_act_to_f16_cuda(x, (size_t)n_tokens * w.n_in, act_f16, stream);
    PrefillGemmScratch sc;
    sc.act_f16 = act_f16;
    sc.tiles[0] = w_tile;
    sc.tile_elems = w_tile_elems;
    matmul_prefill_f16act_cuda(cublas, w, n_tokens, y, sc, stream, op_label);
}

const char* prefill_attention_kernel_name(PrefillAttentionKernel kernel) {
    switch (kernel) {
        case PrefillAttentionKernel::simt: return "simt";
        case PrefillAttentionKernel::tensor_core: return "tensor_core";
        case PrefillAttentionKernel::tensor_core_wide: return "tensor_core_wide";
        case PrefillAttentionKernel::tensor_core_m32: return "tensor_core_m32";
        case PrefillAttentionKernel::tensor_core_m32_wide: return "tensor_core_m32_wide";
        case PrefillAttentionKernel::tensor_core_m32_unsplit: return "tensor_core_m32_unsplit";
        case PrefillAttentionKernel::tensor_core_wgmma: return "tensor_core_wgmma";
    }
    return "?";
}

PrefillAttentionKernel prefill_attention_kernel_for(const AttentionShape& shape, KvType k_type, KvType v_type,
                                                    uint32_t n_tokens, uint32_t n_cells, bool wgmma) {
    if (wgmma && shape.head_dim_k == 128 && shape.head_dim_v == 128) return PrefillAttentionKernel::tensor_core_wgmma;
    if (k_type != KvType::f16 || v_type != KvType::f16) return PrefillAttentionKernel::tensor_core_m32_wide;
    const uint64_t rows_per_kv_head = (uint64_t)n_tokens * (shape.n_head / std::max(1u, shape.n_head_kv));
    if (rows_per_kv_head <= 2560 && n_cells < 8192) return PrefillAttentionKernel::tensor_core;
    return PrefillAttentionKernel::tensor_core_m32;
}

bool prefill_attention_partial_cuda_with(PrefillAttentionKernel kernel, const AttentionShape& shape, const float* q,
                                         KvType k_type, const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                                         uint32_t cell_begin, uint32_t n_cells, uint32_t pos0, uint32_t n_tokens,
                                         float* out, float* lse, cudaStream_t stream, __half* out_f16) {
    if (n_tokens == 0) return false;
    const uint32_t D = shape.head_dim_k;
    if (shape.head_dim_k != shape.head_dim_v || (D != 64 && D != 128) || shape.n_head_kv == 0 ||
        shape.n_head % shape.n_head_kv != 0 || shape.n_head / shape.n_head_kv > (uint32_t)kMaxGroup)
        fail("prefill_attention_cuda: unsupported shape");
    if ((uint64_t)cell_begin + n_cells > UINT32_MAX || (uint64_t)pos0 + n_tokens > UINT32_MAX)
        fail("prefill_attention_cuda: cell range overflows");
    if (kernel == PrefillAttentionKernel::tensor_core_wgmma) {
        if (prefill_attention_wgmma_cuda(shape, q, k_type, k_cells, v_type, v_cells, cell_begin, n_cells, pos0, n_tokens,
                                         out, lse, stream, WgmmaSchedule::automatic, out_f16))
            return out_f16 != nullptr;
        kernel = PrefillAttentionKernel::tensor_core_m32;  // not its tiers / shape, or not an sm_90a build on an sm_90 GPU
    }
    if (kernel == PrefillAttentionKernel::tensor_core_m32 || kernel == PrefillAttentionKernel::tensor_core_m32_wide ||
        kernel == PrefillAttentionKernel::tensor_core_m32_unsplit) {
        if (prefill_attention_m32_cuda(shape, q, k_type, k_cells, v_type, v_cells, cell_begin, n_cells, pos0, n_tokens,
                                       out, lse, kernel == PrefillAttentionKernel::tensor_core_m32_wide,
                                       kernel == PrefillAttentionKernel::tensor_core_m32_unsplit ? 1 : 0, stream))
            return false;
        kernel = PrefillAttentionKernel::tensor_core_wide;  // not enough shared memory per block on this GPU
    }
    if (kernel != PrefillAttentionKernel::simt) {
        prefill_attention_mma_cuda(shape, q, k_type, k_cells, v_type, v_cells, cell_begin, n_cells, pos0, n_tokens, out,
                                   lse, kernel == PrefillAttentionKernel::tensor_core_wide, stream);
        return false;
    }
    PrefillParams p{};
    p.q = q;
    p.k = k_cells;
    p.v = v_cells;
    p.k_slice = kv_row_bytes(k_type, D);
    p.v_slice = kv_row_bytes(v_type, D);
    p.k_row = p.k_slice * shape.n_head_kv;
    p.v_row = p.v_slice * shape.n_head_kv;
    p.k_type = (int)k_type;
    p.v_type = (int)v_type;
    p.n_head = shape.n_head;
    p.n_group = shape.n_head / shape.n_head_kv;
    p.pos0 = pos0;
    p.cell_begin = cell_begin;
    p.cell_end = cell_begin + n_cells;
    p.scale = shape.scale;
    p.out = out;
    p.lse = lse;
    const dim3 grid(shape.n_head_kv, n_tokens);
    if (D == 64) prefill_attention_kernel<64><<<grid, kThreads, 0, stream>>>(p);
    else prefill_attention_kernel<128><<<grid, kThreads, 0, stream>>>(p);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    return false;
}

bool prefill_attention_partial_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                                    KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells,
                                    uint32_t pos0, uint32_t n_tokens, float* out, float* lse, cudaStream_t stream,
                                    __half* out_f16) {
    // Cells the chunk's last token sees in the range.
    const uint64_t stop = std::min<uint64_t>((uint64_t)cell_begin + n_cells, (uint64_t)pos0 + n_tokens);
    const uint32_t seen = stop > cell_begin ? (uint32_t)(stop - cell_begin) : 0;
    // SPILLWAY_PREFILL_WGMMA=0 (lab): the mma.sync choice, to measure the difference.
    static const bool wgmma = !lab_knob("SPILLWAY_PREFILL_WGMMA", "0", "1") && prefill_attention_wgmma_available();
    const PrefillAttentionKernel kernel = prefill_attention_kernel_for(shape, k_type, v_type, n_tokens, seen, wgmma);
    return prefill_attention_partial_cuda_with(kernel, shape, q, k_type, k_cells, v_type, v_cells, cell_begin, n_cells,
                                               pos0, n_tokens, out, lse, stream, out_f16);
}

void kv_rows_to_f16_cuda(KvType type, const uint8_t* rows, uint64_t row_bytes, uint32_t n_rows, uint32_t row_values,
                         __half* out, cudaStream_t stream) {
    if (type != KvType::q8_0 && type != KvType::q4_0) fail("kv_rows_to_f16_cuda: q8_0 or q4_0 rows only");
    if (row_values % 32 != 0 || row_bytes < kv_row_bytes(type, row_values))
        fail("kv_rows_to_f16_cuda: rows must hold whole 32-value blocks");
    if (reinterpret_cast<uintptr_t>(out) % 16 != 0) fail("kv_rows_to_f16_cuda: out must be 16-byte aligned");
    const uint64_t n_units = (uint64_t)n_rows * (row_values / 8);
    if (n_units == 0) return;
    if (type == KvType::q8_0)
        kv_rows_to_f16_kernel<KvType::q8_0><<<grid_for(n_units, 256), 256, 0, stream>>>(rows, row_bytes, n_rows,
                                                                                        row_values, out);
    else
        kv_rows_to_f16_kernel<KvType::q4_0><<<grid_for(n_units, 256), 256, 0, stream>>>(rows, row_bytes, n_rows,
                                                                                        row_values, out);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

uint32_t prefill_kv_f16_piece_cells(uint32_t row_values) {
    const uint64_t fit = (32ull << 20) / (2ull * std::max(1u, row_values));
    return (uint32_t)std::clamp<uint64_t>(fit / 128 * 128, 1024, 65536);
}

bool prefill_attention_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                            KvType v_type, const uint8_t* v_cells, uint32_t pos0, uint32_t n_tokens, float* out,
                            cudaStream_t stream, const PrefillKvF16Scratch* f16, __half* out_f16) {
    const uint32_t n_cells = pos0 + n_tokens;
    const bool k_quant = k_type != KvType::f16, v_quant = v_type != KvType::f16;
    if (f16 == nullptr || (!k_quant && !v_quant))
        return prefill_attention_partial_cuda(shape, q, k_type, k_cells, v_type, v_cells, 0, n_cells, pos0, n_tokens,
                                              out, nullptr, stream, out_f16);
    const bool merged = n_cells > f16->piece_cells;  // more than one piece: partials to merge
    if (f16->piece_cells == 0 || (k_quant && !f16->k) || (v_quant && !f16->v) ||
        (merged && (!f16->piece_out || !f16->piece_lse || !f16->lse)))
        fail("prefill_attention_cuda: incomplete f16 piece scratch");
    const uint32_t k_values = shape.n_head_kv * shape.head_dim_k, v_values = shape.n_head_kv * shape.head_dim_v;
    const uint64_t k_row = kv_row_bytes(k_type, k_values), v_row = kv_row_bytes(v_type, v_values);
    for (uint32_t c0 = 0; c0 < n_cells; c0 += f16->piece_cells) {
        const uint32_t n = std::min(f16->piece_cells, n_cells - c0);
        const uint8_t* k = k_cells + c0 * k_row;
        const uint8_t* v = v_cells + c0 * v_row;
        if (k_quant) {
            kv_rows_to_f16_cuda(k_type, k, k_row, n, k_values, f16->k, stream);
            k = reinterpret_cast<const uint8_t*>(f16->k);
        }
        if (v_quant) {
            kv_rows_to_f16_cuda(v_type, v, v_row, n, v_values, f16->v, stream);
            v = reinterpret_cast<const uint8_t*>(f16->v);
        }
        const bool first = c0 == 0;
        if (!merged)  // one piece: its partial is the output (lse where the caller gave the scratch one)
            return prefill_attention_partial_cuda(shape, q, KvType::f16, k, KvType::f16, v, c0, n, pos0, n_tokens, out,
                                                  f16->lse, stream, out_f16);
        prefill_attention_partial_cuda(shape, q, KvType::f16, k, KvType::f16, v, c0, n, pos0, n_tokens,
                                       first ? out : f16->piece_out,
                                       first ? f16->lse : f16->piece_lse, stream);
        if (!first)
            attention_merge_cuda(shape.n_head * n_tokens, shape.head_dim_v, out, f16->lse, f16->piece_out,
                                 f16->piece_lse, stream);
    }
    return false;
}

}  // namespace spillway
