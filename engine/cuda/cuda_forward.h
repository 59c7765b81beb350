#pragma once
// The Llama/Qwen2 forward on the GPU, op for op the structure of engine/cpu/forward.cpp
// (embeddings -> n_layer x (RMSNorm, QKV (+bias), RoPE, KV write, attention, output proj,
// residual, RMSNorm, SwiGLU FFN, residual) -> final norm -> head), so the two can be
// diffed tensor by tensor.
//
// Decode (one token): matvec kernels, flash-decoding attention, greedy argmax on the GPU;
// the step is one CUDA graph. Prefill (a chunk of tokens): the matrices on tensor cores
// through cuBLAS (Q8_0/BF16 weight tiles dequantized to f16 into a bounded scratch), a
// causal attention kernel over the cache (CUDA cores, first version).
//
// Why the graph is re-captured each step: the KV length changes every token, and the
// kernel engineer's attention launcher takes it (and derives its split grid from it) on
// the host. A step is therefore captured by stream capture and patched into an instantiated
// graph with cudaGraphExecUpdate (node parameters only, no re-instantiation). The capture
// of step t+1 is done on the host while the GPU runs step t, so its cost is hidden; two
// executable graphs alternate so that one is never updated while it may still run.
// All state below is allocated once: a step allocates nothing.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cuda/argmax.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_model.h"
#include "engine/cuda/cuda_prefill.cuh"
#include "engine/cuda/kv_spill.h"
#include "model/model_spec.h"

