// The chunk GEMM for split-layout Q8_0 weights on Hopper: y [T x N] = x [T x K] Wᵀ, with the
// weights read as int8 codes + f16 scales and turned into f16 in registers.
//
// Why: the cuBLAS path first writes every weight tile as f16 (2 bytes per weight written, 2
// read back) and, at 512-token chunks, that pass is ~1/3 of a chunk's GEMM time (perf-notes,
// session 41). Here W is wgmma's A operand from registers (the only operand wgmma takes from
// registers), so a warpgroup converts its 64 rows x 16 k of codes into the A fragment right
// before issuing, as CUTLASS's mixed-input GEMMs do; x is B, K-major, read by TMA.
//
// Block: 128 weight rows x kBN tokens (128 or 256). Warpgroup 2 is the producer (one thread
// issues, per 64-k stage, a TMA box of x (64 k x kBN tokens, 128-byte swizzle: wgmma's layout)
// and one of the codes (64 k x 128 rows, 64-byte swizzle: conflict-free 2-byte reads below));
// warpgroups 0 and 1 each own 64 rows and share the x tile. A consumer converts stage t + 1
// into its second fragment set while the wgmmas of stage t run (wait_group 1), so the tensor
// cores see back-to-back groups.
//
// Also: rows split over up to 3 outputs (q | k | v in one launch), the SwiGLU of gate | up in
// the epilogue (kGlu), and a split over k for launches that leave most of a wave idle.
//
// Floors, the 14B q projection at T = 2048 (5120 x 5120): 107 GFLOP, 108 us at the H100's
// ~990 TFLOP/s dense f16 rate; bytes (26 MB codes, 21 MB x, mostly from L2, 42 MB of y) 27 us
// at 3.35 TB/s. Compute-bound: the target is cuBLAS's rate on f16 weights (611-700 TFLOP/s at
// T = 2048) without the dequantization pass. Measured (session 43, H100): 490-615 TFLOP/s at
// 2048 tokens by shape, 643 for gate under Nsight (~80% of the dense rate in active cycles).
#include "engine/cuda/prefill_gemm_q8s.cuh"

#include <cuda.h>

#include <algorithm>
#include <span>
#include <string>

#include "common/error.h"
#include "engine/cuda/act_ops_device.cuh"
#include "engine/cuda/bulk_copy_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/hopper_support.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/q8_half_device.cuh"
#include "engine/cuda/rope_device.cuh"
#include "engine/cuda/tensor_map.cuh"
#include "engine/cuda/warp_specialized_device.cuh"
#include "engine/cuda/wgmma_device.cuh"

namespace spillway {
namespace {

// Set where the kernel below is compiled for sm_90a (read by the host once).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ const int kGemmCompiled = 1;
#else
__device__ const int kGemmCompiled = 0;
#endif

constexpr int kBK = 64;                // k per stage
constexpr int kRows = kQ8sGemmRowBlock;  // weight rows per block: 64 per consumer warpgroup
constexpr int kStages = 4;
constexpr uint32_t kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 4) * 32;
constexpr uint32_t kCodeBytes = kRows * kBK;  // one stage's codes: 128 rows x 64 bytes
[[maybe_unused]] constexpr uint32_t kEpilogue = 1;  // named barrier of the consumer warps
// The epilogue leaves a warp's 16 rows in chunks of 32 tokens, each through a buffer of its own
// ([token][16 rows] f32, 64-byte swizzle: TMA's layout for the store) and two buffers per warp.
constexpr uint32_t kOutTokens = 32;
constexpr uint32_t kWarpRows = 16;
constexpr uint32_t kOutChunkBytes = kOutTokens * kWarpRows * 4;
// kGlu: a warp holds 8 features' gate and up sums and leaves their SwiGLU as f16, all kBN tokens
// at once, through one buffer of its own ([token][8 features], 16-byte rows: the TMA box).
constexpr uint32_t kGluWarpFeatures = 8;
static_assert(kGluWarpFeatures * 256 * 2 <= 2 * kOutChunkBytes, "the SwiGLU buffer fits the warp's two chunk buffers");

template <int kBN>
struct Layout {
    static constexpr uint32_t kXBytes = kBN * kBK * 2;  // one stage's x: kBN tokens x 64 halves
    [[maybe_unused]] static constexpr uint32_t kXBase = 0;
    static constexpr uint32_t kCodeBase = kStages * kXBytes;
    static constexpr uint32_t kOutBase = kCodeBase + kStages * kCodeBytes;
    static constexpr uint32_t kBarBase = kOutBase + kConsumerWarps * 2 * kOutChunkBytes;
    static constexpr uint32_t kSmemBytes = kBarBase + 2 * kStages * 8 + 1024;  // + the base's alignment
    static_assert(kSmemBytes <= 227 * 1024, "one block per SM");
    static_assert(kOutBase % 1024 == 0, "the output buffers sit at whole swizzle patterns");
};

// Where (row, token) of a warp's output chunk sits in its buffer: 64-byte rows of 16 floats,
// 16-byte column j at j ^ ((token / 2) % 4) (TMA's 64-byte swizzle, which also spreads a
// fragment store's 4 tokens over the banks).
__host__ __device__ constexpr uint32_t out_chunk_offset(uint32_t token, uint32_t row) {
    return token * 64 + (((row / 4) ^ ((token / 2) % 4)) * 16) + (row % 4) * 4;
}

// The launch's rows go to up to 3 outputs (q | k | v): segment i holds rows from
// Params::seg_begin[i] (launch-relative, multiples of kRows) to the next segment's, written
// through the tensor map OutMaps::seg[i] (y from that row on: the segment's rows as columns,
// n_tokens rows; boxes of 16 x 32), which clips rows and tokens past the output.
constexpr int kMaxSegments = 3;
struct OutMaps {
    CUtensorMap seg[kMaxSegments];
};

struct Params {
    const uint16_t* scales;  // [n_out][n_in / 32] f16, from the launch's first row
    uint32_t n_tokens, n_out, n_in;  // n_out: this launch's rows (kGlu: its features)
    uint32_t n_segments;
    uint32_t seg_begin[kMaxSegments];
    int add_to_y;
    // kGlu: the up row of feature f is gate row f + glu_up_rows; silu(gate) * up goes out as f16
    // through OutMaps::seg[0] (act from the launch's first feature, boxes of 8 features x kBN
    // tokens). kRope: 64, a head's second half (the thread's second row).
    uint32_t glu_up_rows;
    // kRope (tiles of one 128-row head): bias from the launch's first row (or null), RoPE on the
    // rows before rope_end (launch-relative: q and k) with rope_cs [n_tokens][64] (cos, sin);
    // segment i is f16 (boxes of 8 rows x 128 tokens) where bit i of seg_f16 is set, else f32
    // (boxes of 8 rows x 64 tokens).
    const float* bias;
    const float2* rope_cs;
    uint32_t rope_end, seg_f16;
    // The tiles (row blocks x token blocks, the token block fastest) and the last sk_tiles of
    // them cut along k over the first sk_blocks blocks (prefill_gemm_q8s_schedule); partials /
    // flags as in GemmWorkspace.
    uint32_t token_blocks, n_tiles, sk_tiles, sk_blocks;
    float* partials;
    uint32_t* flags;
};

// What a block multiplies, in order: tile, stage steps [k_begin, k_end), and what it does with
// the sum.
enum class Part : uint32_t {
    whole,  // the whole tile: written to the outputs
    later,  // a share of a tile after its first step: the partial goes to the block's slot
    first,  // the share from the tile's first step: the later shares' partials are added, then written
};
struct WorkItem {
    uint32_t tile, k_begin, k_end;
    Part part;
};

// A block's share of the launch: first whole tiles b, b + grid, ... of the tiles before the cut
// ones (a multiple of grid where there are cut ones); then its share of the cut tiles' tile *
// n_k + step units, split evenly in order over the first sk_blocks blocks: block b takes units
// [b U / sk_blocks, (b + 1) U / sk_blocks), in that order: a later share of one tile (at most),
// whole tiles, then the first share of another (at most). A tile's first share is the last thing
// its block does and the later shares are the first things their blocks do in the cut part, so
// the block that adds them up finds them written (the shares differ by a step at most).
struct BlockWork {
    uint64_t units;  // the cut tiles' units
    uint32_t grid, block, dp_tiles, sk_blocks;
    uint32_t n_whole, n_cut;  // whole tiles, then items over cut tiles
    // The cut tiles the block touches (counted from the first cut tile): first_tile (from step
    // first_k) to last_tile (to step last_k, exclusive). 32-bit, so that the producer's loop
    // stays in its few registers.
    uint32_t first_tile, first_k, last_tile, last_k;

