// The GPU forward pass: launch sequence of one chunk (prefill) or one token (decode), the
// decode graph, and the small kernels nobody else owns (embedding rows, bias add, argmax,
// random KV fill). The heavy ops are the kernel engineer's launchers (matvec, attention,
// rmsnorm, rope, swiglu, kv_write) and cuda_prefill.cuh.
#include "engine/cuda/cuda_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <span>
#include <string>

#include "common/error.h"
#include "engine/cuda/act_quant.cuh"
#include "engine/cuda/argmax.cuh"
#include "engine/cuda/attention.cuh"
#include "engine/cuda/attention_short.cuh"
#include "engine/cuda/cuda_prefill.cuh"
#include "engine/cuda/kv_write.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/decode_layer.cuh"
#include "engine/cuda/matvec.cuh"
#include "engine/cuda/matvec_q8s.cuh"
#include "engine/cuda/op_times.h"
#include "engine/cuda/qkv_post.cuh"
#include "engine/cuda/rmsnorm.cuh"
#include "engine/cuda/rope.cuh"
#include "engine/cuda/swiglu.cuh"

namespace spillway {
namespace {

// Cap of the prefill weight tile: 32M halves (64 MiB). The tile itself is as large as the
// largest tile the model's matrices take under it (prefill_tile_elems): 50 MiB for the 14B
// shape (its 5120 x 5120 projections whole, gate / up in 3 x 4608 rows, down in 3 x <= 1792);
// with all logits the 152k x 5120 head goes through it in 24 tiles.
constexpr size_t kWeightTileElems = 32ull << 20;

// tokens[0..n) := src (device) when given; positions[i] := pos0 + i. A kernel rather than a
// memcpy so that pos0 is a node parameter the per-step graph update can change.
__global__ void set_inputs_kernel(int32_t* tokens, int32_t* positions, const int32_t* token_src, uint32_t pos0,
                                  uint32_t n) {
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        positions[i] = (int32_t)(pos0 + i);
        if (token_src) tokens[i] = token_src[i];
    }
}

// x[t] = row tokens[t] of the embedding table as f32. Out-of-range ids were rejected on the
// host; the clamp only keeps a corrupt id from reading outside the table.
__global__ void embed_rows_kernel(int type, const uint8_t* table, uint64_t row_bytes, const int32_t* tokens,
                                  uint32_t n_vocab, uint32_t n_embd, float* x) {
    const uint32_t t = blockIdx.y;
    const uint32_t token = (uint32_t)min(max(tokens[t], 0), (int32_t)n_vocab - 1);
    const uint8_t* row = table + token * row_bytes;
    for (uint32_t d = blockIdx.x * blockDim.x + threadIdx.x; d < n_embd; d += gridDim.x * blockDim.x) {
        float v;
        if (type == (int)GgmlType::Q8_0) {
            const uint8_t* b = row + (d / 32) * 34;
            v = __half2float(*reinterpret_cast<const __half*>(b)) * (float)(int8_t)b[2 + d % 32];
        } else if (type == (int)GgmlType::F16) {
            v = __half2float(reinterpret_cast<const __half*>(row)[d]);
        } else if (type == (int)GgmlType::BF16) {
            v = __uint_as_float((uint32_t)reinterpret_cast<const uint16_t*>(row)[d] << 16);
        } else {
            v = reinterpret_cast<const float*>(row)[d];
        }
        x[(size_t)t * n_embd + d] = v;
    }
}

__global__ void add_bias_kernel(float* y, const float* bias, uint32_t n, uint32_t n_tokens) {
    const size_t total = (size_t)n * n_tokens;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % n];
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Random valid KV units: one f16 value (uniform in [-2, 2)), or one q8_0 / q4_0 block with
// a scale in [0.002, 0.03) (q4_0: x8) and random quants (q8_0 kept in [-127, 127]).
__global__ void fill_kv_random_kernel(uint8_t* dst, uint64_t n_units, int type, uint64_t seed) {
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < n_units; u += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = mix64(seed ^ (u * 0xD1B54A32D192ED03ull));
        const float x01 = (float)(r >> 40) * (1.0f / 16777216.0f);
        if (type == (int)KvType::f16) {
            reinterpret_cast<__half*>(dst)[u] = __float2half_rn(4.0f * x01 - 2.0f);
            continue;
        }
        const int block = type == (int)KvType::q8_0 ? 34 : 18;
        uint8_t* b = dst + u * block;
        const float scale = 0.002f + 0.028f * x01;
        *reinterpret_cast<__half*>(b) = __float2half_rn(type == (int)KvType::q8_0 ? scale : 8.0f * scale);
        for (int i = 2; i < block; ++i) {
            if ((i - 2) % 8 == 0) r = mix64(r + i);
            uint8_t q = (uint8_t)(r >> (8 * ((i - 2) % 8)));
            if (type == (int)KvType::q8_0 && q == 0x80) q = 0x81;
            b[i] = q;
        }
    }
}

unsigned grid_for(uint64_t n, unsigned threads) {
    return (unsigned)std::max<uint64_t>(1, std::min<uint64_t>((n + threads - 1) / threads, 132ull * 32));
}