namespace spillway {

// The GPU KV cache: per layer K and V cell-major in kv/kv_layout.h's format, one arena.
// Cells [0, n_resident) live in VRAM; when n_resident < n_ctx, cells [n_resident, n_ctx) live
// in the spill's pinned host tail and are streamed each forward (engine/cuda/kv_spill.h).
struct CudaKvCache {
    uint32_t n_ctx = 0;
    uint32_t n_resident = 0;   // == n_ctx: no spill (no staging, no copy stream, no extra launch)
    KvType k_type = KvType::f16;
    KvType v_type = KvType::f16;
    uint64_t k_row_bytes = 0;  // one cell of one layer
    uint64_t v_row_bytes = 0;
    std::vector<uint8_t*> k;   // per layer: n_resident * k_row_bytes
    std::vector<uint8_t*> v;
    DeviceBuffer<uint8_t> arena;
    std::unique_ptr<CudaKvSpill> spill;  // null when nothing spills
};

// resident_cells >= n_ctx keeps the whole cache in VRAM; fewer spills the rest to pinned
// host memory (at least 1 cell stays resident). spill_chunk_cells: cells per staging buffer
// (0: from kSpillChunkBytes).
CudaKvCache make_cuda_kv_cache(const CudaModel& model, uint32_t n_ctx, KvType k_type, KvType v_type,
                               uint32_t resident_cells = UINT32_MAX, uint32_t spill_chunk_cells = 0);
// VRAM bytes of the staging buffers (0 without a spill) and pinned host bytes of the tail.
uint64_t cuda_kv_staging_bytes(const CudaKvCache& cache);
uint64_t cuda_kv_spilled_bytes(const CudaKvCache& cache);
// Random valid cells (finite f16 values, sane block scales) in every layer, the host tail
// too, for benchmarks that need a cache filled to some depth without running the prefill.
void fill_cuda_kv_cache_random(CudaKvCache& cache, uint64_t seed, cudaStream_t stream);

struct CudaForwardState {
    uint32_t max_tokens = 0;
    bool all_logits = false;
    uint32_t sm_count = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;
    DeviceBuffer<float> x, xn, proj;        // [max_tokens][n_embd]
    DeviceBuffer<float> qkv;                // q [T][q_dim], then k [T][k_dim], then v [T][v_dim]
    DeviceBuffer<float> attn, attn_lse;     // [T][n_head*dv], [n_head]
    DeviceBuffer<float> gate_up;            // gate [T][n_ff], then up [T][n_ff]
    DeviceBuffer<float> logits;             // [all_logits ? T : 1][n_vocab]
    DeviceBuffer<uint8_t> attn_workspace;   // decode attention split partials
    DeviceBuffer<__half> act_f16;           // prefill: activations as f16 for cuBLAS
    DeviceBuffer<__half> w_f16;             // prefill: a dequantized weight tile
    DeviceBuffer<__half> w_f16_next;        // prefill: the second tile (dequantized on the side stream)
    PrefillGemmScratch prefill_gemm;        // prefill GEMMs: the buffers above, side stream, events
    DeviceBuffer<uint32_t> gemm_flags;      // prefill: the codes GEMM's stream-K flags (zero between launches)
    DeviceBuffer<float> gemm_partials;      // prefill: its partials, where gate_up's up half is too small
    DeviceBuffer<int32_t> tokens, positions;  // [max_tokens]
    DeviceBuffer<float2> rope_cs;           // [max_tokens][n_rot/2] cos, sin: once per forward (rope.cuh);
                                            // empty: computed per head and layer
    bool fused_prefill = true;              // chunk producers write the GEMMs' f16 inputs (cuda_forward.cu)
    // One token: the split-layout GEMVs form their x (RMSNorm) and add into the residual stream
    // themselves, without those launches between them (cuda_forward.cu, decode_fusion_fits);
    // with fused_swiglu the down GEMV forms SwiGLU of gate and up too. Same bits either way.
    // Lab, off by default (measured slower, docs/perf-notes.md session 28; tests set it per
    // state): SPILLWAY_DECODE_FUSION=0|norms|all.
    bool decode_fusion = false;
    bool fused_swiglu = false;
    DeviceBuffer<int32_t> next_token;       // greedy argmax output (input of the next step)
    ArgmaxScratch argmax;                   // argmax_cuda's per-block candidates and arrival count
    // Decode: the input of a Q8_0 matvec quantized to int16 blocks by its producer (act_quant.cuh):
    // [widest matvec input] values and one scale per 32.
    DeviceBuffer<int16_t> act_q16;
    DeviceBuffer<float> act_q16_scale;
    // Decode: gate|up with SwiGLU in its epilogue (matvec_q8s_swiglu_cuda) writes down's x here
    // ([n_ff] values, one scale per 32; act_q16 is its own x) and counts its blocks' arrivals
    // ([n_ff / 32], zeroed here, left zero by every launch). Empty when the model's FFN does
    // not take it or SPILLWAY_GLU_EPILOGUE=0.
    DeviceBuffer<int16_t> glu_q16;
    DeviceBuffer<float> glu_q16_scale;
    DeviceBuffer<uint32_t> glu_arrivals;
    // Decode with the RMSNorms split across the GEMVs around them (matvec_q8s_norm_out_cuda,
    // NormedX): wo and down write the next GEMV's x here ([n_embd], stream times the norm's
    // weight, quantized) with their hand-over counts ([n_embd / 32], left zero) and per-block
    // sums of squares ([0]: the FFN's norm, [1]: the next attention's or the head's). Empty
    // when the model does not take it (cuda_forward.cu, norm_chain_takes) or SPILLWAY_NORM_CHAIN=0.
    DeviceBuffer<int16_t> norm_q16;
    DeviceBuffer<float> norm_q16_scale;
    DeviceBuffer<uint32_t> norm_arrivals;
    // SPILLWAY_QKV_EPILOGUE=1 (lab) with a quantized K or V: q|k|v's hand-over of the cache
    // blocks cut between its grid blocks ([2 kd] floats, [kd / 32] counts, left zero).
    DeviceBuffer<float> qkv_kv_stage;
    DeviceBuffer<uint32_t> qkv_kv_arrivals;
    DeviceBuffer<float> norm_partials[2];
    bool norm_chain = true;  // with the buffers above: decode takes the chain (tests turn it off)
    // Decode through the persistent layer kernel (decode_layer.cuh): its scratch (zeroed here;
    // the kernel leaves it zeroed). Empty when the model or the GPU does not take that path
    // (cuda_forward.cu, uses_decode_layer) or SPILLWAY_DECODE_LAYER=0.
    DeviceBuffer<uint8_t> decode_scratch;
    // Spill scratch, allocated on the first forward over a spilled cache: the accumulated lse
    // [T][n_head], the tail's accumulated partial and one later chunk's partial
    // ([T][n_head*dv] + lse [T][n_head] each).
    DeviceBuffer<float> spill_lse, spill_tail_out, spill_tail_lse, spill_chunk_out, spill_chunk_lse;
    DeviceBuffer<uint8_t> spill_workspace;  // the tail branch's attention split workspace
    // Prefill over a quantized cache: f16 pieces of the layer's K / V and a piece's partial
    // (cuda_prefill.cuh, PrefillKvF16Scratch), allocated on the first prefill forward over such
    // a cache (SPILLWAY_PREFILL_KV_F16=0, lab: none; the kernels read the quantized cells).
    DeviceBuffer<__half> prefill_k_f16, prefill_v_f16;
    DeviceBuffer<float> prefill_piece_out, prefill_piece_lse, prefill_lse;
    PrefillKvF16Scratch prefill_kv_f16;
    PinnedBuffer host_token;                // int32: the sampled token, read by the host
    // Decode graphs: two executables alternate (see the header comment).
    cudaGraphExec_t graph_exec[2] = {nullptr, nullptr};
    cudaEvent_t graph_done[2] = {nullptr, nullptr};
    bool graph_launched[2] = {false, false};
    uint32_t graph_pos[2] = {UINT32_MAX, UINT32_MAX};
    bool graph_greedy[2] = {false, false};
    bool warmed[3][3] = {};                 // per (K, V) type: one direct step ran (see prepare)
    uint64_t graph_rebuilds = 0;            // full instantiations (topology changes)
    size_t graph_bytes = 0;                 // VRAM the instantiated graphs took (cudaMemGetInfo delta)
    // Lab (attention_timeline.h): while set, layer il's resident decode attention stamps
    // its timeline at attn_timeline + il * attn_timeline_stride (captured into the graphs).
    uint64_t* attn_timeline = nullptr;
    size_t attn_timeline_stride = 0;