    __device__ uint64_t share_begin(uint32_t b) const { return b >= sk_blocks ? units : units * b / sk_blocks; }
    __device__ BlockWork(const Params& p, uint32_t n_k, uint32_t grid_, uint32_t block_)
        : grid(grid_), block(block_), dp_tiles(p.n_tiles - p.sk_tiles), sk_blocks(p.sk_blocks) {
        units = (uint64_t)p.sk_tiles * n_k;
        const uint64_t a = share_begin(block), b = share_begin(block + 1);
        first_tile = (uint32_t)(a / n_k);
        first_k = (uint32_t)(a - (uint64_t)first_tile * n_k);
        last_tile = a < b ? (uint32_t)((b - 1) / n_k) : first_tile;
        last_k = (uint32_t)(b - (uint64_t)last_tile * n_k);
        n_cut = a < b ? last_tile - first_tile + 1 : 0;
        n_whole = dp_tiles > block ? (dp_tiles - block + grid - 1) / grid : 0;
    }
    __device__ uint32_t count() const { return n_whole + n_cut; }
    __device__ WorkItem item(uint32_t i, uint32_t n_k) const {
        if (i < n_whole) return {block + i * grid, 0, n_k, Part::whole};
        i -= n_whole;
        const uint32_t k_begin = i == 0 ? first_k : 0, k_end = i + 1 == n_cut ? last_k : n_k;
        return {dp_tiles + first_tile + i, k_begin, k_end,
                k_begin > 0 ? Part::later : k_end < n_k ? Part::first : Part::whole};
    }
    // The block holding unit u (the last one whose share begins at or before u).
    __device__ uint32_t block_of(uint64_t u) const {
        return (uint32_t)(((u + 1) * sk_blocks + units - 1) / units - 1);
    }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A 16-bit shared-memory load at a 32-bit shared address. Volatile: it stays after the mbarrier
// wait that makes the bytes valid.
__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
    uint16_t v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
    return v;
}
// Four 8 x 8 b16 matrices from their mma fragments (register i: matrix i, the thread's row
// lane / 4, columns 2 (lane % 4), + 1) to shared memory transposed: row r of the transpose of
// matrix i, 16 bytes, at the address lane i * 8 + r gives.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
// A warp's 8 rows (features, head dims) x 128 tokens of one f16 output: value(a) makes the half2
// of the thread's row for tokens 2c, 2c + 1 of each 8 from that fragment's four accumulators a,
// which is the thread's part of an 8 x 8 (row x token) matrix; stmatrix .trans writes the four
// such matrices of each 32 tokens as one 16-byte line per token (the TMA box's layout) from
// row_at, the buffer + lane * 16 (lane i * 8 + r gives line r of matrix i).
template <typename Value>
__device__ __forceinline__ void stmatrix_128_tokens(uint32_t row_at, const float (&acc)[16][4], Value&& value) {
#pragma unroll
    for (int j0 = 0; j0 < 16; j0 += 4) {
        uint32_t h[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const __half2 v = value(acc[j0 + i]);
            h[i] = *reinterpret_cast<const uint32_t*>(&v);
        }
        stmatrix_x4_trans(row_at + j0 * 8 * 16, h);
    }
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* flag) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
    return v;
}
__device__ __forceinline__ void store_release(uint32_t* flag, uint32_t v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}

// The output segment of the tile from launch row r0 (a tile never straddles two) and the
// segment's first row; chosen in an unrolled loop, as an index into the parameter array would
// copy it to the stack.
struct TileSegment {
    uint32_t index, first;
};
__device__ __forceinline__ TileSegment tile_segment(const Params& p, uint32_t r0) {
    TileSegment seg{0, p.seg_begin[0]};
#pragma unroll
    for (int i = 1; i < kMaxSegments; ++i)
        if (i < (int)p.n_segments && r0 >= p.seg_begin[i]) seg = TileSegment{(uint32_t)i, p.seg_begin[i]};
    return seg;
}