void add_bias(float* y, const float* bias, uint32_t n, uint32_t n_tokens, cudaStream_t s) {
    add_bias_kernel<<<grid_for((uint64_t)n * n_tokens, 256), 256, 0, s>>>(y, bias, n, n_tokens);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

AttentionShape attention_shape(const CudaModel& m) {
    const ModelSpec& s = m.spec;
    return AttentionShape{s.n_head, m.n_head_kv, s.head_dim_k, s.head_dim_v, 1.0f / std::sqrt((float)s.head_dim_k)};
}

ActQ16 act_q16(CudaForwardState& st) { return ActQ16{st.act_q16.data(), st.act_q16_scale.data()}; }
ActQ16 glu_q16(CudaForwardState& st) { return ActQ16{st.glu_q16.data(), st.glu_q16_scale.data()}; }

// y = W x for a chunk: matvec for one token, tensor-core GEMM for more.
// op_label: the GEMM's name in the SPILLWAY_OP_TIMES totals (op_times.h). x_is_f16: a chunk
// whose x the previous matmul already converted (q, k and v share xn; gate and up too).
// add_to_y (chunks only): y += W x, the residual add of the wo and down projections.
void matmul(CudaForwardState& st, const CudaMatrix& w, const float* x, uint32_t n_tokens, float* y,
            const char* op_label = "gemm", bool x_is_f16 = false, bool add_to_y = false) {
    if (add_to_y && n_tokens == 1) fail("matmul: add_to_y is for chunks of several tokens");
    if (n_tokens == 1 && w.q8_scales) {  // the split layout's GEMV reads x as int16 blocks
        quantize_act_q16_cuda(x, w.n_in, 1, act_q16(st), st.stream);
        return matvec_q8s_cuda(Q8SplitConst{reinterpret_cast<const int8_t*>(w.data), w.q8_scales}, act_q16(st), y,
                               w.n_out, w.n_in, st.stream);
    }
    if (n_tokens == 1) return matvec_cuda(w.type, w.data, x, y, w.n_out, w.n_in, 1, st.stream);
    if (!x_is_f16) prefill_act_to_f16_cuda(x, (size_t)n_tokens * w.n_in, st.act_f16.data(), st.stream);
    matmul_prefill_f16act_cuda(st.cublas, w, n_tokens, y, st.prefill_gemm, st.stream, op_label, add_to_y);
}

// A chunk's product with matrices kept back to back (q|k|v, gate|up: `first` and the rows after
// it, total_rows in all) as one codes-GEMM launch (prefill_gemm_q8s.cuh), their results into
// separate buffers: fewer, fuller waves than one launch per matrix (k and v alone fill 64-128
// blocks). False, with nothing launched, where the codes GEMM does not take the group.
// Lab: SPILLWAY_PREFILL_GEMM_MERGE=0, one launch per matrix.
bool prefill_gemm_merge_on() {
    static const bool separate = lab_knob("SPILLWAY_PREFILL_GEMM_MERGE", "0", "1");
    return !separate;
}
bool matmul_merged(CudaForwardState& st, const CudaMatrix& first, uint32_t total_rows, const float* x, uint32_t n_tokens,
                   std::span<const GemmOutput> outs, const char* op_label, bool x_is_f16) {
    if (!prefill_gemm_merge_on() || n_tokens < 2) return false;
    CudaMatrix all = first;
    all.n_out = total_rows;
    if (!prefill_gemm_reads_codes(all)) return false;
    uint64_t rows = 0;
    for (size_t i = 0; i + 1 < outs.size(); ++i)
        if ((rows += outs[i].rows) % kQ8sGemmRowBlock != 0) return false;  // outputs start at whole row blocks
    if (!x_is_f16) prefill_act_to_f16_cuda(x, (size_t)n_tokens * all.n_in, st.act_f16.data(), st.stream);
    if (!matmul_prefill_codes_cuda(all, n_tokens, outs, st.prefill_gemm, st.stream))
        fail("matmul_merged: the codes GEMM declined a group it takes");
    op_times_mark(op_label, st.stream);
    return true;
}

// Lab: SPILLWAY_PREFILL_GLU=0, gate|up written as f32 and a SwiGLU launch (the path before
// session 43's fused epilogue).
bool prefill_glu_on() {
    static const bool off = lab_knob("SPILLWAY_PREFILL_GLU", "0", "1");
    return !off;
}

// A chunk's gate|up product (`gate` and the up rows after it, total_rows in all) with its SwiGLU
// in the codes GEMM's epilogue, written as f16 to act (prefill_gemm_q8s_swiglu_cuda); x already
// in st.act_f16. act, or nullptr (nothing launched) where that GEMM does not take the pair.
__half* matmul_glu(CudaForwardState& st, const CudaMatrix& gate, uint32_t total_rows, uint32_t n_tokens, __half* act) {
    CudaMatrix gate_up = gate;
    gate_up.n_out = total_rows;
    if (!prefill_gemm_reads_codes(gate_up) ||
        !prefill_gemm_q8s_swiglu_cuda(gate_up, st.act_f16.data(), n_tokens, act, st.stream, {},
                                      st.prefill_gemm.gemm_workspace))
        return nullptr;
    op_times_mark("gemm gate|up + swiglu", st.stream);
    return act;
}

// Whether a chunk's FFN of layer L goes through matmul_glu (f16 SwiGLU into gate|up's memory,
// then down from it) in a state with fused_prefill: the test enqueue_forward makes, also used
// to size gate|up's memory.
bool chunk_ffn_takes_glu(bool fused_prefill, const CudaLayerWeights& L, uint32_t n_ff) {
    CudaMatrix gate_up = L.ffn_gate;
    gate_up.n_out = 2 * n_ff;
    return fused_prefill && L.fused_gate_up && prefill_glu_on() && prefill_gemm_reads_codes(L.ffn_down) &&
           prefill_gemm_reads_codes(gate_up) && prefill_gemm_q8s_swiglu_takes(gate_up);
}
bool every_chunk_ffn_takes_glu(bool fused_prefill, const CudaModel& m) {
    return std::all_of(m.layers.begin(), m.layers.end(), [&](const CudaLayerWeights& L) {
        return chunk_ffn_takes_glu(fused_prefill, L, m.spec.n_ff);
    });
}
// SPILLWAY_PREFILL_FUSED=0 (lab): f32 producer outputs, a conversion pass, separate bias / RoPE /
// K/V launches.
bool prefill_fused_on() { return !lab_knob("SPILLWAY_PREFILL_FUSED", "0", "1"); }
// SPILLWAY_PREFILL_GEMM_ADDS=0 (lab): a chunk's wo and down write proj (T rows) and the next
// RMSNorm adds it to the stream, instead of the GEMMs adding into x (a TMA add in L2 for the
// codes GEMM, beta = 1 for cuBLAS).
bool prefill_gemm_adds_on() { return !lab_knob("SPILLWAY_PREFILL_GEMM_ADDS", "0", "1"); }

// Whether a fused chunk's q|k|v GEMM of layer L does the post-QKV work in its epilogue
// (prefill_gemm_q8s_qkv_rope_cuda): f16 K and V written straight into a resident cache, NeoX
// RoPE over whole 128-dim heads (with the forward's rope table). Elsewhere qkv_post_cuda does it
// (quantized tiers quantize whole 32-value blocks of a token, which the GEMM's threads do not
// hold). Session 49, H100, ABBA at -b 4096 against the separate launch: 8k +2.1%, 64k +0.5%.
// SPILLWAY_PREFILL_QKV_ROPE=0 (lab) restores the launch; never with SPILLWAY_PREFILL_GEMM_MERGE=0
// (a launch per matrix).
bool chunk_qkv_takes_rope(const CudaModel& m, const CudaLayerWeights& L, KvType k_type, KvType v_type) {
    static const bool off = lab_knob("SPILLWAY_PREFILL_QKV_ROPE", "0", "1");
    const ModelSpec& s = m.spec;
    CudaMatrix wqkv = L.wq;
    wqkv.n_out = s.n_head * s.head_dim_k + m.n_head_kv * (s.head_dim_k + s.head_dim_v);
    return !off && prefill_gemm_merge_on() && L.fused_qkv && k_type == KvType::f16 && v_type == KvType::f16 &&
           m.rope_dev.neox && m.rope_dev.n_dims == s.head_dim_k && s.head_dim_k == s.head_dim_v &&
           prefill_gemm_reads_codes(wqkv) && prefill_gemm_q8s_qkv_rope_takes(wqkv, s.n_head, m.n_head_kv, s.head_dim_k);
}

// Decode with Q8_0 weights: the matvec (q16x for GGUF layout, q8s for the split layout, whose
// rows are a subset of q16x's) reads its x as int16 blocks (act_quant.cuh) written by x's
// producer (rmsnorm, swiglu) or by quantize_act_q16_cuda; other weights read f32 x.
bool takes_q16(const CudaMatrix& w, uint32_t n_tokens) {
    return n_tokens == 1 && w.type == GgmlType::Q8_0 && matvec_q8_0_q16x_fits(w.n_in);
}
// The fused post-QKV kernel's limits (qkv_post.cuh).
bool qkv_post_fits(const CudaModel& m) {
    const ModelSpec& s = m.spec;
    return s.head_dim_k == s.head_dim_v && s.head_dim_k % 32 == 0 && s.head_dim_k <= 256 && m.rope_dev.n_dims > 0 &&
           m.rope_dev.inv_freq != nullptr;
}

// One token: rows of w (maybe several matrices stored back to back) times x, from the
// quantized x when takes_q16 (then x_q16 must hold x), else from x.
// Which GEMV of the decode step lets its successor launch at its entry (matvec.cuh).
enum class GemvSite : uint32_t { other = 0, qkv = 1, wo = 2, gate_up = 4, down = 8, head = 16 };
// SPILLWAY_Q16X_RELEASE=<bit mask of GemvSite> (lab): the GEMVs whose successor (a small
// kernel that waits for the GEMV itself) may launch at the GEMV's entry. Default: all but wo
// (session 17, 14B shape, tok/s d=0 / 8k: none 200.5 / 180.1, all 204.4 / 179.7, all but wo
// 203.5 / 182.2, wo alone 201.5 / 177.4; with the single-split attention writing its int16
// output itself, wo's release cost at d=0 too: 204.8 vs 206.9 without it).
bool release_at_entry(GemvSite site) {
    static const uint32_t mask = lab_knob_uint("SPILLWAY_Q16X_RELEASE", 29, 31, 0);  // a bit mask
    return (mask & (uint32_t)site) != 0;
}

// site: the GEMV's place in the step; `other` for one followed by another GEMV (q, k, v or
// gate, up as separate matrices), which must not release early.
void matvec_decode(CudaForwardState& st, const CudaMatrix& w, uint32_t rows, const float* x, float* y,
                   GemvSite site = GemvSite::other) {
    if (w.q8_scales)
        matvec_q8s_cuda(Q8SplitConst{reinterpret_cast<const int8_t*>(w.data), w.q8_scales}, act_q16(st), y, rows,
                        w.n_in, st.stream, release_at_entry(site));
    else if (takes_q16(w, 1))
        matvec_q8_0_q16x_cuda(w.data, act_q16(st), y, rows, w.n_in, st.stream, release_at_entry(site));
    else matvec_cuda(w.type, w.data, x, y, rows, w.n_in, 1, st.stream);
}

// Lab knobs, A/B'd in docs/perf-notes.md (session 12): SPILLWAY_PREFILL_OVERLAP=0 (one
// weight tile, dequantized on the main stream), SPILLWAY_PREFILL_TILES=greedy (full tiles,
// remainder last), SPILLWAY_PREFILL_FUSED=0, SPILLWAY_ROPE_TABLE=0 (see their uses).

// SPILLWAY_QKV_POST_TOKEN_BLOCKS=N (lab): at most N blocks per head along a chunk's tokens in
// the post-QKV kernel, each looping over its tokens; 0 = one block per token. Default 256:
// 8k prefill +0.7% against one block per token (session 13, docs/perf-notes.md).
uint32_t qkv_post_token_blocks() {
    static const uint32_t n = lab_knob_uint("SPILLWAY_QKV_POST_TOKEN_BLOCKS", 256, 65535);
    return n;
}

// SPILLWAY_SHORT_ATTENTION=0 (lab): up to 128 cells, qkv_post and the split kernel instead of
// the short-context kernel (attention_short.cuh), as before session 51.
bool short_attention_on() {
    static const bool on = !lab_knob("SPILLWAY_SHORT_ATTENTION", "0", "1");
    return on;
}

// SPILLWAY_POST_QKV=kernel (lab): bias + RoPE + K/V write in their own launch at every
// depth, as before session 17 (A/B in one binary).
bool post_qkv_in_attention() {
    static const bool in_attention = !lab_knob("SPILLWAY_POST_QKV", "kernel", "attention");
    return in_attention;
}

bool qkv_epilogue_on() {
    static const bool on = lab_knob("SPILLWAY_QKV_EPILOGUE", "1", "0");
    return on;
}

bool separate_attention_quant() {
    static const bool separate = lab_knob("SPILLWAY_ATTENTION_QUANT", "separate", "fused");
    return separate;
}

// A chunk's attention writes its output as the f16 input of the wo GEMM where its kernel can
// (the wgmma ones, over one partial), saving the f32 write and the conversion pass.
// SPILLWAY_ATTN_F16_OUT=0 (lab): f32 output, converted by the GEMM's own pass.
bool attention_writes_f16() {
    static const bool on = !lab_knob("SPILLWAY_ATTN_F16_OUT", "0", "1");
    return on;
}

// Whether one token's wo, gate|up, down and the next layer's q|k|v can run as one persistent
// kernel (decode_layer.cuh): every layer has Q8_0 weights of shapes it takes, gate|up and
// q|k|v stored back to back, and the GPU runs it.
bool decode_layer_fits(const CudaModel& m) {
    if (!decode_layer_supported()) return false;
    const ModelSpec& s = m.spec;
    const auto fits = [](const CudaMatrix& w, uint32_t rows) {  // the kernel reads GGUF layout only
        return takes_q16(w, 1) && w.q8_scales == nullptr && decode_layer_phase_fits(rows, w.n_in);
    };
    const uint32_t qkv_rows = s.n_head * s.head_dim_k + m.n_head_kv * (s.head_dim_k + s.head_dim_v);
    for (const CudaLayerWeights& L : m.layers) {
        if (!L.fused_qkv || !L.fused_gate_up || L.wo.n_out != s.n_embd || L.ffn_down.n_out != s.n_embd) return false;
        if (reinterpret_cast<uintptr_t>(L.attn_norm) % 16 != 0 || reinterpret_cast<uintptr_t>(L.ffn_norm) % 16 != 0)
            return false;  // the kernel stages them with 16-byte copies
        if (!fits(L.wq, qkv_rows) || !fits(L.wo, s.n_embd) || !fits(L.ffn_gate, 2 * s.n_ff) || !fits(L.ffn_down, s.n_embd))
            return false;
    }
    return true;
}

Q8SplitConst split_of(const CudaMatrix& w) { return Q8SplitConst{reinterpret_cast<const int8_t*>(w.data), w.q8_scales}; }

// Whether layer L's decode FFN runs gate|up with SwiGLU in its epilogue, straight into down
// (matvec_q8s_swiglu_cuda): both in the split layout, gate|up stored back to back; the state
// must also hold the epilogue's buffers (CudaForwardState::glu_q16, uses_glu_epilogue).
bool glu_epilogue_takes(const CudaLayerWeights& L, uint32_t n_ff) {
    return L.fused_gate_up && L.ffn_gate.q8_scales && L.ffn_down.q8_scales &&
           matvec_q8s_swiglu_fits(n_ff, L.ffn_gate.n_in) && L.ffn_down.n_in == n_ff && matvec_q8s_fits(n_ff);
}
bool uses_glu_epilogue(const CudaForwardState& st, const CudaLayerWeights& L, uint32_t n_ff) {
    return st.glu_arrivals.size() > 0 && glu_epilogue_takes(L, n_ff);
}

// Whether a decode step can run with every RMSNorm after the first split across the GEMVs
// around it (matvec_q8s_norm_out_cuda / NormedX): each layer's FFN takes the SwiGLU epilogue,
// its q|k|v, wo and down are in the split layout with shapes the chained sweeps take. The head
// joins the chain when it is in the split layout too (else its norm stays a launch).
bool norm_chain_takes(const CudaModel& m) {
    const ModelSpec& s = m.spec;
    if (m.layers.empty()) return false;
    for (const CudaLayerWeights& L : m.layers) {
        if (!glu_epilogue_takes(L, s.n_ff) || !L.fused_qkv || !L.wq.q8_scales || !L.wo.q8_scales) return false;
        if (L.wo.n_out != s.n_embd || L.ffn_down.n_out != s.n_embd || L.wq.n_in != s.n_embd ||
            L.ffn_gate.n_in != s.n_embd || !matvec_q8s_fits(L.wq.n_in) ||
            !matvec_q8s_norm_out_fits(s.n_embd, L.wo.n_in) || !matvec_q8s_norm_out_fits(s.n_embd, L.ffn_down.n_in))
            return false;
    }
    return true;
}
bool head_in_norm_chain(const CudaModel& m) {
    return m.output.q8_scales != nullptr && m.output.n_in == m.spec.n_embd && matvec_q8s_fits(m.output.n_in);
}
ActQ16 norm_q16(CudaForwardState& st) { return ActQ16{st.norm_q16.data(), st.norm_q16_scale.data()}; }
// SPILLWAY_HANDOVER=fence|skip (lab): the chained epilogues' cut-block hand-over with the
// grid barrier's fences (the default until session 37), or none at all (skip: wrong output,
// the timing floor); default lean, one acq_rel atomic (HandOver, matvec_q8s.cuh).
HandOver handover_mode() {
    static const HandOver modes[] = {HandOver::lean, HandOver::fence, HandOver::skip};
    static const int mode = std::max(0, lab_knob_choice("SPILLWAY_HANDOVER", {"lean", "fence", "skip"}));
    return modes[mode];
}
GluScratch handover_scratch(float* stage, uint32_t* arrivals) { return GluScratch{stage, arrivals, handover_mode()}; }
// SPILLWAY_CHAIN_WO=MASK (lab): under the norm chain, 1: wo releases gate|up at its entry, 2:
// the split merge before wo is a programmatic launch, 4: wo releases gate|up when its wait
// for the attention returns (instead of 1; session 32's timeline: released at entry, gate|up's
// first loads run beside the attention). Default 1 (session 28: with 1 and 2, the chain lost
// at depth).
uint32_t norm_chain_wo_mode() {
    static const uint32_t mode = lab_knob_uint("SPILLWAY_CHAIN_WO", 1, 7, 0);
    return mode;
}

// SPILLWAY_FUSED_RELEASE=<bit mask of GemvSite> (lab): the fused GEMVs that let their
// successor launch at their entry. Default all: with fusion wo is followed by gate|up, a GEMV,
// not by a small kernel (the separate path's mask, release_at_entry, leaves wo out).
bool fused_release_at_entry(GemvSite site) {
    static const uint32_t mask = lab_knob_uint("SPILLWAY_FUSED_RELEASE", 31, 31, 0);
    return (mask & (uint32_t)site) != 0;
}

// Layer il's wo (x: the quantized attention output), gate|up (x: RMSNorm of the stream after
// wo's residual add), down (x: SwiGLU) and, unless il is the last layer, layer il + 1's
// q|k|v (x: its attention RMSNorm of the stream after down's add).
void enqueue_decode_layer(const CudaModel& m, CudaForwardState& st, uint32_t il) {
    const ModelSpec& s = m.spec;
    const CudaLayerWeights& L = m.layers[il];
    DecodeLayerArgs a;
    a.stream = st.x.data();
    a.x_q16 = act_q16(st);
    a.eps = s.norm_eps;
    float* gate_up = st.gate_up.data();
    a.phases[0] = DecodeGemvPhase{L.wo.data, s.n_embd, L.wo.n_in, DecodeX::act_q16, DecodeY::add_to_stream};
    // gate|up computes gate row j and up row j together and writes silu(gate) * up (F values).
    a.phases[1] = DecodeGemvPhase{L.ffn_gate.data, 2 * s.n_ff, L.ffn_gate.n_in, DecodeX::stream_rmsnorm,
                                  DecodeY::swiglu_pairs, L.ffn_norm, nullptr, gate_up};
    a.phases[2] = DecodeGemvPhase{L.ffn_down.data, s.n_embd, L.ffn_down.n_in, DecodeX::f32, DecodeY::add_to_stream,
                                  nullptr, nullptr, nullptr, gate_up};
    a.n_phases = 3;
    if (il + 1 < s.n_layer) {
        const CudaLayerWeights& next = m.layers[il + 1];
        const uint32_t qkv_rows = s.n_head * s.head_dim_k + m.n_head_kv * (s.head_dim_k + s.head_dim_v);
        a.phases[3] = DecodeGemvPhase{next.wq.data, qkv_rows, next.wq.n_in, DecodeX::stream_rmsnorm, DecodeY::store,
                                      next.attn_norm, nullptr, st.qkv.data()};
        a.n_phases = 4;
    }
    decode_layer_cuda(a, st.decode_scratch.data(), st.stream);
}

// The whole forward of n tokens at pos0..; token ids from token_src (device) when given,
// else already in st.tokens.
void enqueue_forward(const CudaModel& m, CudaKvCache& cache, CudaForwardState& st, uint32_t T, uint32_t pos0,
                     const int32_t* token_src) {
    const ModelSpec& s = m.spec;
    const cudaStream_t stream = st.stream;
    const uint32_t E = s.n_embd, F = s.n_ff, V = s.n_vocab, nkv = m.n_head_kv;
    const uint32_t qd = s.n_head * s.head_dim_k, kd = nkv * s.head_dim_k, vd = nkv * s.head_dim_v;
    const AttentionShape shape = attention_shape(m);

    set_inputs_kernel<<<1, 256, 0, stream>>>(st.tokens.data(), st.positions.data(), token_src, pos0, T);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    embed_rows_kernel<<<dim3((E + 255) / 256, T), 256, 0, stream>>>((int)m.token_embd.type, m.token_embd.data,
                                                                     m.token_embd.row_bytes, st.tokens.data(), V, E,
                                                                     st.x.data());
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    // cos / sin of this forward's positions, shared by every layer's post-QKV kernel.
    const float2* rope_table = nullptr;
    if (st.rope_cs.size() > 0) {
        rope_table_cuda(m.rope_dev, st.positions.data(), T, st.rope_cs.data(), stream);
        rope_table = st.rope_cs.data();
    }
    op_times_mark("embed", stream);

    float* x = st.x.data();
    float* xn = st.xn.data();
    float* proj = st.proj.data();
    // A chunk's wo and down GEMMs add into x themselves (cuBLAS beta = 1); one token's land in
    // proj, which the next norm adds (or the fused / chained paths handle themselves).
    const bool gemm_adds = T > 1 && prefill_gemm_adds_on();
    float* const wo_down_out = gemm_adds ? x : proj;
    const float* const norm_add = gemm_adds ? nullptr : proj;
    float* q = st.qkv.data();
    float* k = q + (size_t)T * qd;
    float* v = k + (size_t)T * kd;
    float* gate = st.gate_up.data();
    float* up = gate + (size_t)T * F;
    // A forward whose cells stay inside the resident window runs exactly the unspilled path.
    const bool spilled = spill_engaged(cache.spill.get(), pos0, T);
    // A prefill chunk's producers write the GEMMs' f16 inputs themselves (norms, SwiGLU) and
    // bias + RoPE + K/V write run as one launch.
    const bool fused_prefill = T > 1 && st.fused_prefill;
    SpillCursor spill_cursor;
    if (spilled) spill_forward_begin(*cache.spill, spill_cursor, s.n_layer, pos0, T, stream);
    // One token through the persistent layer kernel: from wo to the next layer's q|k|v in one
    // launch, residual adds into x inside it (so proj is not used).
    const bool decode_layer = T == 1 && st.decode_scratch.size() > 0;
    // One token through the fused GEMVs: x is the residual stream with every add done (wo and
    // down add into it), each GEMV norms or gates its own x; proj, xn and the norm / SwiGLU
    // launches are not used.
    const bool fused = T == 1 && !decode_layer && st.decode_fusion && decode_fusion_fits(m);
    // One token with the norms split across the GEMVs (norm_chain_takes): after layer 0's norm
    // no RMSNorm launch; wo and down add into x and write the next GEMV's x (norm_q16) and their
    // sums of squares (norm_partials[0] for the FFN's norm, [1] for the next attention's).
    const bool norm_chain = T == 1 && !decode_layer && !fused && st.norm_chain && st.norm_partials[0].size() > 0;
    uint32_t attn_norm_partials = 0, ffn_norm_partials = 0;
    const auto normed_x = [&](int which, uint32_t n) {
        return NormedX{st.norm_partials[which].data(), n, s.norm_eps};
    };
    const auto norm_out = [&](const float* weight, int which) {
        return NormOut{x, weight, st.norm_partials[which].data(), norm_q16(st),
                       handover_scratch(proj, st.norm_arrivals.data())};
    };
    for (uint32_t il = 0; il < s.n_layer; ++il) {
        const CudaLayerWeights& L = m.layers[il];
        bool attn_is_f16 = false;  // a chunk's attention wrote the wo GEMM's f16 input itself
        __half* glu_act = nullptr;  // a chunk's SwiGLU, written by the gate|up GEMM (down's input)
        // The previous layer's FFN output joins the residual stream inside the norm. A prefill
        // chunk's norm writes only the f16 input of the GEMMs.
        if ((!decode_layer || il == 0) && !fused && (!norm_chain || il == 0))
            rmsnorm_cuda(x, il == 0 ? nullptr : norm_add, L.attn_norm, fused_prefill ? nullptr : xn, T, E, s.norm_eps,
                         stream, takes_q16(L.wq, T) || takes_q16(L.wk, T) || takes_q16(L.wv, T) ? act_q16(st) : ActQ16{},
                         fused_prefill ? st.act_f16.data() : nullptr);
        op_times_mark("rmsnorm", stream);
        // SPILLWAY_QKV_EPILOGUE=1 (lab): the norm chain's q|k|v GEMV does the post-QKV work
        // itself (matvec_q8s_qkv_rope_cuda): NeoX RoPE over whole heads, a resident cell.
        const bool qkv_epilogue = norm_chain && il > 0 && qkv_epilogue_on() && !spilled && rope_table != nullptr &&
                                  st.qkv_kv_stage.size() > 0 && m.rope_dev.neox &&
                                  m.rope_dev.n_dims == s.head_dim_k && s.head_dim_k == s.head_dim_v &&
                                  L.wq.q8_scales != nullptr && L.fused_qkv &&
                                  matvec_q8s_qkv_rope_fits(s.n_head, nkv, s.head_dim_k, L.wq.n_in);
        // A fused chunk over a resident f16 cache: q|k|v's GEMM does the post-QKV work itself.
        const bool qkv_rope_gemm = fused_prefill && !spilled && rope_table != nullptr &&
                                   chunk_qkv_takes_rope(m, L, cache.k_type, cache.v_type);
        if (decode_layer && il > 0) {
            // q|k|v came out of the previous layer's kernel.
        } else if (qkv_epilogue) {
            // Bias, RoPE and the new cell's K / V in the GEMV's epilogue (lab).
            matvec_q8s_qkv_rope_cuda(split_of(L.wq), norm_q16(st), normed_x(1, attn_norm_partials), L.wq.n_in,
                                     QkvRope{q, cache.k[il] + (uint64_t)pos0 * kv_row_bytes(cache.k_type, kd),
                                             cache.v[il] + (uint64_t)pos0 * kv_row_bytes(cache.v_type, vd), L.bqkv,
                                             rope_table, s.n_head, nkv, s.head_dim_k, cache.k_type, cache.v_type,
                                             GluScratch{st.qkv_kv_stage.data(), st.qkv_kv_arrivals.data()}},
                                     stream, release_at_entry(GemvSite::qkv));
            op_times_mark("q|k|v + bias + rope + kv write", stream);
        } else if (norm_chain && il > 0) {
            matvec_q8s_normed_cuda(split_of(L.wq), norm_q16(st), normed_x(1, attn_norm_partials), q, qd + kd + vd,
                                   L.wq.n_in, stream, release_at_entry(GemvSite::qkv));
        } else if (fused) {
            matvec_q8s_fused_cuda(split_of(L.wq), GemvX{GemvXFrom::rmsnorm, {}, x, L.attn_norm, s.norm_eps}, q, false,
                                  qd + kd + vd, L.wq.n_in, stream, fused_release_at_entry(GemvSite::qkv));
        } else if (T == 1 && L.fused_qkv) {
            matvec_decode(st, L.wq, qd + kd + vd, xn, q, GemvSite::qkv);  // q|k|v contiguous
        } else if (T == 1) {
            matvec_decode(st, L.wq, qd, xn, q);
            matvec_decode(st, L.wk, kd, xn, k);
            matvec_decode(st, L.wv, vd, xn, v, GemvSite::qkv);
        } else if (qkv_rope_gemm) {
            CudaMatrix wqkv = L.wq;
            wqkv.n_out = qd + kd + vd;
            const QkvRopeChunk out{q,
                                   reinterpret_cast<__half*>(cache.k[il] + (uint64_t)pos0 * kv_row_bytes(cache.k_type, kd)),
                                   reinterpret_cast<__half*>(cache.v[il] + (uint64_t)pos0 * kv_row_bytes(cache.v_type, vd)),
                                   L.bqkv, rope_table, s.n_head, nkv};
            if (!prefill_gemm_q8s_qkv_rope_cuda(wqkv, st.act_f16.data(), T, out, stream, {},
                                                st.prefill_gemm.gemm_workspace))
                fail("enqueue_forward: the q|k|v GEMM declined the bias / RoPE / K/V epilogue it takes");
            op_times_mark("gemm q|k|v + bias + rope + kv write", stream);
        } else {
            const GemmOutput qkv_outs[3] = {{q, qd, qd}, {k, kd, kd}, {v, vd, vd}};
            if (!(L.fused_qkv && matmul_merged(st, L.wq, qd + kd + vd, xn, T, qkv_outs, "gemm q|k|v", fused_prefill))) {
                matmul(st, L.wq, xn, T, q, "gemm q", fused_prefill);
                matmul(st, L.wk, xn, T, k, "gemm k", true);
                matmul(st, L.wv, xn, T, v, "gemm v", true);
            }
        }
        // Bias, RoPE and the K/V write in one launch (qkv_post.cuh); the spilled path writes K/V
        // itself, so it gets only bias and RoPE.
        const bool post_fused = !qkv_epilogue && !qkv_rope_gemm && (T == 1 || fused_prefill) && qkv_post_fits(m) &&
                                T <= 65535;  // grid.y
        // One token over a resident range the split kernel takes in several splits (f16 K, 65
        // to 16383 cells): the attention kernel itself does the bias, RoPE and the new cell's
        // K/V write (attention.cuh, AttentionPostQkv).
        const bool post_in_attention = T == 1 && post_fused && !spilled && rope_table != nullptr &&
                                       post_qkv_in_attention() &&
                                       attention_takes_post_qkv(shape, cache.k_type, cache.v_type, pos0 + 1, st.sm_count);
        // One token over a short resident range (<= kShortAttentionMaxCells cells): one kernel does
        // the post-QKV work and the attention (attention_short.cuh). SPILLWAY_SHORT_ATTENTION=0
        // (lab): qkv_post and the split kernel, as before session 51.
        const bool short_attention = T == 1 && post_fused && !spilled && rope_table != nullptr &&
                                     short_attention_on() && attention_short_fits(shape, pos0 + 1);
        // SPILLWAY_LAB_SKIP_DECODE_ATTENTION=1 (lab, wrong output: a timing bound): a resident
        // decode step runs no post-QKV and no attention; wo reads the previous step's input.
        static const bool skip_decode_attention = lab_knob("SPILLWAY_LAB_SKIP_DECODE_ATTENTION", "1", "0");
        const bool skip_attention = skip_decode_attention && T == 1 && !spilled;
        if (post_in_attention || qkv_epilogue || qkv_rope_gemm || skip_attention || short_attention) {
            // Nothing here: see the attention call below, or done in the q|k|v GEMV or GEMM.
        } else if (post_fused) {
            const bool write_kv = !spilled;
            qkv_post_cuda(QkvPostShape{s.n_head, nkv, s.head_dim_k}, m.rope_dev, q, k, v, L.bqkv, T,
                          st.positions.data(), cache.k_type, write_kv ? cache.k[il] : nullptr, cache.v_type,
                          write_kv ? cache.v[il] : nullptr, pos0, stream, rope_table, qkv_post_token_blocks());
            op_times_mark("bias + rope + kv write", stream);
        } else if (L.bqkv) {
            if (T == 1) {
                add_bias(q, L.bqkv, qd + kd + vd, 1, stream);
            } else {
                add_bias(q, L.bqkv, qd, T, stream);
                add_bias(k, L.bqkv + qd, kd, T, stream);
                add_bias(v, L.bqkv + qd + kd, vd, T, stream);
            }
            op_times_mark("bias", stream);
        }
        if (T == 1 && !post_fused && !qkv_epilogue) {
            rope_cuda(m.rope_dev, q, 1, s.n_head + nkv, s.head_dim_k, st.positions.data(), stream);  // q and k heads
        } else if (T > 1 && !post_fused && !qkv_rope_gemm) {
            rope_cuda(m.rope_dev, q, T, s.n_head, s.head_dim_k, st.positions.data(), stream);
            rope_cuda(m.rope_dev, k, T, nkv, s.head_dim_k, st.positions.data(), stream);
            op_times_mark("rope", stream);
        }
        // K/V into the cache first: attention reads them back through the tier's quantization,
        // as the CPU engine does.
        if (spilled) {
            // Cells past the resident window: streamed tail, merged partials (kv_spill.h).
            const SpillLayerArgs args{shape, cache.k_type, cache.v_type, il, cache.k[il], cache.v[il], q, k, v,
                                      st.attn.data(), st.spill_lse.data(), st.spill_tail_out.data(),
                                      st.spill_tail_lse.data(), st.spill_chunk_out.data(), st.spill_chunk_lse.data(),
                                      st.attn_workspace.data(), st.attn_workspace.size(), st.spill_workspace.data(),
                                      st.spill_workspace.size(), st.sm_count};
            spill_layer_attention(*cache.spill, spill_cursor, args, stream);
            op_times_mark("attention (spilled)", stream);
        } else if (skip_attention) {
            // (lab bound: nothing; wo reads the previous step's attention output)
        } else if (short_attention) {
            ShortAttentionArgs a;
            a.q = q, a.k = k, a.v = v, a.bias = L.bqkv;
            a.rope_table = rope_table, a.rope_dims = m.rope_dev.n_dims, a.rope_neox = m.rope_dev.neox;
            a.k_cache = cache.k[il], a.v_cache = cache.v[il], a.n_cells = pos0 + 1;
            a.out = st.attn.data(), a.lse = st.attn_lse.data();
            if (takes_q16(L.wo, T) && !separate_attention_quant()) a.out_q16 = act_q16(st);
            attention_short_cuda(shape, cache.k_type, cache.v_type, a, stream, /*programmatic=*/true);
        } else if (T == 1) {
            if (!post_fused && !qkv_epilogue) {
                kv_write_cuda(cache.k_type, k, cache.k[il], pos0, T, kd, stream);
                kv_write_cuda(cache.v_type, v, cache.v[il], pos0, T, vd, stream);
            }
            // With a Q8_0 output projection the attention also writes its output quantized
            // (SPILLWAY_ATTENTION_QUANT=separate: a quantize launch of its own, to measure).
            AttentionPostQkv post;
            if (post_in_attention) {
                post.rope_table = rope_table;
                post.rope_dims = m.rope_dev.n_dims;
                post.rope_neox = m.rope_dev.neox;
                post.bias = L.bqkv;
                post.new_k = k;
                post.new_v = v;
                post.k_cache = cache.k[il];
                post.v_cache = cache.v[il];
            }
            if (st.attn_timeline != nullptr) attention_lab_timeline(st.attn_timeline + il * st.attn_timeline_stride);
            attention_partial_cuda(shape, q, cache.k_type, cache.k[il], cache.v_type, cache.v[il], pos0 + 1,
                                   st.attn.data(), st.attn_lse.data(), st.attn_workspace.data(),
                                   st.attn_workspace.size(), st.sm_count, stream,
                                   takes_q16(L.wo, T) && !separate_attention_quant() ? act_q16(st) : ActQ16{},
                                   pos0,  // cells before pos0: written by earlier steps
                                   post_in_attention ? &post : nullptr,
                                   !fused && (!norm_chain || (norm_chain_wo_mode() & 2) != 0));
            if (st.attn_timeline != nullptr) attention_lab_timeline(nullptr);
        } else {
            if (!post_fused && !qkv_rope_gemm) {
                kv_write_cuda(cache.k_type, k, cache.k[il], pos0, T, kd, stream);
                kv_write_cuda(cache.v_type, v, cache.v[il], pos0, T, vd, stream);
                op_times_mark("kv write", stream);
            }
            attn_is_f16 = prefill_attention_cuda(shape, q, cache.k_type, cache.k[il], cache.v_type, cache.v[il], pos0,
                                                 T, st.attn.data(), stream,
                                                 st.prefill_kv_f16.piece_cells > 0 ? &st.prefill_kv_f16 : nullptr,
                                                 attention_writes_f16() ? st.act_f16.data() : nullptr);
            op_times_mark("attention", stream);
        }
        if (takes_q16(L.wo, T)) {
            // The resident decode attention quantized its output itself (above); the spilled
            // path merges partials afterwards, so it quantizes here.
            if (spilled || separate_attention_quant())
                quantize_act_q16_cuda(st.attn.data(), L.wo.n_in, 1, act_q16(st), stream);
            if (decode_layer) {
                enqueue_decode_layer(m, st, il);
                op_times_mark("decode layer (wo .. next q|k|v)", stream);
                continue;
            }
            if (norm_chain) {
                // wo releases gate|up at its entry (a GEMV follows, not a small kernel), so the
                // split merge before it is an ordinary launch (above; session 28's fused path).
                // Measured (session 31, tg32 f16 0 / 8k / 64k): 230.0 / 206.4 / 131.4 this way;
                // wo not releasing 228.7 / 201.9 / 129.7; with the merge programmatic too 230.5 /
                // 204.2 / 126.5 (q8_0 at 8k: 170 against 202).
                NormOut wo_out = norm_out(L.ffn_norm, 0);
                wo_out.release_after_wait = (norm_chain_wo_mode() & 4) != 0;
                ffn_norm_partials = matvec_q8s_norm_out_cuda(split_of(L.wo), act_q16(st), E, L.wo.n_in, wo_out,
                                                             stream,
                                                             (norm_chain_wo_mode() & 1) != 0 && !wo_out.release_after_wait);
                matvec_q8s_swiglu_cuda(split_of(L.ffn_gate), norm_q16(st), F, L.ffn_gate.n_in, glu_q16(st),
                                       handover_scratch(gate, st.glu_arrivals.data()), stream,
                                       release_at_entry(GemvSite::gate_up), normed_x(0, ffn_norm_partials));
                const bool last = il + 1 == s.n_layer;
                if (!last || head_in_norm_chain(m)) {
                    attn_norm_partials = matvec_q8s_norm_out_cuda(
                        split_of(L.ffn_down), glu_q16(st), E, F,
                        norm_out(last ? m.output_norm : m.layers[il + 1].attn_norm, 1), stream,
                        release_at_entry(GemvSite::down));
                } else {
                    matvec_q8s_cuda(split_of(L.ffn_down), glu_q16(st), proj, E, F, stream,
                                    release_at_entry(GemvSite::down));
                }
                continue;
            }
            if (fused) {
                matvec_q8s_fused_cuda(split_of(L.wo), GemvX{GemvXFrom::q16, act_q16(st)}, x, true, E, L.wo.n_in,
                                      stream, fused_release_at_entry(GemvSite::wo));
                matvec_q8s_fused_cuda(split_of(L.ffn_gate), GemvX{GemvXFrom::rmsnorm, {}, x, L.ffn_norm, s.norm_eps},
                                      gate, false, 2 * F, L.ffn_gate.n_in, stream,
                                      fused_release_at_entry(GemvSite::gate_up));
                GemvX down_x{GemvXFrom::swiglu, {}, gate, up};
                if (!st.fused_swiglu) {
                    swiglu_q16_cuda(gate, up, F, act_q16(st), stream);
                    down_x = GemvX{GemvXFrom::q16, act_q16(st)};
                }
                matvec_q8s_fused_cuda(split_of(L.ffn_down), down_x, x, true, E, L.ffn_down.n_in, stream,
                                      fused_release_at_entry(GemvSite::down));
                continue;
            }
            matvec_decode(st, L.wo, L.wo.n_out, st.attn.data(), proj, GemvSite::wo);
        } else {
            matmul(st, L.wo, st.attn.data(), T, wo_down_out, "gemm o", attn_is_f16, gemm_adds);
        }
        rmsnorm_cuda(x, norm_add, L.ffn_norm, fused_prefill ? nullptr : xn, T, E, s.norm_eps, stream,
                     takes_q16(L.ffn_gate, T) || takes_q16(L.ffn_up, T) ? act_q16(st) : ActQ16{},
                     fused_prefill ? st.act_f16.data() : nullptr);
        op_times_mark("rmsnorm", stream);
        if (T == 1 && uses_glu_epilogue(st, L, F)) {
            // gate|up writes SwiGLU's quantized output itself; down reads it (gate stages the
            // epilogue's hand-over).
            matvec_q8s_swiglu_cuda(split_of(L.ffn_gate), act_q16(st), F, L.ffn_gate.n_in, glu_q16(st),
                                   handover_scratch(gate, st.glu_arrivals.data()), stream,
                                   release_at_entry(GemvSite::gate_up));
            matvec_q8s_cuda(split_of(L.ffn_down), glu_q16(st), proj, L.ffn_down.n_out, F, stream,
                            release_at_entry(GemvSite::down));
            continue;
        }
        if (T == 1 && L.fused_gate_up) {
            matvec_decode(st, L.ffn_gate, 2 * F, xn, gate, GemvSite::gate_up);  // gate|up contiguous
        } else if (T == 1) {
            matvec_decode(st, L.ffn_gate, F, xn, gate);
            matvec_decode(st, L.ffn_up, F, xn, up, GemvSite::gate_up);
        } else {
            // The codes GEMM's SwiGLU epilogue writes down's f16 input into gate's space (the f32
            // gate and up are never written); down then reads it there.
            if (chunk_ffn_takes_glu(fused_prefill, L, F)) {
                glu_act = matmul_glu(st, L.ffn_gate, 2 * F, T, reinterpret_cast<__half*>(gate));
                if (glu_act == nullptr) fail("forward: the SwiGLU GEMM declined a gate|up it takes");
            } else if (st.gate_up.size() < 2 * (size_t)T * F) {
                fail("forward: gate|up's memory was sized for the SwiGLU GEMM, which declined layer " +
                     std::to_string(il));
            }
            const GemmOutput gate_up_outs[2] = {{gate, F, F}, {up, F, F}};
            if (glu_act == nullptr &&
                !(L.fused_gate_up &&
                  matmul_merged(st, L.ffn_gate, 2 * F, xn, T, gate_up_outs, "gemm gate|up", fused_prefill))) {
                matmul(st, L.ffn_gate, xn, T, gate, "gemm gate", fused_prefill);
                matmul(st, L.ffn_up, xn, T, up, "gemm up", true);
            }
        }
        if (takes_q16(L.ffn_down, T)) {
            swiglu_q16_cuda(gate, up, F, act_q16(st), stream);  // the f32 product is never needed
            matvec_decode(st, L.ffn_down, L.ffn_down.n_out, gate, proj, GemvSite::down);
        } else if (glu_act != nullptr) {
            PrefillGemmScratch from_glu = st.prefill_gemm;
            from_glu.act_f16 = glu_act;
            const GemmOutput down_out{wo_down_out, L.ffn_down.n_out, L.ffn_down.n_out};
            if (!matmul_prefill_codes_cuda(L.ffn_down, T, std::span<const GemmOutput>(&down_out, 1), from_glu, stream,
                                           gemm_adds))
                fail("forward: the codes GEMM declined the down projection it takes");
            op_times_mark("gemm down", stream);
        } else {
            if (fused_prefill) {
                swiglu_f16_cuda(gate, up, st.act_f16.data(), (size_t)T * F, stream);  // the GEMM's input
            } else {
                swiglu_cuda(gate, up, gate, (size_t)T * F, stream);
            }
            op_times_mark("swiglu", stream);
            matmul(st, L.ffn_down, gate, T, wo_down_out, "gemm down", fused_prefill, gemm_adds);
        }
    }
    if (spilled) spill_forward_end(*cache.spill, spill_cursor, stream);
    // Head: the last FFN output joins the stream in the final norm; only the rows whose
    // logits are wanted are normed (the stream is dead after this).
    const uint32_t first = st.all_logits ? 0 : T - 1;
    const uint32_t n_out = T - first;
    if (norm_chain && head_in_norm_chain(m)) {
        matvec_q8s_normed_cuda(split_of(m.output), norm_q16(st), normed_x(1, attn_norm_partials), st.logits.data(),
                               m.output.n_out, m.output.n_in, stream, release_at_entry(GemvSite::head));
        op_times_mark("head", stream);
        return;
    }
    if (fused && m.output.q8_scales && matvec_q8s_fused_fits(m.output.n_in) &&
        reinterpret_cast<uintptr_t>(m.output_norm) % 16 == 0) {
        matvec_q8s_fused_cuda(split_of(m.output), GemvX{GemvXFrom::rmsnorm, {}, x, m.output_norm, s.norm_eps},
                              st.logits.data(), false, m.output.n_out, m.output.n_in, stream,
                              fused_release_at_entry(GemvSite::head));
        op_times_mark("head", stream);
        return;
    }
    const float* const head_add = decode_layer || fused || norm_add == nullptr ? nullptr : norm_add + (size_t)first * E;
    rmsnorm_cuda(x + (size_t)first * E, head_add, m.output_norm, xn,
                 n_out, E, s.norm_eps, stream, takes_q16(m.output, T) ? act_q16(st) : ActQ16{});
    if (takes_q16(m.output, T)) matvec_decode(st, m.output, m.output.n_out, xn, st.logits.data(), GemvSite::head);
    else matmul(st, m.output, xn, n_out, st.logits.data(), "head");
    op_times_mark("head", stream);
}

void enqueue_argmax(CudaForwardState& st, uint32_t n_vocab, uint32_t row) {
    argmax_cuda(st.logits.data() + (size_t)row * n_vocab, n_vocab, st.next_token.data(), st.argmax, st.stream);
    SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(st.host_token.data(), st.next_token.data(), sizeof(int32_t),
                                        cudaMemcpyDeviceToHost, st.stream));
}

