// The persistent per-layer decode kernel (decode_layer.cuh).
//
// Floors, written before the kernel (Qwen2.5-14B layer, HBM read ~4.5 TB/s measured):
// bytes wo 27.9 MB + gate|up 150.4 + down 75.2 + qkv 39.0 = 292.5 MB -> 65 us; flops ~0.6 G
// integer MACs (dp2a) -> far below any compute rate. The separate launches take ~88 us of
// GEMVs + ~12 us of small kernels per layer (perf-notes, session 11).
//
// Block layout: 16 consumer warps in 4 groups of 4 + 1 producer warp (one thread issues the
// bulk copies). Ring: 4 x 3 stages of 16 KB (one ring per group), each holding whole rows of
// one phase (up to 8 rows): 192 KB per SM, 25 MB on 132 SMs, ~5.5 us of HBM time: enough to
// keep HBM busy through a grid barrier plus the next phase's x prologue (~2-3 us).
// Stage k goes to group k % 4, so four stages are consumed at once and a group's barrier
// (128 threads) is the only synchronization per stage. Inside a group, warp w takes the
// 256-column units w, w + 4, ... of every row of the stage (units: 4 block pairs of 68 bytes,
// 8 lanes per pair, the q16x matvec's inner step), so one x load serves all the stage's rows.
// Each warp's per-row sums land in shared memory; after the group barrier one lane per row
// adds the 4 partials in warp order (deterministic) and applies the phase's output.
// (First version, measured: all 16 warps on one 32 KB stage with a block barrier per stage
// and a unit index divided per step: 2x slower than the separate kernels, issue-bound.)
#include "engine/cuda/decode_layer.cuh"

#include <cuda/atomic>
#include <cuda_fp16.h>

#include <string>

#include "common/error.h"
#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/cuda_check.h"