// kRope's epilogue for a warp: its accumulators hold head dims d = f and d + 64 (f = feature,
// the thread's, 8 per warp) of tokens t0 + 8 j + 2 c (+ 1) per 128-token half nb. Bias and NeoX
// RoPE in f32 with qkv_post_cuda's operations (rope_pair_value: the same bits), then out in
// pieces of 2 KiB, each one TMA store from the warp's two buffers in turn (buf, the first;
// chunk counts the warp's pieces): q as f32, 64 tokens x 8 dims; k and v as f16 cache rows,
// 128 tokens x 8 dims (stmatrix .trans, as the SwiGLU epilogue); the f dims, then the f + 64.
template <int kBN>
__device__ __forceinline__ void rope_epilogue(float (&acc)[kBN / 128][16][4], const Params& p, const OutMaps& out_maps,
                                              uint8_t* buf, uint32_t& chunk, uint32_t t0, uint32_t r0,
                                              uint32_t feature, uint32_t lane) {
    const uint32_t g = lane / 4, c = lane % 4;
    const TileSegment seg = tile_segment(p, r0);
    const bool rotate = r0 < p.rope_end, as_f16 = ((p.seg_f16 >> seg.index) & 1) != 0;
    const bool biased = p.bias != nullptr;
    const float bias_lo = biased ? __ldg(p.bias + r0 + feature) : 0.0f;
    const float bias_hi = biased ? __ldg(p.bias + r0 + feature + 64) : 0.0f;
    // Tokens [64 u, 64 u + 64) of the tile, done just before their first piece goes out (all at
    // once, the angles' loads were hoisted together and the wide instance spilled).
    const auto finish_tokens = [&](uint32_t u) {
#pragma unroll
        for (uint32_t jj = 0; jj < 8; ++jj)
#pragma unroll
            for (uint32_t e = 0; e < 2; ++e) {
                float(&a)[4] = acc[u / 2][(u % 2) * 8 + jj];
                float lo = a[e], hi = a[2 + e];
                if (biased) {
                    lo += bias_lo;
                    hi += bias_hi;
                }
                if (rotate) {
                    // A token past the chunk reads the last one's angles (its values are clipped).
                    const uint32_t token = min(t0 + u * 64 + jj * 8 + 2 * c + e, p.n_tokens - 1);
                    const float2 cs = __ldg(p.rope_cs + (size_t)token * 64 + feature);
                    const float rotated_lo = rope_pair_value(lo, hi, cs.x, cs.y, true);
                    hi = rope_pair_value(lo, hi, cs.x, cs.y, false);
                    lo = rotated_lo;
                }
                a[e] = lo;
                a[2 + e] = hi;
            }
    };
    const uint32_t token_stop = min((uint32_t)kBN, p.n_tokens - t0);
    const int32_t col = (int32_t)(r0 - seg.first + feature - g);  // the warp's first dim, in the segment
    const void* map = &out_maps.seg[seg.index];
    // One piece: written by `write` into the warp's next buffer, then one TMA store.
    const auto put_piece = [&](uint32_t half, uint32_t token0, auto&& write) {
        uint8_t* const b = buf + (chunk & 1) * kOutChunkBytes;
        if (lane == 0) bulk_wait_read<1>();  // the store from this buffer two pieces ago has read it
        __syncwarp();
        write(b);
        fence_proxy_async_shared();  // the generic-proxy writes, before the TMA engine reads them
        __syncwarp();
        if (lane == 0) {
            tma_store_2d(map, col + (int32_t)(half * 64), (int32_t)(t0 + token0), b);
            bulk_commit_group();
        }
        ++chunk;
    };
    if (as_f16) {
#pragma unroll
        for (uint32_t nb = 0; nb < kBN / 128; ++nb) {
            if (nb * 128 >= token_stop) break;  // (uniform in the tile)
            finish_tokens(2 * nb);
            finish_tokens(2 * nb + 1);
#pragma unroll
            for (uint32_t half = 0; half < 2; ++half)
                put_piece(half, nb * 128, [&](uint8_t* b) {
                    stmatrix_128_tokens(shared_addr(b) + lane * 16, acc[nb], [&](const float(&a)[4]) {
                        return __floats2half2_rn(a[2 * half], a[2 * half + 1]);
                    });
                });
        }
    } else {
#pragma unroll
        for (uint32_t u = 0; u < kBN / 64; ++u) {
            if (u * 64 >= token_stop) break;
            finish_tokens(u);
#pragma unroll
            for (uint32_t half = 0; half < 2; ++half)
                put_piece(half, u * 64, [&](uint8_t* b) {
                    // [64 tokens][8 dims], 32-byte rows (two-way bank conflicts: 16 stores a piece).
#pragma unroll
                    for (uint32_t jj = 0; jj < 8; ++jj)
#pragma unroll
                        for (uint32_t e = 0; e < 2; ++e)
                            *reinterpret_cast<float*>(b + (jj * 8 + 2 * c + e) * 32 + g * 4) =
                                acc[u / 2][(u % 2) * 8 + jj][2 * half + e];
                });
        }
    }
}
#endif

// What a tile's epilogue does with its sums.
enum class Epi {
    plain,     // y = (or +=) the sums, f32, into the row's output segment
    glu,       // SwiGLU of a feature's gate and up sums, f16
    qkv_rope,  // bias, NeoX RoPE of q and k heads, q as f32, k and v as f16 cache rows
};