void enqueue_decode(const CudaModel& m, CudaKvCache& cache, CudaForwardState& st, uint32_t pos, bool greedy) {
    if (pos >= cache.n_ctx) fail("decode: position " + std::to_string(pos) + " is past the context of " +
                                 std::to_string(cache.n_ctx));
    enqueue_forward(m, cache, st, 1, pos, st.next_token.data());
    if (greedy) enqueue_argmax(st, m.spec.n_vocab, 0);
}

}  // namespace

// The head may be in another layout: its norm then runs as a launch of its own (enqueue_forward).
bool decode_fusion_fits(const CudaModel& m) {
    const ModelSpec& s = m.spec;
    const auto fits = [](const CudaMatrix& w) { return w.q8_scales != nullptr && matvec_q8s_fused_fits(w.n_in); };
    const auto aligned = [](const float* p) { return p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    for (const CudaLayerWeights& L : m.layers) {
        if (!L.fused_qkv || !L.fused_gate_up || L.wo.n_out != s.n_embd || L.ffn_down.n_out != s.n_embd) return false;
        if (!aligned(L.attn_norm) || !aligned(L.ffn_norm)) return false;
        if (!fits(L.wq) || !fits(L.wo) || !fits(L.ffn_gate) || !fits(L.ffn_down)) return false;
    }
    return true;
}

CudaKvCache make_cuda_kv_cache(const CudaModel& m, uint32_t n_ctx, KvType k_type, KvType v_type,
                               uint32_t resident_cells, uint32_t spill_chunk_cells) {
    const ModelSpec& s = m.spec;
    for (KvType t : {k_type, v_type})
        if (t != KvType::f16 && !kv_type_fits(s, t))
            fail(std::string("KV type ") + kv_type_name(t) + " needs head dims that are multiples of 32");
    CudaKvCache c;
    c.n_ctx = n_ctx;
    c.n_resident = std::min(resident_cells, n_ctx);
    c.k_type = k_type;
    c.v_type = v_type;
    c.k_row_bytes = kv_row_bytes(k_type, (uint64_t)m.n_head_kv * s.head_dim_k);
    c.v_row_bytes = kv_row_bytes(v_type, (uint64_t)m.n_head_kv * s.head_dim_v);
    // Each layer's K and V start 256-byte aligned (the attention kernel needs 16).
    auto aligned = [](uint64_t n) { return (n + 255) / 256 * 256; };
    const uint64_t k_bytes = aligned(c.k_row_bytes * c.n_resident), v_bytes = aligned(c.v_row_bytes * c.n_resident);
    const uint64_t arena_bytes = (k_bytes + v_bytes) * s.n_layer;
    // Said in the user's terms before cudaMalloc's bare "out of memory".
    size_t free_bytes = 0, total_bytes = 0;
    SPILLWAY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (arena_bytes > free_bytes)
        fail("the KV cache of " + std::to_string(c.n_resident) + " resident cells (" + kv_type_name(k_type) + "/" +
             kv_type_name(v_type) + ") needs " + std::to_string(arena_bytes >> 20) + " MiB of VRAM and " +
             std::to_string(free_bytes >> 20) + " MiB are free: use a shorter context (-c, -d), a smaller KV type " +
             "(-ctk / -ctv q8_0 or q4_0), or let spillway plan it (--kv-auto-tier)");
    if (c.n_resident < n_ctx)  // after the check: a refused cache pins no host memory
        c.spill = make_cuda_kv_spill(s.n_layer, n_ctx, c.n_resident, c.k_row_bytes, c.v_row_bytes, spill_chunk_cells);
    c.arena = DeviceBuffer<uint8_t>(arena_bytes);
    for (uint32_t i = 0; i < s.n_layer; ++i) {
        c.k.push_back(c.arena.data() + (k_bytes + v_bytes) * i);
        c.v.push_back(c.arena.data() + (k_bytes + v_bytes) * i + k_bytes);
    }
    return c;
}

uint64_t cuda_kv_staging_bytes(const CudaKvCache& c) { return c.spill ? cuda_kv_spill_staging_bytes(*c.spill) : 0; }
uint64_t cuda_kv_spilled_bytes(const CudaKvCache& c) { return c.spill ? cuda_kv_spill_host_bytes(*c.spill) : 0; }

void fill_cuda_kv_cache_random(CudaKvCache& c, uint64_t seed, cudaStream_t stream) {
    auto units = [&](KvType t, uint64_t row_bytes, uint64_t cells) {
        return t == KvType::f16 ? row_bytes / 2 * cells : row_bytes / (t == KvType::q8_0 ? 34 : 18) * cells;
    };
    auto fill = [&](uint8_t* dst, KvType t, uint64_t row_bytes, uint64_t cells, uint64_t s) {
        const uint64_t n = units(t, row_bytes, cells);
        fill_kv_random_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, n, (int)t, s);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
    };
    for (size_t i = 0; i < c.k.size(); ++i) {
        fill(c.k[i], c.k_type, c.k_row_bytes, c.n_resident, seed + 2 * i);
        fill(c.v[i], c.v_type, c.v_row_bytes, c.n_resident, seed + 2 * i + 1);
    }
    if (!c.spill) return;
    // The host tail: chunk by chunk through the first staging buffer (stream-ordered, so
    // the buffer is free again once the D2H has run).
    CudaKvSpill& sp = *c.spill;
    for (size_t i = 0; i < sp.host_k.size(); ++i) {
        for (uint32_t first = 0, part = 0; first < sp.n_tail; first += sp.chunk_cells, ++part) {
            const uint32_t n = std::min(sp.chunk_cells, sp.n_tail - first);
            const uint64_t s = seed ^ (0x5111ull << 40) ^ ((uint64_t)i << 20) ^ ((uint64_t)part << 1);
            fill(sp.stage_k[0], c.k_type, c.k_row_bytes, n, s);
            fill(sp.stage_v[0], c.v_type, c.v_row_bytes, n, s + 1);
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(sp.host_k[i] + (uint64_t)first * c.k_row_bytes, sp.stage_k[0],
                                                (uint64_t)n * c.k_row_bytes, cudaMemcpyDeviceToHost, stream));
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(sp.host_v[i] + (uint64_t)first * c.v_row_bytes, sp.stage_v[0],
                                                (uint64_t)n * c.v_row_bytes, cudaMemcpyDeviceToHost, stream));
        }
    }
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
}