namespace spillway {
namespace {

constexpr int kConsumerWarps = 16;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the producer warp
constexpr int kGroups = 4;
constexpr int kGroupWarps = kConsumerWarps / kGroups;
constexpr int kGroupStages = 3;  // ring slots per group
constexpr int kStages = kGroups * kGroupStages;
constexpr uint32_t kStageBytes = 16384;
constexpr uint32_t kMaxStageRows = 8;
constexpr uint32_t kMaxCols = 14336;
constexpr uint32_t kUnitCols = 256;
constexpr uint32_t kMaxValuesPerThread = kMaxCols / kConsumers;  // prologue registers

// Shared memory: ring | x q (int16) | x d (f32) | partials [group][2][rows][warps] | reduce | mbarriers.
constexpr size_t kRingOffset = 0;
constexpr size_t kXqOffset = kRingOffset + (size_t)kStages * kStageBytes;
constexpr size_t kXdOffset = kXqOffset + (size_t)kMaxCols * 2;
constexpr size_t kPartOffset = kXdOffset + (size_t)kMaxCols / 32 * 4;
constexpr size_t kRedOffset = kPartOffset + (size_t)kGroups * 2 * kMaxStageRows * kGroupWarps * 4;
constexpr size_t kBarOffset = kRedOffset + 32 * 4;
constexpr size_t kSmemBytes = kBarOffset + 2 * (size_t)kStages * 8;

__host__ __device__ constexpr uint32_t q8_row_bytes(uint32_t cols) { return cols / 32 * 34; }
__host__ __device__ constexpr uint32_t stage_rows(uint32_t cols) {
    return kStageBytes / q8_row_bytes(cols) < kMaxStageRows ? kStageBytes / q8_row_bytes(cols) : kMaxStageRows;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}
// bytes % 16 == 0, both addresses 16-byte aligned; completion counted on bar's transaction count.
__device__ __forceinline__ void bulk_copy_to_smem(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}
// The 512 consumer threads only (the producer warp never joins): named barrier 1; a group's
// 128 threads: barriers 2..5.
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory"); }
__device__ __forceinline__ void group_sync(uint32_t group) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(2 + group), "n"(kGroupWarps * 32) : "memory");
}
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Rows [r0, r1) of `rows` owned by block b of n.
__device__ __forceinline__ void block_rows(uint32_t rows, uint32_t b, uint32_t n, uint32_t& r0, uint32_t& r1) {
    r0 = (uint32_t)((uint64_t)b * rows / n);
    r1 = (uint32_t)((uint64_t)(b + 1) * rows / n);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// All blocks of the grid (all resident: one per SM). words[0] counts arrivals, words[1] is
// the generation; the last arrival resets the count and bumps the generation, so the words
// are ready for the next barrier and the next launch. The fences publish every consumer's
// global writes before the arrival (the pattern of cooperative groups' grid sync).
__device__ void grid_barrier(uint32_t* words, uint32_t n_blocks) {
    consumer_sync();
    if (threadIdx.x == 0) {
        cuda::atomic_ref<uint32_t, cuda::thread_scope_device> count(words[0]), gen(words[1]);
        const uint32_t g = gen.load(cuda::memory_order_relaxed);  // can only move after our arrival
        __threadfence();
        if (count.fetch_add(1, cuda::memory_order_acq_rel) == n_blocks - 1) {
            count.store(0, cuda::memory_order_relaxed);
            gen.store(g + 1, cuda::memory_order_release);
        } else {
            while (gen.load(cuda::memory_order_acquire) == g) {
            }
        }
        __threadfence();
    }
    consumer_sync();
}

// x of phase p into shared memory (q int16, d f32 per 32 values), by the 512 consumers.
// Data written earlier in this launch by other blocks is read through L2 (__ldcg): L1 is not
// coherent across SMs.
__device__ void load_x(const DecodeLayerArgs& a, const DecodeGemvPhase& ph, int16_t* xq, float* xd, float* red) {
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const uint32_t cols = ph.cols, n_blocks = cols / 32;
    if (ph.x == DecodeX::act_q16) {
        const uint32_t q_vecs = cols * 2 / 16, d_vecs = n_blocks * 4 / 16;  // cols % 256 == 0
        for (uint32_t i = tid; i < q_vecs; i += kConsumers)
            reinterpret_cast<uint4*>(xq)[i] = __ldcg(reinterpret_cast<const uint4*>(a.x_q16.q) + i);
        for (uint32_t i = tid; i < d_vecs; i += kConsumers)
            reinterpret_cast<uint4*>(xd)[i] = __ldcg(reinterpret_cast<const uint4*>(a.x_q16.d) + i);
        return;
    }
    // Warp w quantizes the 32-value blocks w, w + 16, ...; lane l holds value l of each.
    float v[kMaxValuesPerThread];
    if (ph.x == DecodeX::swiglu) {
#pragma unroll
        for (uint32_t j = 0; j < kMaxValuesPerThread; ++j) {
            const uint32_t b = j * kConsumerWarps + warp;
            if (b < n_blocks) {
                const uint32_t i = b * 32 + lane;
                v[j] = silu_times(__ldcg(ph.gate_up + i), __ldcg(ph.gate_up + cols + i));
                quantize_act_q16_warp(v[j], lane, xq + b * 32, xd + b);
            }
        }
        return;
    }
    // stream_rmsnorm: out = (x * inv_rms) * w, inv_rms = 1 / sqrt(mean(x^2) + eps), as rmsnorm.cu.
    float sum = 0.0f;
#pragma unroll
    for (uint32_t j = 0; j < kMaxValuesPerThread; ++j) {
        const uint32_t b = j * kConsumerWarps + warp;
        if (b < n_blocks) {
            v[j] = __ldcg(a.stream + b * 32 + lane);
            sum = fmaf(v[j], v[j], sum);
        }
    }
    sum = warp_sum(sum);
    if (lane == 0) red[warp] = sum;
    consumer_sync();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) total += red[w];  // the same order in every thread
    const float inv_rms = rsqrtf(total / (float)cols + a.eps);
#pragma unroll
    for (uint32_t j = 0; j < kMaxValuesPerThread; ++j) {
        const uint32_t b = j * kConsumerWarps + warp;
        if (b < n_blocks) {
            const uint32_t i = b * 32 + lane;
            quantize_act_q16_warp(v[j] * inv_rms * __ldg(ph.norm_weight + i), lane, xq + b * 32, xd + b);
        }
    }
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// One warp's share of a stage of kRows rows: the units gw, gw + 4, ... of every row, one x
// load per unit for all rows; per-row warp sums into part[row][gw]. Lane roles inside a
// 256-column unit as in the q16x matvec: 8 lanes per 68-byte block pair, lanes 0-3 on block
// A's 32 weights, 4-7 on block B's (realigned by a byte permute: every load is a whole word).
template <int kRows>
__device__ __forceinline__ void stage_partials(const uint32_t* stage, uint32_t row_words, uint32_t upr, uint32_t gw,
                                               uint32_t lane, const int16_t* xq, const float* xd, float* part) {
    const uint32_t sub = lane / 8, t = lane % 8;
    const bool in_a = t < 4;
    const uint32_t col_in_pair = (in_a ? 0 : 32) + (t % 4) * 8;
    const uint32_t realign = in_a ? 0x5432u : 0x7654u;
    const uint32_t scale_shift = in_a ? 0 : 16;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
#pragma unroll 1
    for (uint32_t cu = gw; cu < upr; cu += kGroupWarps) {
        const uint32_t pair = cu * 4 + sub;
        const uint32_t col = pair * 64 + col_in_pair;
        const uint4 xv = *reinterpret_cast<const uint4*>(xq + col);
        const float xs = xd[col / 32];
        const uint32_t* pw = stage + pair * 17;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const uint32_t* pr = pw + r * row_words;
            const uint32_t w0 = pr[2 * t], w1 = pr[2 * t + 1], w2 = pr[2 * t + 2];
            const uint32_t dw = pr[in_a ? 0 : 8];
            const int q0 = (int)__byte_perm(w0, w1, realign);
            const int q1 = (int)__byte_perm(w1, w2, realign);
            const float d = __half2float(__ushort_as_half((unsigned short)(dw >> scale_shift)));
            int isum = __dp2a_lo((int)xv.x, q0, 0);
            isum = __dp2a_hi((int)xv.y, q0, isum);
            isum = __dp2a_lo((int)xv.z, q1, isum);
            isum = __dp2a_hi((int)xv.w, q1, isum);
            acc[r] = fmaf(d * xs, (float)isum, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) part[r * kGroupWarps + gw] = v;
    }
}

// The producer's wait for a free ring slot: it sleeps between polls so that its spinning
// does not take issue slots from the consumers (measured: 8% of all instructions without).
__device__ __forceinline__ void mbar_wait_sleeping(uint64_t* bar, uint32_t parity) {
    uint32_t done = 0;
    while (true) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
        if (done) return;
        __nanosleep(64);
    }
}
#endif

