#pragma once
// Flash-decoding attention of one query token over a contiguous range of KV cells, with the
// contract of engine/cpu/attention.h: the result is a partial (output normalised within the
// range, plus the natural-log log-sum-exp of its scaled scores), and partials merge exactly.
// Internally the cells are split across thread blocks (GQA-aware: a block reads each of its
// KV head's cells once for all the query heads that share it) into workspace partials that
// a second kernel merges; the spill path merges a resident partial with a streamed tail the
// same way, with attention_merge_cuda.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/cpu/attention.h"
#include "engine/cuda/act_quant.cuh"
#include "model/model_spec.h"

namespace spillway {

// head_dim_k == head_dim_v, one of 64 or 128; n_head / n_head_kv <= 16.
bool attention_supports(const AttentionShape& shape);

// Cell-range splits used for n_cells on a GPU with sm_count multiprocessors: a pure function
// so the planner and the tests can see the choice.
uint32_t attention_split_count(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count);

// Device scratch needed by attention_partial_cuda for n_cells cells (0 when none is needed).
size_t attention_workspace_bytes(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count);

// All pointers are device pointers. q: [n_head][head_dim_k] f32; k_cells / v_cells: n_cells
// rows laid out as in kv/kv_layout.h (16-byte aligned base); out: [n_head][head_dim_v];
// lse: [n_head]. n_cells == 0 gives out = 0, lse = -inf. sm_count: the device's
// multiprocessor count (cudaDevAttrMultiProcessorCount), the same value given to
// attention_workspace_bytes.
// out_q16 (optional): out also quantized for the Q8_0 output-projection matvec
// (act_quant.cuh; n_head * head_dim_v values), written by the split merge itself when the
// range has several splits, by the attention kernel itself when it has one (one launch fewer
// per layer either way), and by quantize_act_q16_cuda when there are no cells.
// settled_cells: cells [0, settled_cells) were complete before the kernel that produces q
// (and the step's new cell) was launched, e.g. every cell before the decode position; the
// split kernels may start copying them before that producer finishes (programmatic launch,
// pdl_launch.cuh). 0 (the default) when the caller cannot say.
// The decode step's post-QKV work (qkv_post.cuh) done inside the attention launch instead of
// a launch of its own: q is then the QKV GEMV's raw output; the kernel adds the q bias and
// applies RoPE to its query heads, and the block whose split holds the last cell (the step's
// new cell, n_cells - 1) computes that cell's K and V (bias, RoPE on K) from new_k / new_v,
// stores them into k_cache / v_cache (the caches being read, writable) in the tiers' formats
// and only then copies the cell. The same arithmetic as qkv_post_cuda: the cache bytes and
// the result are bit-identical to qkv_post_cuda followed by this call without it. Only the
// tensor_core kernel takes it; attention_takes_post_qkv says where the default kernel is that
// one and the range has several splits (where it was measured faster than its own launch);
// n_cells >= 1, settled_cells < n_cells (the new cell is written here: it cannot be settled).
struct AttentionPostQkv {
    const float2* rope_table = nullptr;  // the token's (cos, sin) per rotated pair (rope_table_cuda)
    uint32_t rope_dims = 0;              // rotated dims: even, <= head_dim
    bool rope_neox = true;
    const float* bias = nullptr;         // q|k|v biases back to back, or nullptr
    const float* new_k = nullptr;        // [n_head_kv][head_dim] raw K, V of the new cell
    const float* new_v = nullptr;
    uint8_t* k_cache = nullptr;
    uint8_t* v_cache = nullptr;
};
bool attention_takes_post_qkv(const AttentionShape& shape, KvType k_type, KvType v_type, uint32_t n_cells,
                              uint32_t sm_count);
// merge_programmatic = false: the split merge is an ordinary launch whatever SPILLWAY_PDL_SMALL
// says (the fused decode, whose wo GEMV lets gate|up launch at its entry: with both early,
// q8_0 KV at 8k ran 180 instead of 191.5 tok/s; docs/perf-notes.md, session 28).
void attention_partial_cuda(const AttentionShape& shape, const float* q, KvType k_type,
                            const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                            uint32_t n_cells, float* out, float* lse, void* workspace,
                            size_t workspace_bytes, uint32_t sm_count, cudaStream_t stream, ActQ16 out_q16 = {},
                            uint32_t settled_cells = 0, const AttentionPostQkv* post = nullptr,
                            bool merge_programmatic = true);

// Which split kernel attention_partial_cuda runs. tensor_core: the f16 wmma kernel that
// dequantizes K/V to f16 tiles (every type pair, head dim 64/128, <= 16 query heads per KV
// head). int_dot: quantized K only (q8_0/q4_0), head dim 128, <= 8 query heads per KV head;
// QK as integer dot products of the raw K blocks with q quantized to int16 per 32-block
// (dp2a), P V on CUDA cores with the V block scale folded into the softmax weight, each warp
// streaming its own cells (docs/perf-notes.md, "Integer-dot decode attention"). mma: every
// K/V type pair, head dim 128, <= 8 query heads per KV head; QK and PV both on mma.sync with
// the K/V operands built in registers from the raw cache bytes (engine/cuda/attention_mma.cu).
enum class AttentionKernel { tensor_core, int_dot, mma };

bool attention_kernel_supports(AttentionKernel kernel, const AttentionShape& shape, KvType k_type, KvType v_type);

// Ranges of at least this many cells go to the mma kernel where it applies; shorter ones
// to int_dot (quantized K) or tensor_core (measured at 8k: mma 26-30 us, int_dot 22.5,
// tensor_core 19.5-21.7; at 32k mma is faster for quantized KV and on par for f16, at 64k
// the fastest for every pair: docs/perf-notes.md). Quantized K switches earlier since the
// mma kernel's Q load was fixed (session 20, engine tok/s int_dot -> mma: q8_0 / q4_0 at
// 12288 cells 167.8 -> 171.7 / 171.9 -> 175.9, at 8192 176.9 -> 175.9 / 178.4 -> 178.8; f16
// K at 8192 184.1 -> 177.7 stays on tensor_core below 16384). Since the mma kernel's
// quantized V puts the block scale into P (session 21) it wins at shorter ranges still:
// quantized K with q4_0 V from 2048 cells (q4_0 / q4_0 at 2048 / 4096 / 6144: 191.4 / 188.2 /
// 183.3 -> 195.0 / 192.1 / 189.9 tok/s; q8_0 / q4_0 186.1 / 181.5 / 180.9 -> 193.7 / 188.6 /
// 186.0), with q8_0 V from 6144 (q8_0 / q8_0 at 4096 / 6144 / 8192 / 10240: 187.0 / 180.2 /
// 177.2 / 171.3 -> 186.4 / 183.5 / 180.8 / 178.4), with f16 V (unchanged path) from 12288.
constexpr uint32_t kAttentionMmaMinCells = 16384;
constexpr uint32_t kAttentionMmaMinCellsQuantizedKF16V = 12288;
constexpr uint32_t kAttentionMmaMinCellsQ8V = 6144;
constexpr uint32_t kAttentionMmaMinCellsQ4V = 2048;
// Equal quantized K and V (q8_0 / q8_0, q4_0 / q4_0) from 1024 cells: session 51 (H100, tg64,
// the mma kernel from 129 cells against the thresholds above, two interleaved rounds): q8_0 /
// q8_0 +1.15% at 1024 cells and +0.58% at 4096, q4_0 / q4_0 +1.6% at 1024, equal from 8192 /
// 4096. The mixed pairs were not measured and keep the thresholds above; f16 K lost 2-4% at
// 1024-12288 and keeps its own.
constexpr uint32_t kAttentionMmaMinCellsEqualQuantized = 1024;
// f16 K with quantized V from 8192 (tok/s at 8192 / 12288, tensor_core -> mma: f16 / q4_0 179.1 /
// 170.7 -> 180.6 / 177.0; f16 / q8_0 179.5 / 170.0 -> 178.1 / 173.1, one threshold for both).
constexpr uint32_t kAttentionMmaMinCellsF16KQuantizedV = 8192;

// The kernel attention_partial_cuda uses for this shape, KV types and range length (a pure
// function; the default n_cells asks for the choice at long context).
AttentionKernel attention_default_kernel(const AttentionShape& shape, KvType k_type, KvType v_type,
                                         uint32_t n_cells = UINT32_MAX);

// Splits for an explicit kernel (the one above without types is the tensor_core kernel's).
uint32_t attention_split_count(AttentionKernel kernel, const AttentionShape& shape, KvType k_type, KvType v_type,
                               uint32_t n_cells, uint32_t sm_count);

// attention_partial_cuda with an explicit kernel (tests, benchmarks); the workspace from
// attention_workspace_bytes covers every kernel.
void attention_partial_cuda_with(AttentionKernel kernel, const AttentionShape& shape, const float* q,
                                 KvType k_type, const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                                 uint32_t n_cells, float* out, float* lse, void* workspace, size_t workspace_bytes,
                                 uint32_t sm_count, cudaStream_t stream, ActQ16 out_q16 = {},
                                 uint32_t settled_cells = 0, const AttentionPostQkv* post = nullptr,
                                 bool merge_programmatic = true);

// Lab (benchmarks only, not thread-safe): while set, the mma kernel's warps and the split
// merge's blocks write globaltimer stamps here. Warp w of block (kv_head, split) at
// ((split * n_head_kv + kv_head) * 4 + w) * kAttentionTimelineSlots (the slots are listed in
// attention_mma.cuh); after all warps, per merge block (one per query head) [0] entry, [1]
// after the dependency wait, [2] done, [3] partials and lse loaded (max reduced), [4] the
// weighted sums in shared memory. nullptr (the default) records nothing.
constexpr uint32_t kAttentionTimelineSlots = 10;
constexpr uint32_t kAttentionTimelineWarpsPerBlock = 4;
void attention_lab_timeline(uint64_t* stamps);

// a := merge(a, b), in place, as attention_merge_cpu.
void attention_merge_cuda(uint32_t n_head, uint32_t head_dim_v, float* out_a, float* lse_a,
                          const float* out_b, const float* lse_b, cudaStream_t stream);

}  // namespace spillway