CudaForwardState::~CudaForwardState() {
    for (int i = 0; i < 2; ++i) {
        if (graph_exec[i]) cudaGraphExecDestroy(graph_exec[i]);
        if (graph_done[i]) cudaEventDestroy(graph_done[i]);
    }
    if (cublas) cublasDestroy(cublas);
    for (int i = 0; i < 2; ++i) {
        if (prefill_gemm.dequant_done[i]) cudaEventDestroy(prefill_gemm.dequant_done[i]);
        if (prefill_gemm.gemm_done[i]) cudaEventDestroy(prefill_gemm.gemm_done[i]);
    }
    if (prefill_gemm.side) cudaStreamDestroy(prefill_gemm.side);
    if (stream) cudaStreamDestroy(stream);
}

void init_cuda_forward_state(CudaForwardState& st, const CudaModel& m, uint32_t max_tokens, bool all_logits,
                             uint32_t n_ctx) {
    if (max_tokens == 0) fail("forward state: max_tokens must be at least 1");
    if (st.stream) fail("forward state: already initialised");
    const ModelSpec& s = m.spec;
    const AttentionShape shape = attention_shape(m);
    if (!attention_supports(shape))
        fail("CUDA engine: attention shape not supported (head dim 64 or 128, K and V dims equal, <= 16 query heads per KV head)");
    int dev = 0, sms = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    st.sm_count = (uint32_t)sms;
    st.max_tokens = max_tokens;
    st.all_logits = all_logits;
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
    SPILLWAY_CUDA_CHECK(cublasCreate(&st.cublas));
    SPILLWAY_CUDA_CHECK(cublasSetStream(st.cublas, st.stream));
    const size_t T = max_tokens;
    const size_t qd = (size_t)s.n_head * s.head_dim_k, kd = (size_t)m.n_head_kv * s.head_dim_k,
                 vd = (size_t)m.n_head_kv * s.head_dim_v, ad = (size_t)s.n_head * s.head_dim_v;
    st.x = DeviceBuffer<float>(T * s.n_embd);
    // With the fused prefill a chunk's norms write only the GEMMs' f16 input: f32 normed rows are
    // written for one decode token and the head's rows (the last one unless all logits are
    // wanted). 40 MiB less scratch at 2048-token chunks of the 14B shape.
    st.fused_prefill = prefill_fused_on();
    // Off by default: measured a net loss (session 28: the fused code in the plain instance
    // slowed every GEMV ~2.5%; session 29, as its own instance: norms still 1-2.3% slower than
    // the separate launches; down forming SwiGLU itself is slower still: every block redoes
    // 13824 exp and divisions; docs/perf-notes.md).
    const int fusion = lab_knob_choice("SPILLWAY_DECODE_FUSION", {"0", "norms", "all"});
    st.decode_fusion = fusion >= 1;
    st.fused_swiglu = fusion == 2;
    st.xn = DeviceBuffer<float>((st.fused_prefill && !all_logits ? 1 : T) * s.n_embd);
    // One token's wo / down output before its residual add (and the norm chain's hand-over
    // stage); a chunk's wo and down GEMMs add into x themselves.
    st.proj = DeviceBuffer<float>((prefill_gemm_adds_on() ? 1 : T) * s.n_embd);
    st.qkv = DeviceBuffer<float>(T * (qd + kd + vd));
    st.attn = DeviceBuffer<float>(T * ad);
    st.attn_lse = DeviceBuffer<float>(s.n_head);
    // gate|up's memory: one token's f32 gate and up; a chunk's too where some layer writes them
    // (no SwiGLU GEMM for it). Where every layer's chunk FFN takes the SwiGLU GEMM, only its f16
    // output (T n_ff halves, down's input) and, after it, the stream-K partials: a quarter of the
    // f32 pair plus 17 MiB, so that 4096-token chunks keep the scratch under 5% of a 64k f16 KV
    // (14B shape: 4096-token chunks 8k +6%, 64k +4.6% against 2048, session 46, H100).
    const bool chunks_write_f32_gate_up = max_tokens > 1 && !every_chunk_ffn_takes_glu(st.fused_prefill, m);
    const bool stream_k = max_tokens > 1 && !lab_knob("SPILLWAY_GEMM_STREAM_K", "0", "1");
    const size_t glu_floats = (T * s.n_ff / 2 + 3) / 4 * 4;  // the f16 SwiGLU, 16-byte aligned after it
    const size_t partial_need = stream_k ? prefill_gemm_q8s_partial_floats(st.sm_count) : 0;
    st.gate_up = DeviceBuffer<float>(chunks_write_f32_gate_up ? 2 * T * s.n_ff
                                                              : std::max<size_t>(2 * s.n_ff, glu_floats + partial_need));
    // The partials' part is dead while the codes GEMMs run (they write q|k|v and down's f16 input
    // from the SwiGLU epilogue sits in front of it): their tiles cut along k keep partials there.
    // Lab: SPILLWAY_GEMM_STREAM_K=0, whole tiles only (the tail wave unbalanced, as before
    // session 44).
    // Chunks too short for that (under ~300 tokens of the 14B shape) get 128 KiB per SM of their own.
    if (stream_k) {
        st.gemm_flags = DeviceBuffer<uint32_t>(st.sm_count);
        SPILLWAY_CUDA_CHECK(cudaMemset(st.gemm_flags.data(), 0, st.gemm_flags.bytes()));
        const size_t need = partial_need;
        const size_t partials_at = chunks_write_f32_gate_up ? T * s.n_ff : glu_floats;
        float* partials = st.gate_up.data() + partials_at;
        size_t partial_floats = st.gate_up.size() - partials_at;
        if (partial_floats < need) {
            st.gemm_partials = DeviceBuffer<float>(need);
            partials = st.gemm_partials.data();
            partial_floats = need;
        }
        st.prefill_gemm.gemm_workspace =
            GemmWorkspace{partials, partial_floats, st.gemm_flags.data(), (uint32_t)st.gemm_flags.size()};
    }
    st.logits = DeviceBuffer<float>((all_logits ? T : 1) * (size_t)s.n_vocab);
    // Split counts are not monotonic in the cell count (the int_dot plan rounds cells per
    // split to its chunk): a range shorter than n_ctx (a spilled cache's window or chunk) can
    // take more splits. Size for the most any range can take, reached at a huge count.
    const size_t ws = std::max(attention_workspace_bytes(shape, n_ctx, st.sm_count),
                               attention_workspace_bytes(shape, 1u << 30, st.sm_count));
    st.attn_workspace = DeviceBuffer<uint8_t>(std::max<size_t>(256, ws));
    if (max_tokens > 1) {
        st.act_f16 = DeviceBuffer<__half>(T * std::max({(size_t)s.n_embd, (size_t)s.n_ff, ad}));
        st.prefill_gemm.greedy_tiles = lab_knob("SPILLWAY_PREFILL_TILES", "greedy", "balanced");
        // The matrices a chunk multiplies through a tile (f16 ones are read in place, split Q8_0
        // ones on Hopper as codes; the head only when every row's logits are wanted, else its
        // one row takes the matvec).
        std::vector<std::pair<uint32_t, uint32_t>> tiled;
        const auto add = [&](const CudaMatrix& w) {
            if (w.type != GgmlType::F16 && !prefill_gemm_reads_codes(w)) tiled.emplace_back(w.n_out, w.n_in);
        };
        for (const CudaLayerWeights& L : m.layers)
            for (const CudaMatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) add(*w);
        if (all_logits) add(m.output);
        const size_t tile_elems = prefill_tile_elems(tiled, kWeightTileElems, st.prefill_gemm.greedy_tiles);
        st.w_f16 = DeviceBuffer<__half>(std::max<size_t>(tile_elems, 1));
        st.prefill_gemm.act_f16 = st.act_f16.data();
        st.prefill_gemm.tiles[0] = st.w_f16.data();
        st.prefill_gemm.tile_elems = st.w_f16.size();
        if (tile_elems > 0 && prefill_overlaps_dequant(max_tokens)) {
            st.w_f16_next = DeviceBuffer<__half>(st.w_f16.size());
            st.prefill_gemm.tiles[1] = st.w_f16_next.data();
            SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&st.prefill_gemm.side, cudaStreamNonBlocking));
            for (int i = 0; i < 2; ++i) {
                SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&st.prefill_gemm.dequant_done[i], cudaEventDisableTiming));
                SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&st.prefill_gemm.gemm_done[i], cudaEventDisableTiming));
            }
        }
    }
    st.tokens = DeviceBuffer<int32_t>(T);
    st.positions = DeviceBuffer<int32_t>(T);
    // Knobs read once here, not per step (SPILLWAY_ROPE_TABLE=0: cos / sin per head and layer;
    // SPILLWAY_PREFILL_FUSED=0, above: f32 producer outputs, conversion, bias / RoPE / K/V passes).
    if (qkv_post_fits(m) && !lab_knob("SPILLWAY_ROPE_TABLE", "0", "1"))
        st.rope_cs = DeviceBuffer<float2>(T * (m.rope_dev.n_dims / 2));
    st.next_token = DeviceBuffer<int32_t>(1);
    st.argmax = make_argmax_scratch();
    // SPILLWAY_GLU_EPILOGUE=0 (lab): SwiGLU as a launch of its own between gate|up and down.
    static const bool glu_epilogue_off = lab_knob("SPILLWAY_GLU_EPILOGUE", "0", "1");
    if (!glu_epilogue_off && std::any_of(m.layers.begin(), m.layers.end(),
                                         [&](const CudaLayerWeights& L) { return glu_epilogue_takes(L, s.n_ff); })) {
        st.glu_q16 = DeviceBuffer<int16_t>(s.n_ff);
        st.glu_q16_scale = DeviceBuffer<float>(s.n_ff / 32);
        st.glu_arrivals = DeviceBuffer<uint32_t>(s.n_ff / 32);
        // On the state's stream, which every launch of the epilogue uses.
        SPILLWAY_CUDA_CHECK(cudaMemsetAsync(st.glu_arrivals.data(), 0, st.glu_arrivals.bytes(), st.stream));
    }
    // SPILLWAY_NORM_CHAIN=0 (lab): every RMSNorm a launch of its own.
    static const bool norm_chain_off = lab_knob("SPILLWAY_NORM_CHAIN", "0", "1");
    if (!norm_chain_off && st.glu_arrivals.size() > 0 && norm_chain_takes(m)) {
        st.norm_q16 = DeviceBuffer<int16_t>(s.n_embd);
        st.norm_q16_scale = DeviceBuffer<float>(s.n_embd / 32);
        st.norm_arrivals = DeviceBuffer<uint32_t>(s.n_embd / 32);
        for (auto& p : st.norm_partials) p = DeviceBuffer<float>(kNormOutMaxBlocks);
        if (qkv_epilogue_on()) {
            const size_t kd = (size_t)m.n_head_kv * s.head_dim_k;
            st.qkv_kv_stage = DeviceBuffer<float>(2 * kd);
            st.qkv_kv_arrivals = DeviceBuffer<uint32_t>(kd / 32);
            SPILLWAY_CUDA_CHECK(cudaMemsetAsync(st.qkv_kv_arrivals.data(), 0, st.qkv_kv_arrivals.bytes(), st.stream));
        }
        SPILLWAY_CUDA_CHECK(cudaMemsetAsync(st.norm_arrivals.data(), 0, st.norm_arrivals.bytes(), st.stream));
    }
    {
        const size_t widest_in = std::max({(size_t)s.n_embd, (size_t)s.n_ff, ad});
        st.act_q16 = DeviceBuffer<int16_t>(widest_in);
        st.act_q16_scale = DeviceBuffer<float>(std::max<size_t>(4, widest_in / 32));
    }
    // SPILLWAY_DECODE_LAYER=1 (lab): the persistent layer kernel; off by default (session 15:
    // 180 vs 191 tok/s at d=0, docs/perf-notes.md).
    static const bool decode_layer_on = lab_knob("SPILLWAY_DECODE_LAYER", "1", "0");
    set_cuda_decode_layer(st, m, decode_layer_on);
    st.host_token = PinnedBuffer(sizeof(int32_t));
    for (auto& e : st.graph_done) SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