__global__ void __launch_bounds__(kThreads, 1) decode_layer_kernel(const DecodeLayerArgs a, uint32_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t* ring = smem + kRingOffset;
    int16_t* xq = reinterpret_cast<int16_t*>(smem + kXqOffset);
    float* xd = reinterpret_cast<float*>(smem + kXdOffset);
    float* part_base = reinterpret_cast<float*>(smem + kPartOffset);
    float* red = reinterpret_cast<float*>(smem + kRedOffset);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOffset);
    uint64_t* empty = full + kStages;
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&full[s], 1);   // the producer's arrive (with the transaction bytes)
            mbar_init(&empty[s], 1);  // one consumer's arrive after the consumers' barrier
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == kConsumerWarps) {
        // Producer: every phase's rows of this block, stage after stage, as fast as the ring
        // frees up. Weights never depend on the previous kernel, so no dependency wait here.
        // One lane per group, each filling only its group's ring, so that a group slow on one
        // stage never holds back the others' copies (measured with one in-order ring shared
        // by the four groups: the producer waited on a slow group's slot while the other
        // groups starved).
        if (lane < (uint32_t)kGroups) {
            const uint32_t g = lane;
            uint32_t j = 0;  // this group's stage count, across phases
            for (uint32_t p = 0; p < a.n_phases; ++p) {
                const DecodeGemvPhase& ph = a.phases[p];
                const uint32_t row_bytes = q8_row_bytes(ph.cols), n = stage_rows(ph.cols);
                uint32_t r0, r1;
                block_rows(ph.rows, blockIdx.x, gridDim.x, r0, r1);
                const uint8_t* w = static_cast<const uint8_t*>(ph.w);
                for (uint32_t r = r0 + g * n; r < r1; r += kGroups * n, ++j) {
                    const uint32_t slot = g * kGroupStages + j % kGroupStages;
                    if (j >= (uint32_t)kGroupStages) mbar_wait_sleeping(&empty[slot], ((j / kGroupStages) + 1) & 1);
                    const uint32_t bytes = min(n, r1 - r) * row_bytes;
                    mbar_arrive_expect_tx(&full[slot], bytes);
                    bulk_copy_to_smem(ring + (size_t)slot * kStageBytes, w + (size_t)r * row_bytes, bytes, &full[slot]);
                }
            }
        }
        return;
    }

    const uint32_t group = warp / kGroupWarps, gw = warp % kGroupWarps;
    uint32_t j = 0;  // this group's stage count, across phases (the producer lane's order)
    for (uint32_t p = 0; p < a.n_phases; ++p) {
        const DecodeGemvPhase& ph = a.phases[p];
        if (p == 0) {
            cudaGridDependencySynchronize();  // x_q16 and the stream come from earlier kernels
        } else {
            grid_barrier(barrier, gridDim.x);  // the previous phase's outputs, from every block
        }
        load_x(a, ph, xq, xd, red);
        consumer_sync();
        const uint32_t row_bytes = q8_row_bytes(ph.cols), n = stage_rows(ph.cols), upr = ph.cols / kUnitCols;
        const uint32_t row_words = row_bytes / 4;
        uint32_t r0, r1;
        block_rows(ph.rows, blockIdx.x, gridDim.x, r0, r1);
        const uint32_t n_stages = (r1 - r0 + n - 1) / n;
        for (uint32_t st = group; st < n_stages; st += kGroups, ++j) {
            const uint32_t slot = group * kGroupStages + j % kGroupStages, r = r0 + st * n, nr = min(n, r1 - r);
            mbar_wait(&full[slot], (j / kGroupStages) & 1);
            const uint32_t* stage = reinterpret_cast<const uint32_t*>(ring + (size_t)slot * kStageBytes);
            // Partials double-buffered per group: the reducing lanes of stage st read one
            // buffer while the group's other warps may already fill the other (stage st + 4).
            float* part = part_base + (size_t)((group * 2 + (j & 1)) * kMaxStageRows) * kGroupWarps;
            switch (nr) {  // the row count as a constant: no per-row guards in the inner loop
                case 1: stage_partials<1>(stage, row_words, upr, gw, lane, xq, xd, part); break;
                case 2: stage_partials<2>(stage, row_words, upr, gw, lane, xq, xd, part); break;
                case 3: stage_partials<3>(stage, row_words, upr, gw, lane, xq, xd, part); break;
                case 4: stage_partials<4>(stage, row_words, upr, gw, lane, xq, xd, part); break;
                case 5: stage_partials<5>(stage, row_words, upr, gw, lane, xq, xd, part); break;
                case 6: stage_partials<6>(stage, row_words, upr, gw, lane, xq, xd, part); break;
                case 7: stage_partials<7>(stage, row_words, upr, gw, lane, xq, xd, part); break;
                default: stage_partials<8>(stage, row_words, upr, gw, lane, xq, xd, part); break;
            }
            group_sync(group);  // the group is done with the stage and has written its partials
            if (gw == 0) {
                if (lane == 0) mbar_arrive(&empty[slot]);
                if (lane < nr) {
                    float total = 0.0f;
#pragma unroll
                    for (int w = 0; w < kGroupWarps; ++w) total += part[lane * kGroupWarps + w];
                    const uint32_t row = r + lane;
                    if (ph.y == DecodeY::add_to_stream) a.stream[row] = __ldcg(a.stream + row) + total;
                    else ph.out[row] = total;
                }
            }
        }
    }
    // The last stage's outputs are written by the time the grid completes; nothing else to do.