// Persistent: each block runs the items of its BlockWork. kGlu: a tile is 64 features' gate rows
// and their up rows, each thread multiplies one feature's gate and up row (warpgroup h features
// 32 h .. 32 h + 31), and the epilogue writes their SwiGLU as f16 (swiglu_f16_cuda's bits): the
// FFN's f32 gate and up never reach memory. kRope: a tile is one 128-row head, each thread
// multiplies its rows d and d + 64 (a NeoX RoPE pair) the same way, and the epilogue does
// qkv_post_cuda's work on them (its bits): the f32 k and v never reach memory.
template <int kBN, Epi kEpi = Epi::plain>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_gemm_q8s_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                            const __grid_constant__ OutMaps out_maps, Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr bool kGlu = kEpi == Epi::glu, kRope = kEpi == Epi::qkv_rope;
    using L = Layout<kBN>;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarBase);
    uint64_t* empty = full + kStages;

    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    constexpr uint32_t kBlockRows = kGlu ? kRows / 2 : kRows;  // rows (kGlu: features) per tile
    const uint32_t n_k = p.n_in / kBK;
    const BlockWork work(p, n_k, gridDim.x, blockIdx.x);
    const uint32_t n_items = work.count();

    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(&full[s], 1);                // the producer's arrival + the stage's bytes
            mbarrier_init(&empty[s], kConsumerWarps);  // one arrival per consumer warp
        }
        mbarrier_init_fence();
    }
    __syncthreads();

    if (warp >= kConsumerWarps) {
        ws::producer_registers();
        if (warp == kConsumerWarps && lane == 0) {
            uint32_t step = 0;  // stage steps loaded so far: the ring's position
            for (uint32_t i = 0; i < n_items; ++i) {
                const WorkItem it = work.item(i, n_k);
                const int32_t t0 = (int32_t)((it.tile % p.token_blocks) * kBN);
                const int32_t r0 = (int32_t)((it.tile / p.token_blocks) * kBlockRows);
                // (The epilogue has buffers of its own: the next item's stages load while it runs.)
                for (uint32_t kt = it.k_begin; kt < it.k_end; ++kt, ++step) {
                    const uint32_t s = step % kStages, use = step / kStages;
                    if (use > 0) mbarrier_wait_parity(&empty[s], (use - 1) & 1);
                    mbarrier_arrive_expect_tx(&full[s], L::kXBytes + kCodeBytes);
                    const int32_t k = (int32_t)(kt * kBK);
                    tma_load_2d(smem + L::kXBase + s * L::kXBytes, &x_map, k, t0, &full[s]);
                    if constexpr (kGlu) {  // two boxes of 64 rows: the gate rows, then the up rows
                        tma_load_2d(smem + L::kCodeBase + s * kCodeBytes, &w_map, k, r0, &full[s]);
                        tma_load_2d(smem + L::kCodeBase + s * kCodeBytes + kCodeBytes / 2, &w_map, k,
                                    r0 + (int32_t)p.glu_up_rows, &full[s]);
                    } else {
                        tma_load_2d(smem + L::kCodeBase + s * kCodeBytes, &w_map, k, r0, &full[s]);
                    }
                }
            }
        }
        return;
    }

    ws::consumer_registers();

    const uint32_t tid = threadIdx.x;  // 0..255: the consumer threads
    const uint32_t g = lane / 4, c = lane % 4;
    // The tile's rows (in the stage's codes) whose fragments the thread converts: wgmma rows g and
    // g + 8 of the warp's 16. kGlu: the codes hold 64 gate rows, then the same features' 64 up
    // rows, and warp w of warpgroup h takes feature f = 32 h + 8 w + g's gate row as its row g
    // and its up row as row g + 8, so that each thread's accumulators hold the gate and up sums
    // of the same (feature, token) pairs and the SwiGLU needs no other thread's values. kRope:
    // the same rows of the head's 128 (dims f and f + 64), for the same reason.
    const uint32_t glu_feature = (warp / 4) * 32 + (warp % 4) * kGluWarpFeatures + g;  // (kGlu, kRope) in the tile
    const uint32_t row_lo = kGlu || kRope ? glu_feature : (warp / 4) * 64 + (warp % 4) * 16 + g;
    const uint32_t row_hi = kGlu || kRope ? glu_feature + 64 : row_lo + 8;
    // Codes of a row: 64 bytes per stage, the 16-byte chunk j stored at chunk j ^ ((row / 2) % 4)
    // (TMA's 64-byte swizzle), so the 8 rows a load instruction touches fall in distinct banks.
    const uint32_t code_lo = row_lo * kBK, code_hi = row_hi * kBK;
    const uint32_t swz_lo = (row_lo / 2) % 4, swz_hi = (row_hi / 2) % 4;
    const uint64_t x_desc = wgmma::smem_desc(smem + L::kXBase, 16, 1024);
    constexpr uint32_t kSlotFloats = kRows * kBN;  // a block's partial

    const uint32_t k64 = q8_bias_bytes();
    const uint32_t smem_base = shared_addr(smem);
    uint32_t step = 0;   // stage steps consumed so far
    uint32_t chunk = 0;  // output chunks written so far: the warp's buffer
    for (uint32_t item = 0; item < n_items; ++item) {
        const WorkItem it = work.item(item, n_k);
        const uint32_t t0 = (it.tile % p.token_blocks) * kBN, r0 = (it.tile / p.token_blocks) * kBlockRows;
        const uint32_t k0 = it.k_begin, n_kt = it.k_end - it.k_begin;

        float acc[kBN / 128][16][4];  // the first stage's wgmmas overwrite it (scale-d 0)
        uint32_t frag0[4][4], frag1[4][4];  // A fragments of two stages: [k16 step][register]
        // The matrix rows (from the launch's first) whose scales the thread needs: kGlu's up row
        // of a feature is glu_up_rows after its gate row.
        const uint32_t feature_lo = r0 + row_lo;
        const uint32_t matrix_lo = feature_lo, matrix_hi = kGlu || kRope ? feature_lo + p.glu_up_rows : feature_lo + 8;
        const bool valid_lo = feature_lo < p.n_out, valid_hi = kGlu ? valid_lo : matrix_hi < p.n_out;
        // Scales come from global memory (L2, mostly) two stages ahead of their use.
        // A row's scales, one u32 (the stage's two f16) per stage, two stages ahead of their use;
        // a row past the matrix reads the first row's (its codes arrive as zeros and its sums are
        // never written), so the loop has no validity test and no address arithmetic but an add.
        const uint32_t* scale_lo = reinterpret_cast<const uint32_t*>(p.scales) +
                                   (size_t)(valid_lo ? matrix_lo : 0) * (p.n_in / 64) + k0;
        const uint32_t* scale_hi = reinterpret_cast<const uint32_t*>(p.scales) +
                                   (size_t)(valid_hi ? matrix_hi : 0) * (p.n_in / 64) + k0;
        uint32_t scales_lo = __ldg(scale_lo), scales_hi = __ldg(scale_hi);
        uint32_t next_lo = n_kt > 1 ? __ldg(scale_lo + 1) : 0;
        uint32_t next_hi = n_kt > 1 ? __ldg(scale_hi + 1) : 0;

        // Stage kt's codes -> the A fragments of its four k16 steps. wgmma's A layout for a warp's
        // 16 rows: register 0 holds (row g, k 2c, 2c + 1), 1 the same of row g + 8, 2 and 3 those
        // at k + 8.
        auto convert = [&](uint32_t kt, uint32_t (&frag)[4][4]) {
            const uint32_t s = (step + kt) % kStages;
            const uint32_t after_lo = kt + 2 < n_kt ? __ldg(scale_lo + kt + 2) : 0;
            const uint32_t after_hi = kt + 2 < n_kt ? __ldg(scale_hi + kt + 2) : 0;
            mbarrier_wait_parity(&full[s], ((step + kt) / kStages) & 1);
            // 32-bit shared addresses: through `smem` (a generic pointer) the loads were generic
            // LDs with 64-bit address arithmetic.
            const uint32_t codes = smem_base + L::kCodeBase + s * kCodeBytes;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint32_t lo_at = code_lo + ((j ^ swz_lo) * 16) + 2 * c, hi_at = code_hi + ((j ^ swz_hi) * 16) + 2 * c;
                const uint32_t w_lo =
                    __byte_perm(lds_u16(codes + lo_at), lds_u16(codes + lo_at + 8), 0x5410) ^ 0x80808080u;
                const uint32_t w_hi =
                    __byte_perm(lds_u16(codes + hi_at), lds_u16(codes + hi_at + 8), 0x5410) ^ 0x80808080u;
                const __half2 d_lo = __half2half2(__ushort_as_half((unsigned short)(j < 2 ? scales_lo : scales_lo >> 16)));
                const __half2 d_hi = __half2half2(__ushort_as_half((unsigned short)(j < 2 ? scales_hi : scales_hi >> 16)));
                frag[j][0] = q8_pair_to_half2<0x4140>(w_lo, k64, d_lo);
                frag[j][1] = q8_pair_to_half2<0x4140>(w_hi, k64, d_hi);
                frag[j][2] = q8_pair_to_half2<0x4342>(w_lo, k64, d_lo);
                frag[j][3] = q8_pair_to_half2<0x4342>(w_hi, k64, d_hi);
            }
            scales_lo = next_lo;
            scales_hi = next_hi;
            next_lo = after_lo;
            next_hi = after_hi;
        };
        auto issue = [&]<bool kFirst = false>(uint32_t kt, const uint32_t (&frag)[4][4]) {
            const uint64_t xd = wgmma::desc_advance(x_desc, ((step + kt) % kStages) * L::kXBytes);
            wgmma::fence();
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int nb = 0; nb < kBN / 128; ++nb)
                    wgmma::mma_m64n128k16<0>(acc[nb], frag[j], wgmma::desc_advance(xd, nb * 128 * 128 + j * 32),
                                             !kFirst || j > 0);
            wgmma::commit();
        };
        auto release = [&](uint32_t kt) {
            if (lane == 0) mbarrier_arrive(&empty[(step + kt) % kStages]);
        };

        // Two stages per iteration, so that each fragment set is a compile-time choice.
        convert(0, frag0);
        issue.template operator()<true>(0, frag0);
        uint32_t kt = 1;
        for (; kt + 1 < n_kt; kt += 2) {
            convert(kt, frag1);
            issue(kt, frag1);
            wgmma::wait<1>();  // stage kt - 1 done: its x is free and frag0 may be rewritten
            release(kt - 1);
            convert(kt + 1, frag0);
            issue(kt + 1, frag0);
            wgmma::wait<1>();
            release(kt);
        }
        if (kt < n_kt) {
            convert(kt, frag1);
            issue(kt, frag1);
            wgmma::wait<1>();
            release(kt - 1);
        }
        wgmma::wait<0>();
        release(n_kt - 1);
        step += n_kt;

        if (it.part == Part::later) {
            // The partial, in the fragments' own order (float4 i of thread t at i * 256 + t:
            // coalesced), for the block that holds the tile's first share.
            float4* slot = reinterpret_cast<float4*>(p.partials + (size_t)blockIdx.x * kSlotFloats);
#pragma unroll
            for (int nb = 0; nb < kBN / 128; ++nb)
#pragma unroll
                for (int j = 0; j < 16; ++j)
                    __stcg(slot + (nb * 16 + j) * 256 + tid,
                           make_float4(acc[nb][j][0], acc[nb][j][1], acc[nb][j][2], acc[nb][j][3]));
            __threadfence();
            ws::named_sync(kEpilogue, kConsumerWarps * 32);
            if (tid == 0) store_release(p.flags + blockIdx.x, 1);
            continue;
        }
        if (it.part == Part::first) {
            // The later shares of this tile, in block order (fixed: the same bits every run).
            const uint64_t tile_last = (uint64_t)(it.tile - work.dp_tiles) * n_k + n_k - 1;
            for (uint32_t from = blockIdx.x + 1; from <= work.block_of(tile_last); ++from) {
                if (work.share_begin(from) == work.share_begin(from + 1)) continue;  // an empty share
                if (tid == 0) {
                    const uint64_t since = global_ns();
                    while (load_acquire(p.flags + from) == 0) {
                        // Every block of the grid is resident (one per SM at most), so the writer
                        // runs; a wait of seconds means a broken schedule, not a slow one.
                        if (global_ns() - since > 10'000'000'000ull) __trap();
                        __nanosleep(64);
                    }
                    p.flags[from] = 0;  // for the next launch: this launch reads it no more
                }
                ws::named_sync(kEpilogue, kConsumerWarps * 32);
                const float4* slot = reinterpret_cast<const float4*>(p.partials + (size_t)from * kSlotFloats);
#pragma unroll
                for (int nb = 0; nb < kBN / 128; ++nb)
#pragma unroll
                    for (int j = 0; j < 16; ++j) {
                        const float4 v = __ldcg(slot + (nb * 16 + j) * 256 + tid);
                        acc[nb][j][0] += v.x;
                        acc[nb][j][1] += v.y;
                        acc[nb][j][2] += v.z;
                        acc[nb][j][3] += v.w;
                    }
            }
        }

        if constexpr (kRope) {
            rope_epilogue<kBN>(acc, p, out_maps, smem + L::kOutBase + warp * 2 * kOutChunkBytes, chunk, t0, r0,
                               glu_feature, lane);
            continue;
        }
        if constexpr (kGlu) {
            // The SwiGLU epilogue: the thread's gate and up sums of feature f (tokens 2c, 2c + 1 of
            // each 8) as one half2, which is the thread's part of an 8 x 8 (feature x token) f16
            // matrix: stmatrix .trans writes the warp's four such matrices of 32 tokens as 32
            // rows of its 8 features (16 bytes), one row per token, and one TMA store takes the
            // buffer's kBN rows to act (clipped to the launch's features and the chunk's tokens).
            uint8_t* const buf = smem + L::kOutBase + warp * 2 * kOutChunkBytes;
            if (lane == 0) bulk_wait_read<0>();  // this buffer's store from the previous tile has read it
            __syncwarp();
#pragma unroll
            for (int nb = 0; nb < kBN / 128; ++nb)
                stmatrix_128_tokens(shared_addr(buf) + (nb * 128 + lane) * 16, acc[nb], [](const float(&a)[4]) {
                    return __floats2half2_rn(silu_times_f16_out(a[0], a[2]), silu_times_f16_out(a[1], a[3]));
                });
            // The generic-proxy writes above, before the TMA engine reads them.
            fence_proxy_async_shared();
            __syncwarp();
            if (lane == 0) {
                tma_store_2d(&out_maps.seg[0], (int32_t)(r0 + glu_feature - g), (int32_t)t0, buf);
                bulk_commit_group();
            }
            continue;
        }
        // The epilogue: each warp leaves its 16 rows x kBN tokens in chunks of 32 tokens, through
        // two buffers of its own, so that it needs no other warp and the producer loads the next
        // item's stages meanwhile. A chunk is one TMA store (y +=: a TMA add in L2) that runs on
        // while the warp goes on, and the rows and tokens past the output are clipped by the
        // tensor map. (Against the whole-tile epilogue through the ring's memory
        // before it: equal at 8k, +3.5% at pp512, session 45; what it saves is instructions.)
        const uint32_t token_stop = min((uint32_t)kBN, p.n_tokens - t0);
        const uint32_t warp_row = (warp / 4) * 64 + (warp % 4) * kWarpRows;  // the warp's first tile row
        const TileSegment seg = tile_segment(p, r0);
        const int32_t seg_col = (int32_t)(r0 - seg.first + warp_row);
#pragma unroll
        for (uint32_t q = 0; q < kBN / kOutTokens; ++q) {
            if (q * kOutTokens >= token_stop) break;  // (the same for every warp of the tile)
            uint8_t* const buf = smem + L::kOutBase + (warp * 2 + (chunk & 1)) * kOutChunkBytes;
            // The store from this buffer two chunks ago has read it.
            if (lane == 0) bulk_wait_read<1>();
            __syncwarp();
            constexpr uint32_t kJPerChunk = kOutTokens / 8;
#pragma unroll
            for (uint32_t jj = 0; jj < kJPerChunk; ++jj)
#pragma unroll
                for (uint32_t e = 0; e < 2; ++e) {
                    const uint32_t nb = q / (128 / kOutTokens), j = (q % (128 / kOutTokens)) * kJPerChunk + jj;
                    const uint32_t token = jj * 8 + 2 * c + e;
                    *reinterpret_cast<float*>(buf + out_chunk_offset(token, g)) = acc[nb][j][e];
                    *reinterpret_cast<float*>(buf + out_chunk_offset(token, g + 8)) = acc[nb][j][2 + e];
                }
            fence_proxy_async_shared();
            __syncwarp();
            if (lane == 0) {
                const void* map = &out_maps.seg[seg.index];
                const int32_t token0 = (int32_t)(t0 + q * kOutTokens);
                if (p.add_to_y) tma_add_2d(map, seg_col, token0, buf);
                else tma_store_2d(map, seg_col, token0, buf);
                bulk_commit_group();
            }
            ++chunk;
        }
    }
    // The last stores have read their buffers (and written y) before the block leaves.
    if (lane == 0) bulk_wait_all();