bool set_cuda_decode_layer(CudaForwardState& st, const CudaModel& m, bool on) {
    if (st.graph_exec[0] != nullptr || st.graph_exec[1] != nullptr)
        fail("set_cuda_decode_layer: the state already has decode graphs");
    if (!on || !decode_layer_fits(m)) {
        st.decode_scratch = DeviceBuffer<uint8_t>();
        return false;
    }
    if (st.decode_scratch.size() == 0) {
        st.decode_scratch = DeviceBuffer<uint8_t>(decode_layer_scratch_bytes());
        // On the state's own stream, which every launch of the kernel uses (a plain memset runs
        // on the legacy stream, which a non-blocking stream does not wait for).
        SPILLWAY_CUDA_CHECK(cudaMemsetAsync(st.decode_scratch.data(), 0, st.decode_scratch.bytes(), st.stream));
    }
    return true;
}

uint32_t cuda_long_prompt_chunk(const CudaModel& m) {
    return every_chunk_ffn_takes_glu(prefill_fused_on(), m) ? 4096 : 2048;
}

std::vector<ScratchPart> cuda_forward_scratch_parts(const CudaForwardState& st) {
    std::vector<ScratchPart> all = {
            {"x", st.x.bytes()},
            {"xn", st.xn.bytes()},
            {"proj", st.proj.bytes()},
            {"qkv", st.qkv.bytes()},
            {"attn", st.attn.bytes()},
            {"attn_lse", st.attn_lse.bytes()},
            {"gate_up", st.gate_up.bytes()},
            {"logits", st.logits.bytes()},
            {"attn_workspace", st.attn_workspace.bytes()},
            {"act_f16", st.act_f16.bytes()},
            {"w_f16", st.w_f16.bytes()},
            {"w_f16_next", st.w_f16_next.bytes()},
            {"tokens", st.tokens.bytes()},
            {"positions", st.positions.bytes()},
            {"rope_cs", st.rope_cs.bytes()},
            {"next_token", st.next_token.bytes()},
            {"argmax", st.argmax.values.bytes() + st.argmax.indices.bytes() + st.argmax.arrivals.bytes()},
            {"act_q16", st.act_q16.bytes()},
            {"gemm_flags", st.gemm_flags.bytes()},
            {"gemm_partials", st.gemm_partials.bytes()},
            {"act_q16_scale", st.act_q16_scale.bytes()},
            {"spill_lse", st.spill_lse.bytes()},
            {"spill_tail_out", st.spill_tail_out.bytes()},
            {"spill_tail_lse", st.spill_tail_lse.bytes()},
            {"spill_chunk_out", st.spill_chunk_out.bytes()},
            {"spill_chunk_lse", st.spill_chunk_lse.bytes()},
            {"spill_workspace", st.spill_workspace.bytes()},
            {"prefill_k_f16", st.prefill_k_f16.bytes()},
            {"prefill_v_f16", st.prefill_v_f16.bytes()},
            {"prefill_piece_out", st.prefill_piece_out.bytes()},
            {"prefill_piece_lse", st.prefill_piece_lse.bytes()},
            {"prefill_lse", st.prefill_lse.bytes()},
            {"decode_scratch", st.decode_scratch.bytes()},
            {"glu_q16", st.glu_q16.bytes()},
            {"glu_q16_scale", st.glu_q16_scale.bytes()},
            {"glu_arrivals", st.glu_arrivals.bytes()},
            {"norm_q16", st.norm_q16.bytes()},
            {"norm_q16_scale", st.norm_q16_scale.bytes()},
            {"norm_arrivals", st.norm_arrivals.bytes()},
            {"norm_partials[0]", st.norm_partials[0].bytes()},
            {"norm_partials[1]", st.norm_partials[1].bytes()},
            {"qkv_kv_stage", st.qkv_kv_stage.bytes()},
            {"qkv_kv_arrivals", st.qkv_kv_arrivals.bytes()}};
    std::erase_if(all, [](const ScratchPart& part) { return part.bytes == 0; });
    return all;
}