#endif
}

int device_sm_count() {
    int device = 0, n = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
}

}  // namespace

bool decode_layer_supported() {
    static const bool supported = [] {
        int device = 0, major = 0, smem_optin = 0;
        SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        if (major < 9 || (size_t)smem_optin < kSmemBytes) return false;
        SPILLWAY_CUDA_CHECK(
            cudaFuncSetAttribute(decode_layer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
        int per_sm = 0;
        SPILLWAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_layer_kernel, kThreads, kSmemBytes));
        return per_sm >= 1;
    }();
    return supported;
}

bool decode_layer_phase_fits(uint32_t rows, uint32_t cols) {
    return rows >= 1 && cols >= kUnitCols && cols % kUnitCols == 0 && cols <= kMaxCols;
}

void decode_layer_cuda(const DecodeLayerArgs& args, uint32_t* barrier, cudaStream_t stream) {
    const std::string where = "decode_layer_cuda: ";
    if (!decode_layer_supported()) fail(where + "needs an sm_90+ GPU with " + std::to_string(kSmemBytes) + " bytes of shared memory per block");
    if (args.n_phases < 1 || args.n_phases > kDecodeMaxPhases) fail(where + "1 to 4 phases");
    if (barrier == nullptr) fail(where + "no barrier words");
    for (uint32_t p = 0; p < args.n_phases; ++p) {
        const DecodeGemvPhase& ph = args.phases[p];
        const std::string at = where + "phase " + std::to_string(p) + ": ";
        if (ph.w == nullptr || reinterpret_cast<uintptr_t>(ph.w) % 16 != 0) fail(at + "weights missing or not 16-byte aligned");
        if (!decode_layer_phase_fits(ph.rows, ph.cols))
            fail(at + "shape " + std::to_string(ph.rows) + "x" + std::to_string(ph.cols) +
                 " unsupported (cols a multiple of 256, at most 14336)");
        switch (ph.x) {
            case DecodeX::act_q16:
                if (!args.x_q16 || args.x_q16.d == nullptr || reinterpret_cast<uintptr_t>(args.x_q16.q) % 16 != 0 ||
                    reinterpret_cast<uintptr_t>(args.x_q16.d) % 16 != 0)
                    fail(at + "x_q16 missing or not 16-byte aligned");
                break;
            case DecodeX::stream_rmsnorm:
                if (args.stream == nullptr || ph.norm_weight == nullptr) fail(at + "RMSNorm needs the stream and a norm weight");
                if (ph.y == DecodeY::add_to_stream) fail(at + "cannot read the stream (RMSNorm) and add to it in one phase");
                break;
            case DecodeX::swiglu:
                if (ph.gate_up == nullptr) fail(at + "SwiGLU needs gate_up");
                if (ph.y == DecodeY::store && ph.out != nullptr && ph.out < ph.gate_up + 2 * (size_t)ph.cols &&
                    ph.gate_up < ph.out + ph.rows)
                    fail(at + "out overlaps the phase's own gate_up");
                break;
            default: fail(at + "unknown x source");
        }
        if (ph.y == DecodeY::store && ph.out == nullptr) fail(at + "no output");
        if (ph.y == DecodeY::add_to_stream && args.stream == nullptr) fail(at + "no stream to add to");
    }
    static const int sms = device_sm_count();
    cudaLaunchConfig_t config{};
    config.gridDim = dim3((unsigned)sms);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmemBytes;
    config.stream = stream;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    SPILLWAY_CUDA_CHECK(cudaLaunchKernelEx(&config, decode_layer_kernel, args, barrier));
}

}  // namespace spillway