#else
    __trap();  // launched only where prefill_gemm_q8s_available() (sm_90a code present)
#endif
}

uint32_t sm_count() {
    static const uint32_t n = [] {
        int dev = 0, sms = 0;
        SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        return (uint32_t)std::max(sms, 1);
    }();
    return n;
}

// A launch over the tiles of p's rows: persistent blocks, the tail cut along k where the workspace allows.
template <int kBN, Epi kEpi = Epi::plain>
void launch(const CUtensorMap& x_map, const CUtensorMap& w_map, const OutMaps& out_maps, Params p,
            const GemmWorkspace& workspace, cudaStream_t stream) {
    constexpr bool kGlu = kEpi == Epi::glu;
    constexpr uint32_t kSmemBytes = Layout<kBN>::kSmemBytes;
    auto* kernel = prefill_gemm_q8s_kernel<kBN, kEpi>;
    static bool configured = false;  // once per instance: opt in to > 48 KB of shared memory
    if (!configured) {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
        configured = true;
    }
    constexpr uint32_t kBlockRows = kGlu ? kRows / 2 : kRows;
    p.token_blocks = (p.n_tokens + kBN - 1) / kBN;
    const uint64_t tiles = (uint64_t)p.token_blocks * ((p.n_out + kBlockRows - 1) / kBlockRows);
    if (tiles > UINT32_MAX) fail("prefill GEMM (q8s): too many tiles");
    p.n_tiles = (uint32_t)tiles;
    // Every block must be resident at once (a block holding a tile's first share waits for the
    // others):
    // one per SM at most. Cut tiles need a slot and a flag for every block.
    const uint32_t max_blocks = workspace.max_blocks != 0 ? std::min(workspace.max_blocks, sm_count()) : sm_count();
    const bool stream_k = workspace.partials != nullptr && workspace.flags != nullptr &&
                          workspace.n_flags >= max_blocks &&
                          workspace.partial_floats >= (size_t)max_blocks * kRows * kBN;
    const Q8sGemmSchedule sched = prefill_gemm_q8s_schedule(p.n_tiles, p.n_in / kBK, max_blocks, stream_k);
    p.sk_tiles = sched.sk_tiles;
    p.sk_blocks = sched.sk_blocks;
    p.partials = workspace.partials;
    p.flags = workspace.flags;
    kernel<<<sched.grid, kThreads, kSmemBytes, stream>>>(x_map, w_map, out_maps, p);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

size_t prefill_gemm_q8s_partial_floats(uint32_t blocks) { return (size_t)blocks * kRows * 256; }

Q8sGemmSchedule prefill_gemm_q8s_schedule(uint32_t n_tiles, uint32_t n_k, uint32_t max_blocks, bool stream_k) {
    max_blocks = std::max<uint32_t>(max_blocks, 1);
    if (n_tiles == 0) return {0, 0, 0};
    const uint32_t grid = std::min(n_tiles, max_blocks);
    if (!stream_k || n_k == 0) return {grid, 0, 0};
    // A share of at least kMinShare stage steps: the ring's fill and the partial's round trip
    // cost about that much.
    constexpr uint64_t kMinShare = 4;
    if (n_tiles < max_blocks) {
        // Less than a wave: every tile cut (down at 512 tokens, 80 tiles: 474 against 396 TFLOP/s).
        const uint64_t units = (uint64_t)n_tiles * n_k;
        const uint32_t blocks = (uint32_t)std::clamp<uint64_t>(units / kMinShare, n_tiles, max_blocks);
        return blocks > n_tiles ? Q8sGemmSchedule{blocks, n_tiles, blocks} : Q8sGemmSchedule{n_tiles, 0, 0};
    }
    // A wave or more: whole tiles (the launch's width split follows the waves instead). Cutting
    // the partial wave was measured slower or equal (session 44, H100: down at 2048 tokens 518
    // against 571 TFLOP/s for whole tiles in the wave-following widths; 8k prefill -1%, 64k
    // equal), and cutting it and one whole wave slower still (386): blocks at different k read
    // all of x (56 MB for down) out of step, where whole tiles read it in step from L2.
    return {grid, 0, 0};
}

bool prefill_gemm_q8s_available() {
    static const bool available =
        tensor_map_encoder_available() && sm90a_kernels_usable(&kGemmCompiled, Layout<256>::kSmemBytes);
    return available;
}

bool prefill_gemm_q8s_takes(const CudaMatrix& w) {
    // n_out % 4: y's rows (of n_out floats) 16-byte strided for the epilogue's TMA stores.
    return w.q8_scales != nullptr && w.n_in != 0 && w.n_in % kBK == 0 && w.n_out != 0 && w.n_out % 4 == 0 &&
           reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(w.q8_scales) % 4 == 0 &&
           prefill_gemm_q8s_available();
}

Q8sGemmSplit prefill_gemm_q8s_split(uint32_t n_tokens, uint32_t n_out, uint32_t n_sm, bool balanced) {
    n_sm = std::max<uint32_t>(n_sm, 1);
    const uint64_t row_blocks = (n_out + kRows - 1) / kRows;
    // A wave of 128-token tiles takes 2/3 of a wave of 256-token ones, not 1/2: measured per
    // shape at T = 512..4096 (H100, session 43: gate 433 vs 519 TFLOP/s at T = 1024 where both
    // take the same waves); this weighting picks the faster single width in every row measured.
    if (balanced && row_blocks * ((n_tokens + 255) / 256) < n_sm) {
        const uint64_t wide = row_blocks * ((n_tokens + 255) / 256) * 3, narrow = row_blocks * ((n_tokens + 127) / 128) * 2;
        return wide <= narrow ? Q8sGemmSplit{n_out, 0} : Q8sGemmSplit{0, n_out};
    }
    const auto waves = [&](uint64_t rows_blocks, uint64_t bn) {
        return (rows_blocks * ((n_tokens + bn - 1) / bn) + n_sm - 1) / n_sm;
    };
    const uint64_t all_wide = waves(row_blocks, 256) * 3, all_narrow = waves(row_blocks, 128) * 2;
    // Or whole waves of 256-token tiles over the first row blocks and the rest at 128: the
    // 14B's 5120-row matrices at T = 2048 take 320 tiles of 256, 2.4 waves (3 long ones); as
    // 264 tiles (33 row blocks) + 112 of 128 they take 2 long waves and a short one.
    const uint64_t per_row_block = (n_tokens + 255) / 256;
    const uint64_t wide_blocks = (row_blocks * per_row_block / n_sm) * n_sm / per_row_block;
    const uint64_t mixed = wide_blocks > 0 && wide_blocks < row_blocks
                               ? waves(wide_blocks, 256) * 3 + waves(row_blocks - wide_blocks, 128) * 2
                               : UINT64_MAX;
    if (all_wide <= all_narrow && all_wide <= mixed) return {n_out, 0};
    if (all_narrow <= mixed) return {0, n_out};
    return {(uint32_t)(wide_blocks * kRows), n_out - (uint32_t)(wide_blocks * kRows)};
}

namespace {

// A launch's tensor maps: x in boxes of 64 k x bn tokens, and the codes from row `row0` on
// (`rows` rows) in boxes of 64 k x box_rows; and its parameters but the outputs.
struct Launch {
    CUtensorMap x_map, w_map;
    OutMaps out{};
    Params p{};
};
Launch launch_for(const CudaMatrix& w, uint32_t row0, uint32_t rows, uint32_t box_rows, const __half* x,
                  uint32_t n_tokens, uint32_t n_out, uint32_t bn) {
    Launch l;
    l.x_map = tensor_map_2d(x, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, w.n_in, n_tokens, (uint64_t)w.n_in * 2, kBK, bn,
                            CU_TENSOR_MAP_SWIZZLE_128B, "prefill GEMM (q8s), x");
    l.w_map = tensor_map_2d(w.data + (uint64_t)row0 * w.n_in, CU_TENSOR_MAP_DATA_TYPE_UINT8, w.n_in, rows, w.n_in, kBK,
                            box_rows, CU_TENSOR_MAP_SWIZZLE_64B, "prefill GEMM (q8s), codes");
    l.p.scales = w.q8_scales + (uint64_t)row0 * (w.n_in / 32);
    l.p.n_tokens = n_tokens;
    l.p.n_out = n_out;
    l.p.n_in = w.n_in;
    return l;
}

template <Epi kEpi>
void launch_width(const Launch& l, uint32_t bn, const GemmWorkspace& workspace, cudaStream_t stream) {
    if (bn == 128) launch<128, kEpi>(l.x_map, l.w_map, l.out, l.p, workspace, stream);
    else launch<256, kEpi>(l.x_map, l.w_map, l.out, l.p, workspace, stream);
}

// Whether a launch may cut tiles along k with this workspace (as launch() decides it for wide
// tiles).
bool balances(const GemmWorkspace& workspace) {
    const uint32_t blocks = workspace.max_blocks != 0 ? std::min(workspace.max_blocks, sm_count()) : sm_count();
    return workspace.partials != nullptr && workspace.flags != nullptr && workspace.n_flags >= blocks &&
           workspace.partial_floats >= prefill_gemm_q8s_partial_floats(blocks);
}

// The split to run: checked when given (rows_wide + rows_narrow == n_out; rows_wide a multiple
// of 128 where rows_narrow > 0, or always with whole_blocks), else chosen; with the shape
// checks every entry shares.
Q8sGemmSplit split_to_run(Q8sGemmSplit split, uint32_t n_out, uint32_t n_tokens, bool whole_blocks, bool balanced,
                          const char* who) {
    const bool automatic = split.rows_wide == 0 && split.rows_narrow == 0;
    if (!automatic && ((uint64_t)split.rows_wide + split.rows_narrow != n_out ||
                       ((whole_blocks || split.rows_narrow != 0) && split.rows_wide % kRows != 0)))
        fail(std::string(who) + ": a split must cover the " + std::to_string(n_out) +
             " rows, wide ones a multiple of 128 unless they are all, got " + std::to_string(split.rows_wide) + " + " +
             std::to_string(split.rows_narrow));
    // TMA coordinates are int32.
    if (n_tokens > (uint32_t)INT32_MAX - 256 || n_out > (uint32_t)INT32_MAX - kRows)
        fail(std::string(who) + ": shape overflows the tensor maps");
    return automatic ? prefill_gemm_q8s_split(n_tokens, n_out, sm_count(), balanced) : split;
}

// The partials are written while the launch writes its outputs: they must not overlap.
void check_workspace(const GemmWorkspace& workspace, const void* out, size_t out_bytes, const char* who) {
    if (workspace.partials == nullptr) return;
    if (reinterpret_cast<uintptr_t>(workspace.partials) % 16 != 0)
        fail(std::string(who) + ": the workspace's partials must be 16-byte aligned");
    const auto* w = reinterpret_cast<const uint8_t*>(workspace.partials);
    const auto* o = static_cast<const uint8_t*>(out);
    if (w < o + out_bytes && o < w + workspace.partial_floats * sizeof(float))
        fail(std::string(who) + ": the workspace's partials overlap an output");
}

// The output segment of rows [seg_begin, seg_begin + rows) (of the whole matrix), where the
// launch's rows [row0, row0 + n_rows) meet it: its tensor map, make_map(offset, n) for its n
// rows from the segment's row `offset` on, and its first launch-relative row. Whether it did.
template <typename MakeMap>
bool add_segment(Launch& l, uint32_t row0, uint32_t n_rows, uint32_t seg_begin, uint32_t rows, MakeMap&& make_map) {
    const uint32_t lo = std::max(seg_begin, row0), hi = std::min(seg_begin + rows, row0 + n_rows);
    if (lo >= hi) return false;
    l.out.seg[l.p.n_segments] = make_map(lo - seg_begin, hi - lo);
    l.p.seg_begin[l.p.n_segments++] = lo - row0;
    return true;
}

// Rows [row0, row0 + n_rows) of w, in tiles of bn tokens, each row into its output segment.
void launch_rows(const CudaMatrix& w, uint32_t row0, uint32_t n_rows, const __half* x, uint32_t n_tokens,
                 std::span<const GemmOutput> outs, bool add_to_y, uint32_t bn, const GemmWorkspace& workspace,
                 cudaStream_t stream) {
    if (n_rows == 0) return;
    Launch l = launch_for(w, row0, n_rows, kRows, x, n_tokens, n_rows, bn);
    l.p.add_to_y = add_to_y ? 1 : 0;
    uint32_t seg_begin = 0;
    for (const GemmOutput& o : outs) {
        add_segment(l, row0, n_rows, seg_begin, o.rows, [&](uint32_t offset, uint32_t n) {
            return tensor_map_2d(o.y + offset, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, n, n_tokens, (uint64_t)o.y_stride * 4,
                                 kWarpRows, kOutTokens, CU_TENSOR_MAP_SWIZZLE_64B, "prefill GEMM (q8s), y");
        });
        seg_begin += o.rows;
    }
    launch_width<Epi::plain>(l, bn, workspace, stream);
}

// Features [f0, f0 + n_features) of gate_up's n_ff (gate rows f, up rows n_ff + f), their
// SwiGLU into act's columns f0.., in tiles of bn tokens.
void launch_glu_features(const CudaMatrix& gate_up, uint32_t f0, uint32_t n_features, const __half* x,
                         uint32_t n_tokens, __half* act, uint32_t bn, const GemmWorkspace& workspace,
                         cudaStream_t stream) {
    if (n_features == 0) return;
    const uint32_t n_ff = gate_up.n_out / 2;
    // From the launch's first gate row to its last up row, in boxes of 64 rows.
    Launch l = launch_for(gate_up, f0, n_ff + n_features, kRows / 2, x, n_tokens, n_features, bn);
    l.p.glu_up_rows = n_ff;
    l.out.seg[0] = tensor_map_2d(act + f0, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, n_features, n_tokens, (uint64_t)n_ff * 2,
                                 kGluWarpFeatures, bn, CU_TENSOR_MAP_SWIZZLE_NONE, "prefill GEMM (q8s), act");
    launch_width<Epi::glu>(l, bn, workspace, stream);
}

// Rows [row0, row0 + n_rows) of q|k|v (whole heads), in tiles of bn tokens, with the post-QKV
// work in the epilogue: each row into its output (q f32, k and v f16), tensor maps in the
// epilogue's pieces.
void launch_qkv_rope_rows(const CudaMatrix& w, uint32_t row0, uint32_t n_rows, const __half* x, uint32_t n_tokens,
                          const QkvRopeChunk& o, uint32_t bn, const GemmWorkspace& workspace, cudaStream_t stream) {
    if (n_rows == 0) return;
    Launch l = launch_for(w, row0, n_rows, kRows, x, n_tokens, n_rows, bn);
    l.p.glu_up_rows = kRows / 2;
    l.p.bias = o.bias != nullptr ? o.bias + row0 : nullptr;
    l.p.rope_cs = o.rope_table;
    const uint32_t qd = o.n_head * kRows, kd = o.n_head_kv * kRows;
    l.p.rope_end = qd + kd > row0 ? qd + kd - row0 : 0;
    struct Segment {
        void* y;
        uint32_t rows;
        bool f16;
    };
    const Segment segments[3] = {{o.q, qd, false}, {o.k, kd, true}, {o.v, kd, true}};
    uint32_t seg_begin = 0;
    for (const Segment& sg : segments) {
        const uint32_t index = l.p.n_segments;
        const bool added = add_segment(l, row0, n_rows, seg_begin, sg.rows, [&](uint32_t offset, uint32_t n) {
            return sg.f16 ? tensor_map_2d(static_cast<__half*>(sg.y) + offset, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, n,
                                          n_tokens, (uint64_t)sg.rows * 2, kGluWarpFeatures, 128,
                                          CU_TENSOR_MAP_SWIZZLE_NONE, "prefill GEMM (q8s), k / v rows")
                          : tensor_map_2d(static_cast<float*>(sg.y) + offset, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, n,
                                          n_tokens, (uint64_t)sg.rows * 4, kGluWarpFeatures, 64,
                                          CU_TENSOR_MAP_SWIZZLE_NONE, "prefill GEMM (q8s), q");
        });
        if (added && sg.f16) l.p.seg_f16 |= 1u << index;
        seg_begin += sg.rows;
    }
    launch_width<Epi::qkv_rope>(l, bn, workspace, stream);
}

}  // namespace

bool prefill_gemm_q8s_swiglu_cuda(const CudaMatrix& gate_up, const __half* x, uint32_t n_tokens, __half* act,
                                  cudaStream_t stream, Q8sGemmSplit split, const GemmWorkspace& workspace) {
    const uint32_t n_ff = gate_up.n_out / 2;
    if (!prefill_gemm_q8s_swiglu_takes(gate_up) || reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
    if (reinterpret_cast<uintptr_t>(act) % 16 != 0) fail("prefill_gemm_q8s_swiglu_cuda: act must be 16-byte aligned");
    check_workspace(workspace, act, (size_t)n_tokens * n_ff * sizeof(__half), "prefill_gemm_q8s_swiglu_cuda");
    // A tile is 64 gate rows and their 64 up rows: as much work as 128 rows of the plain kernel,
    // so the split over 2 n_ff rows halves into features.
    split = split_to_run(split, gate_up.n_out, n_tokens, true, balances(workspace), "prefill_gemm_q8s_swiglu_cuda");
    if (n_tokens == 0) return true;
    const uint32_t features_wide = split.rows_wide / 2;
    launch_glu_features(gate_up, 0, features_wide, x, n_tokens, act, 256, workspace, stream);
    launch_glu_features(gate_up, features_wide, n_ff - features_wide, x, n_tokens, act, 128, workspace, stream);
    return true;
}

bool prefill_gemm_q8s_qkv_rope_takes(const CudaMatrix& wqkv, uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim) {
    return head_dim == kRows && n_head > 0 && n_head_kv > 0 &&
           (uint64_t)wqkv.n_out == ((uint64_t)n_head + 2ull * n_head_kv) * kRows && prefill_gemm_q8s_takes(wqkv);
}

bool prefill_gemm_q8s_qkv_rope_cuda(const CudaMatrix& wqkv, const __half* x, uint32_t n_tokens, const QkvRopeChunk& out,
                                    cudaStream_t stream, Q8sGemmSplit split, const GemmWorkspace& workspace) {
    const char* who = "prefill_gemm_q8s_qkv_rope_cuda";
    if (!prefill_gemm_q8s_qkv_rope_takes(wqkv, out.n_head, out.n_head_kv, kRows) ||
        reinterpret_cast<uintptr_t>(x) % 16 != 0)
        return false;
    if (out.q == nullptr || out.k == nullptr || out.v == nullptr || out.rope_table == nullptr)
        fail(std::string(who) + ": needs q, k, v and the rope table");
    if (reinterpret_cast<uintptr_t>(out.q) % 16 != 0 || reinterpret_cast<uintptr_t>(out.k) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(out.v) % 16 != 0 || reinterpret_cast<uintptr_t>(out.rope_table) % 8 != 0)
        fail(std::string(who) + ": q, k and v must be 16-byte aligned, the rope table 8-byte");
    const size_t qd = (size_t)out.n_head * kRows, kd = (size_t)out.n_head_kv * kRows;
    check_workspace(workspace, out.q, n_tokens * qd * sizeof(float), who);
    check_workspace(workspace, out.k, n_tokens * kd * sizeof(__half), who);
    check_workspace(workspace, out.v, n_tokens * kd * sizeof(__half), who);
    // Whole heads in each launch: the wide rows are a multiple of 128 (whole_blocks).
    split = split_to_run(split, wqkv.n_out, n_tokens, true, balances(workspace), who);
    if (n_tokens == 0) return true;
    launch_qkv_rope_rows(wqkv, 0, split.rows_wide, x, n_tokens, out, 256, workspace, stream);
    launch_qkv_rope_rows(wqkv, split.rows_wide, split.rows_narrow, x, n_tokens, out, 128, workspace, stream);
    return true;
}

bool prefill_gemm_q8s_swiglu_takes(const CudaMatrix& gate_up) {
    return prefill_gemm_q8s_takes(gate_up) && gate_up.n_out % 2 == 0 && (gate_up.n_out / 2) % 64 == 0;
}

bool prefill_gemm_q8s_cuda(const CudaMatrix& w, const __half* x, uint32_t n_tokens, float* y, bool add_to_y,
                           cudaStream_t stream, Q8sGemmSplit split, const GemmWorkspace& workspace) {
    const GemmOutput out{y, w.n_out, w.n_out};
    return prefill_gemm_q8s_cuda(w, x, n_tokens, std::span<const GemmOutput>(&out, 1), add_to_y, stream, split,
                                 workspace);
}

bool prefill_gemm_q8s_cuda(const CudaMatrix& w, const __half* x, uint32_t n_tokens, std::span<const GemmOutput> outs,
                           bool add_to_y, cudaStream_t stream, Q8sGemmSplit split, const GemmWorkspace& workspace) {
    if (!prefill_gemm_q8s_takes(w) || reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
    if (outs.empty() || outs.size() > (size_t)kMaxSegments)
        fail("prefill_gemm_q8s_cuda: 1 to " + std::to_string(kMaxSegments) + " outputs, got " + std::to_string(outs.size()));
    uint64_t rows = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
        if (outs[i].rows == 0 || outs[i].y_stride < outs[i].rows || outs[i].y_stride % 4 != 0 ||
            reinterpret_cast<uintptr_t>(outs[i].y) % 16 != 0)
            fail("prefill_gemm_q8s_cuda: output " + std::to_string(i) +
                 " needs rows > 0, a row stride of at least its rows and a multiple of 4, and a 16-byte aligned y");
        if (i + 1 < outs.size() && (rows + outs[i].rows) % kRows != 0)
            fail("prefill_gemm_q8s_cuda: outputs must start at multiples of 128 rows");
        rows += outs[i].rows;
    }
    if (rows != w.n_out)
        fail("prefill_gemm_q8s_cuda: the outputs cover " + std::to_string(rows) + " rows, the matrix has " +
             std::to_string(w.n_out));
    for (const GemmOutput& o : outs)
        check_workspace(workspace, o.y, (size_t)n_tokens * o.y_stride * sizeof(float), "prefill_gemm_q8s_cuda");
    split = split_to_run(split, w.n_out, n_tokens, false, balances(workspace), "prefill_gemm_q8s_cuda");
    if (n_tokens == 0) return true;
    launch_rows(w, 0, split.rows_wide, x, n_tokens, outs, add_to_y, 256, workspace, stream);
    launch_rows(w, split.rows_wide, split.rows_narrow, x, n_tokens, outs, add_to_y, 128, workspace, stream);
    return true;
}

}  // namespace spillway