uint64_t cuda_forward_scratch_bytes(const CudaForwardState& st) {
    uint64_t sum = 0;
    for (const ScratchPart& part : cuda_forward_scratch_parts(st)) sum += part.bytes;
    return sum;
}

// Spill scratch is allocated on the first forward over a spilled cache: an unspilled engine
// holds none, and allocations are not allowed under graph capture.
static void reserve_spill_scratch(const CudaModel& m, const CudaKvCache& cache, CudaForwardState& st) {
    if (!cache.spill || st.spill_lse.size() > 0) return;
    const ModelSpec& s = m.spec;
    st.spill_lse = DeviceBuffer<float>((size_t)st.max_tokens * s.n_head);
    st.spill_tail_out = DeviceBuffer<float>((size_t)st.max_tokens * s.n_head * s.head_dim_v);
    st.spill_tail_lse = DeviceBuffer<float>((size_t)st.max_tokens * s.n_head);
    st.spill_chunk_out = DeviceBuffer<float>((size_t)st.max_tokens * s.n_head * s.head_dim_v);
    st.spill_chunk_lse = DeviceBuffer<float>((size_t)st.max_tokens * s.n_head);
    // A chunk never has more cells than the context the state was made for.
    st.spill_workspace = DeviceBuffer<uint8_t>(st.attn_workspace.size());
}