    CudaForwardState() = default;
    CudaForwardState(const CudaForwardState&) = delete;
    CudaForwardState& operator=(const CudaForwardState&) = delete;
    ~CudaForwardState();
};

// Scratch sized for chunks of up to max_tokens tokens and a cache of n_ctx cells.
// The state owns its own non-blocking stream and cuBLAS handle.
void init_cuda_forward_state(CudaForwardState& state, const CudaModel& model, uint32_t max_tokens,
                             bool all_logits, uint32_t n_ctx);
// Decode through the persistent layer kernel (decode_layer.cuh) or the separate kernels. The
// default comes from SPILLWAY_DECODE_LAYER (lab, 1 = on; off by default: slower, measured in
// docs/perf-notes.md, session 15); tests set it per state. Returns whether the kernel is on
// (false when the model or the GPU does not take it). Before the state's first decode graph.
bool set_cuda_decode_layer(CudaForwardState& state, const CudaModel& model, bool on);

// Whether a decode step of this model can run fused (CudaForwardState::decode_fusion): every
// layer's q|k|v and gate|up stored back to back, its four matrices in the split layout with
// rows the fused sweep GEMV takes (matvec_q8s.cuh), 16-byte aligned norm weights.
bool decode_fusion_fits(const CudaModel& model);
// The prefill chunk for long prompts when the user gives none: 4096 where every layer's chunk
// FFN takes the SwiGLU GEMM (Q8_0 weights in the split layout, sm_90a kernels on an sm_90
// GPU), which holds only the FFN's f16 output (~120 KB of scratch per chunk token for the 14B
// shape), else 2048 (the f32 gate and up are held: ~230 KB per token). Measured (session 46,
// H100, 14B shape, f16 KV): 4096 against 2048 +6.3% at 8k, +4.6% at 64k; 8192 +1.9% at 8k.
uint32_t cuda_long_prompt_chunk(const CudaModel& model);
// Scratch bytes the state holds (everything except the graphs), and the same by buffer (the
// ones holding memory, named as in CudaForwardState) for `bench --json`'s breakdown.
struct ScratchPart {
    const char* name;
    uint64_t bytes;
};
std::vector<ScratchPart> cuda_forward_scratch_parts(const CudaForwardState& state);
uint64_t cuda_forward_scratch_bytes(const CudaForwardState& state);

// Enqueues the forward of tokens (device array state.tokens, already written) at positions
// pos0.. on state.stream; logits land in state.logits. n_tokens == 1 takes the decode path.
void forward_cuda(const CudaModel& model, CudaKvCache& cache, CudaForwardState& state, uint32_t n_tokens,
                  uint32_t pos0);

// Copies host tokens into state.tokens (async, on state.stream) and runs forward_cuda.
void forward_cuda_tokens(const CudaModel& model, CudaKvCache& cache, CudaForwardState& state,
                         const int32_t* host_tokens, uint32_t n_tokens, uint32_t pos0);

// One decode step of the token in state.next_token at position pos: the forward, then (when
// greedy) argmax into state.next_token and state.host_token. use_graph = false enqueues the
// same kernels directly (the reference for the graph path).
void decode_step_cuda(const CudaModel& model, CudaKvCache& cache, CudaForwardState& state, uint32_t pos,
                      bool greedy, bool use_graph);
// Captures the step for position pos into its graph ahead of time (the host work of the
// next step, done while the GPU runs the current one). decode_step_cuda calls it itself
// when it was not done.
void prepare_decode_graph(const CudaModel& model, CudaKvCache& cache, CudaForwardState& state, uint32_t pos,
                          bool greedy);

// argmax of state.logits row `row` into state.next_token and state.host_token (async).
void argmax_logits_cuda(CudaForwardState& state, uint32_t n_vocab, uint32_t row);

}  // namespace spillway