// The f16 pieces of a prefill over a quantized cache, reserved on a prefill forward (never
// under graph capture: decode steps are one token) for what this cache needs: one state may
// serve caches of several tier pairs and sizes in turn (`spillway bench -ctk f16,q8_0`), so a
// missing operand's buffer or a piece shorter than a larger cache wants is (re)allocated. A
// cache that fits one piece needs no partial of its own to merge.
static void reserve_prefill_kv_f16(const CudaModel& m, const CudaKvCache& cache, CudaForwardState& st,
                                   uint32_t n_tokens) {
    if (n_tokens < 2 || (cache.k_type == KvType::f16 && cache.v_type == KvType::f16)) return;
    static const bool off = lab_knob("SPILLWAY_PREFILL_KV_F16", "0", "1");
    if (off) return;
    const ModelSpec& s = m.spec;
    const uint32_t k_values = m.n_head_kv * s.head_dim_k, v_values = m.n_head_kv * s.head_dim_v;
    const uint32_t full = prefill_kv_f16_piece_cells(std::max(k_values, v_values));
    uint32_t piece = std::max(st.prefill_kv_f16.piece_cells, std::min(full, std::max(cache.n_ctx, 1u)));
    const bool k_quant = cache.k_type != KvType::f16, v_quant = cache.v_type != KvType::f16;
    // The FFN's gate|up rows are dead from the down projection of one layer to the gate / up
    // projections of the next, so attention can keep its partials and pieces there (stream
    // order: nothing else touches them meanwhile). Where the SwiGLU GEMM runs, gate|up holds
    // only its f16 output (4096-token chunks of the 14B shape: 108 MiB), which takes the
    // partials (81 MiB) but pieces of only ~3.3k cells instead of 16k: five times the pieces
    // and merges cost a 64k prefill over a q8_0 cache 2.6% (session 49, H100). So the pieces
    // go there only at their full length (or the cache's), else into 64 MiB of their own.
    const size_t merge_floats = (size_t)st.max_tokens * s.n_head * (s.head_dim_v + 2);
    const size_t halves_per_cell = (k_quant ? k_values : 0) + (v_quant ? v_values : 0);
    const bool partials_alias = st.gate_up.bytes() > 4 * merge_floats + 256;
    const size_t avail_bytes = partials_alias ? st.gate_up.bytes() - 4 * merge_floats - 256 : 0;
    const uint64_t fit = avail_bytes / (2 * halves_per_cell) / 128 * 128;
    // Partial out, partial lse, running lse (floats), then the K and V pieces (16-byte aligned).
    float* const piece_out = st.gate_up.data();
    float* const piece_lse = piece_out + (size_t)st.max_tokens * s.n_head * s.head_dim_v;
    float* const lse = piece_lse + (size_t)st.max_tokens * s.n_head;
    if (fit >= piece) {
        const uintptr_t halves_at = (reinterpret_cast<uintptr_t>(lse + (size_t)st.max_tokens * s.n_head) + 15) & ~uintptr_t(15);
        __half* k = reinterpret_cast<__half*>(halves_at);
        __half* v = k + (k_quant ? (size_t)piece * k_values : 0);
        st.prefill_kv_f16 = PrefillKvF16Scratch{k_quant ? k : nullptr, v_quant ? v : nullptr, piece, piece_out,
                                                piece_lse, lse};
        return;
    }
    if (k_quant && st.prefill_k_f16.size() < (size_t)piece * k_values)
        st.prefill_k_f16 = DeviceBuffer<__half>((size_t)piece * k_values);
    if (v_quant && st.prefill_v_f16.size() < (size_t)piece * v_values)
        st.prefill_v_f16 = DeviceBuffer<__half>((size_t)piece * v_values);
    if (!partials_alias && cache.n_ctx > piece && st.prefill_lse.size() == 0) {
        st.prefill_piece_out = DeviceBuffer<float>((size_t)st.max_tokens * s.n_head * s.head_dim_v);
        st.prefill_piece_lse = DeviceBuffer<float>((size_t)st.max_tokens * s.n_head);
        st.prefill_lse = DeviceBuffer<float>((size_t)st.max_tokens * s.n_head);
    }
    auto data_or_null = [](auto& b) { return b.size() ? b.data() : nullptr; };
    st.prefill_kv_f16 = PrefillKvF16Scratch{data_or_null(st.prefill_k_f16),
                                            data_or_null(st.prefill_v_f16),
                                            piece,
                                            partials_alias ? piece_out : data_or_null(st.prefill_piece_out),
                                            partials_alias ? piece_lse : data_or_null(st.prefill_piece_lse),
                                            partials_alias ? lse : data_or_null(st.prefill_lse)};
}

void forward_cuda(const CudaModel& m, CudaKvCache& cache, CudaForwardState& st, uint32_t n_tokens, uint32_t pos0) {
    if (n_tokens == 0) return;
    reserve_spill_scratch(m, cache, st);
    if (n_tokens > st.max_tokens) fail("forward_cuda: chunk larger than the state was made for");
    if ((uint64_t)pos0 + n_tokens > cache.n_ctx)
        fail("forward_cuda: positions up to " + std::to_string(pos0 + n_tokens) + " exceed the context of " +
             std::to_string(cache.n_ctx));
    reserve_prefill_kv_f16(m, cache, st, n_tokens);  // checked input only: a bad call allocates nothing
    // SPILLWAY_OP_TIMES=1 (op_times.h): a prefill chunk's op groups timed.
    const bool timed = n_tokens > 1 && op_times_enabled();
    if (timed) op_times_begin(st.stream);
    try {
        enqueue_forward(m, cache, st, n_tokens, pos0, nullptr);
    } catch (...) {
        if (timed) op_times_cancel(st.stream);
        throw;
    }
    if (timed) op_times_end(st.stream);
}

void forward_cuda_tokens(const CudaModel& m, CudaKvCache& cache, CudaForwardState& st, const int32_t* host_tokens,
                         uint32_t n_tokens, uint32_t pos0) {
    if (n_tokens > st.max_tokens) fail("forward_cuda: chunk larger than the state was made for");
    for (uint32_t i = 0; i < n_tokens; ++i)
        if (host_tokens[i] < 0 || (uint32_t)host_tokens[i] >= m.spec.n_vocab)
            fail("token id " + std::to_string(host_tokens[i]) + " outside the vocabulary of " +
                 std::to_string(m.spec.n_vocab));
    SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(st.tokens.data(), host_tokens, n_tokens * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, st.stream));
    forward_cuda(m, cache, st, n_tokens, pos0);
}

void argmax_logits_cuda(CudaForwardState& st, uint32_t n_vocab, uint32_t row) { enqueue_argmax(st, n_vocab, row); }

void prepare_decode_graph(const CudaModel& m, CudaKvCache& cache, CudaForwardState& st, uint32_t pos, bool greedy) {
    const int slot = (int)(pos & 1);
    reserve_spill_scratch(m, cache, st);
    // Launchers configure their kernels on first use (shared-memory limits, occupancy
    // queries); do that outside capture with one direct forward. It writes the same K/V
    // cell the captured step will write again with the same input, so it is harmless.
    bool& warmed = st.warmed[(int)cache.k_type][(int)cache.v_type];
    if (!warmed) {
        enqueue_forward(m, cache, st, 1, pos, st.next_token.data());
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
        warmed = true;
    }
    // This executable last ran two steps ago; it must be finished before it is changed.
    if (st.graph_launched[slot]) SPILLWAY_CUDA_CHECK(cudaEventSynchronize(st.graph_done[slot]));
    cudaGraph_t graph = nullptr;
    SPILLWAY_CUDA_CHECK(cudaStreamBeginCapture(st.stream, cudaStreamCaptureModeThreadLocal));
    try {
        enqueue_decode(m, cache, st, pos, greedy);
    } catch (...) {
        cudaStreamEndCapture(st.stream, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
    }
    SPILLWAY_CUDA_CHECK(cudaStreamEndCapture(st.stream, &graph));
    if (st.graph_exec[slot]) {
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(st.graph_exec[slot], graph, &info) != cudaSuccess) {
            // Topology changed (e.g. attention went from one split to several): rebuild.
            (void)cudaGetLastError();
            SPILLWAY_CUDA_CHECK(cudaGraphExecDestroy(st.graph_exec[slot]));
            st.graph_exec[slot] = nullptr;
        }
    }
    if (!st.graph_exec[slot]) {
        size_t free_before = 0, free_after = 0, total = 0;
        SPILLWAY_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
        SPILLWAY_CUDA_CHECK(cudaGraphInstantiate(&st.graph_exec[slot], graph, 0));
        SPILLWAY_CUDA_CHECK(cudaGraphUpload(st.graph_exec[slot], st.stream));
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
        SPILLWAY_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
        st.graph_bytes = std::max(st.graph_bytes, free_before > free_after ? free_before - free_after : 0);
        ++st.graph_rebuilds;
    }
    SPILLWAY_CUDA_CHECK(cudaGraphDestroy(graph));
    st.graph_pos[slot] = pos;
    st.graph_greedy[slot] = greedy;
}

void decode_step_cuda(const CudaModel& m, CudaKvCache& cache, CudaForwardState& st, uint32_t pos, bool greedy,
                      bool use_graph) {
    reserve_spill_scratch(m, cache, st);
    if (!use_graph) {
        enqueue_decode(m, cache, st, pos, greedy);
        return;
    }
    const int slot = (int)(pos & 1);
    if (st.graph_pos[slot] != pos || st.graph_greedy[slot] != greedy || !st.graph_exec[slot])
        prepare_decode_graph(m, cache, st, pos, greedy);
    SPILLWAY_CUDA_CHECK(cudaGraphLaunch(st.graph_exec[slot], st.stream));
    SPILLWAY_CUDA_CHECK(cudaEventRecord(st.graph_done[slot], st.stream));
    st.graph_launched[slot] = true;
    st.graph_pos[slot] = UINT32_MAX;  // consumed: the next use of this slot captures anew
}

}  // namespace spillway
