// Weights on the GPU: plan one arena (offsets per tensor), then fill it from the host model
// through pinned staging buffers, or with random values generated on the device.
#include "engine/cuda/cuda_model.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "common/error.h"
#include "common/log.h"
#include "common/progress.h"
#include "engine/cpu/cpu_model.h"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/matvec_q8s.cuh"
#include "gguf/gguf.h"
#include "model/presets.h"

namespace spillway {
namespace {

constexpr uint64_t kAlign = 256;
enum class Init : int { matrix = 0, norm = 1, bias = 2 };

// One tensor's place in the arena and where its bytes come from.
struct Slot {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    GgmlType type = GgmlType::F32;
    Init init = Init::matrix;
    const void* host = nullptr;  // upload source (null for synthetic)
};

struct ArenaPlan {
    uint64_t size = 0;
    std::vector<Slot> slots;
    // Places a tensor; `contiguous` puts it right after the previous one (fused matrices).
    uint64_t add(uint64_t bytes, GgmlType type, Init init, const void* host, bool contiguous = false) {
        if (!contiguous) size = (size + kAlign - 1) / kAlign * kAlign;
        const uint64_t off = size;
        slots.push_back({off, bytes, type, init, host});
        size += bytes;
        return off;
    }
};

uint64_t row_bytes_of(GgmlType type, uint32_t n_in) {
    auto rb = ggml_row_bytes(type, n_in);
    if (!rb) fail(std::string("CUDA model: a row of ") + std::to_string(n_in) + " values is not whole blocks of " +
                  ggml_type_name(type));
    return *rb;
}

// Shapes and sources of every tensor, independent of where the bytes come from.
struct MatrixSource {
    GgmlType type;
    const void* host;
};
struct LayerSources {
    const float *attn_norm = nullptr, *ffn_norm = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr;
    MatrixSource wq, wk, wv, wo, gate, up, down;
};
struct ModelSources {
    MatrixSource token_embd, output;
    bool tied = false;
    const float* output_norm = nullptr;
    bool has_bias = false;
    std::vector<LayerSources> layers;
};

// Lays out the arena and binds the CudaModel's pointers to offsets (relative to base 0);
// `rebase` turns them into device pointers once the arena exists.
ArenaPlan plan_model(CudaModel& m, const ModelSources& src) {
    const ModelSpec& s = m.spec;
    const uint32_t q_dim = s.n_head * s.head_dim_k, k_dim = m.n_head_kv * s.head_dim_k,
                   v_dim = m.n_head_kv * s.head_dim_v, attn_dim = s.n_head * s.head_dim_v;
    ArenaPlan plan;
    auto as_ptr = [](uint64_t off) { return reinterpret_cast<const uint8_t*>(off); };
    auto matrix = [&](const MatrixSource& ms, uint32_t n_in, uint32_t n_out, bool contiguous) {
        if (!cuda_weight_type_supported(ms.type))
            fail(std::string("CUDA engine: weight type ") + ggml_type_name(ms.type) +
                 " is not supported (f16, bf16, q8_0)");
        CudaMatrix w;
        w.type = ms.type;
        w.n_in = n_in;
        w.n_out = n_out;
        w.row_bytes = row_bytes_of(ms.type, n_in);
        w.data = as_ptr(plan.add(w.bytes(), ms.type, Init::matrix, ms.host, contiguous));
        return w;
    };
    auto vec = [&](const float* host, uint32_t n, Init init, bool contiguous = false) {
        return reinterpret_cast<const float*>(plan.add((uint64_t)n * 4, GgmlType::F32, init, host, contiguous));
    };
    // The embedding may be f32 (only rows are read from it) unless it is also the head.
    {
        const MatrixSource& e = src.token_embd;
        if (!cuda_weight_type_supported(e.type) && !(e.type == GgmlType::F32 && !src.tied))
            fail(std::string("CUDA engine: token_embd type ") + ggml_type_name(e.type) + " is not supported");
        m.token_embd.type = e.type;
        m.token_embd.n_in = s.n_embd;
        m.token_embd.n_out = s.n_vocab;
        m.token_embd.row_bytes = row_bytes_of(e.type, s.n_embd);
        m.token_embd.data = as_ptr(plan.add(m.token_embd.bytes(), e.type, Init::matrix, e.host));
    }
    m.output = src.tied ? m.token_embd : matrix(src.output, s.n_embd, s.n_vocab, false);
    m.output_norm = vec(src.output_norm, s.n_embd, Init::norm);
    m.layers.resize(s.n_layer);
    for (uint32_t i = 0; i < s.n_layer; ++i) {
        const LayerSources& l = src.layers[i];
        CudaLayerWeights& L = m.layers[i];
        L.attn_norm = vec(l.attn_norm, s.n_embd, Init::norm);
        L.ffn_norm = vec(l.ffn_norm, s.n_embd, Init::norm);
        L.fused_qkv = l.wq.type == l.wk.type && l.wq.type == l.wv.type;
        L.wq = matrix(l.wq, s.n_embd, q_dim, false);
        L.wk = matrix(l.wk, s.n_embd, k_dim, L.fused_qkv);
        L.wv = matrix(l.wv, s.n_embd, v_dim, L.fused_qkv);
        L.wo = matrix(l.wo, attn_dim, s.n_embd, false);
        L.fused_gate_up = l.gate.type == l.up.type;
        L.ffn_gate = matrix(l.gate, s.n_embd, s.n_ff, false);
        L.ffn_up = matrix(l.up, s.n_embd, s.n_ff, L.fused_gate_up);
        L.ffn_down = matrix(l.down, s.n_ff, s.n_embd, false);
        if (src.has_bias) {
            L.bqkv = vec(l.bq, q_dim, Init::bias);
            vec(l.bk, k_dim, Init::bias, true);
            vec(l.bv, v_dim, Init::bias, true);
        }
    }
    return plan;
}

void rebase(CudaModel& m) {
    uint8_t* base = m.arena.data();
    auto at = [&](const float* off) { return reinterpret_cast<const float*>(base + reinterpret_cast<uintptr_t>(off)); };
    auto fix_m = [&](CudaMatrix& w) { w.data = base + reinterpret_cast<uintptr_t>(w.data); };
    const bool tied = m.output.data == m.token_embd.data;
    fix_m(m.token_embd);
    if (tied) m.output = m.token_embd;
    else fix_m(m.output);
    m.output_norm = at(m.output_norm);
    for (CudaLayerWeights& L : m.layers) {
        for (CudaMatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) fix_m(*w);
        L.attn_norm = at(L.attn_norm);
        L.ffn_norm = at(L.ffn_norm);
        // Offset 0 holds the embedding, so a null bias offset means "no bias".
        if (L.bqkv) L.bqkv = at(L.bqkv);
    }
}

void upload_rope(CudaModel& m) {
    const uint32_t half = m.rope.n_dims / 2;
    m.rope_inv_freq = DeviceBuffer<double>(std::max(1u, half));
    m.rope_ramp_mix = DeviceBuffer<float>(std::max(1u, half));
    if (half > 0) {
        SPILLWAY_CUDA_CHECK(cudaMemcpy(m.rope_inv_freq.data(), m.rope.inv_freq.data(), half * sizeof(double),
                                       cudaMemcpyHostToDevice));
        SPILLWAY_CUDA_CHECK(cudaMemcpy(m.rope_ramp_mix.data(), m.rope.ramp_mix.data(), half * sizeof(float),
                                       cudaMemcpyHostToDevice));
    }
    m.rope_dev.neox = m.rope.type == RopeType::neox;
    m.rope_dev.n_dims = m.rope.n_dims;
    m.rope_dev.inv_freq = m.rope_inv_freq.data();
    const bool any_mix = std::any_of(m.rope.ramp_mix.begin(), m.rope.ramp_mix.end(), [](float x) { return x != 0; });
    m.rope_dev.ramp_mix = any_mix ? m.rope_ramp_mix.data() : nullptr;
    m.rope_dev.freq_scale = m.rope.freq_scale;
    m.rope_dev.mscale = m.rope.mscale;
}

void check_heads(CudaModel& m) {
    const ModelSpec& s = m.spec;
    if (s.layers.size() != s.n_layer || s.n_layer == 0) fail("CUDA model: layer count mismatch");
    m.n_head_kv = s.layers[0].n_head_kv;
    for (const LayerSpec& l : s.layers)
        if (l.n_head != s.n_head || l.n_head_kv != m.n_head_kv) fail("CUDA model: per-layer head counts must not vary");
    if (m.n_head_kv == 0 || s.n_head % m.n_head_kv != 0) fail("CUDA model: n_head must be a multiple of n_head_kv");
}

// splitmix64: a counter-based generator, so every value depends only on (seed, index).
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
__device__ __forceinline__ float uniform_pm1(uint64_t r) {  // [-1, 1)
    return (float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Fills `n_units` units of one tensor: a Q8_0 block, or one f16 / bf16 / f32 value.
// Matrices: std ~0.02 (q8_0: scale 0.02/73 over uniform int8 in [-127, 127]); norms ~1;
// biases small. Values only need to be finite and of realistic magnitude.
__global__ void fill_random_kernel(uint8_t* dst, uint64_t n_units, int type, int init, uint64_t seed) {
    for (uint64_t u = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; u < n_units; u += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = mix64(seed ^ (u * 0xD1B54A32D192ED03ull));
        if (type == (int)GgmlType::Q8_0) {
            uint8_t* b = dst + u * 34;
            const __half d = __float2half_rn(0.02f / 73.0f);
            *reinterpret_cast<__half*>(b) = d;  // blocks start at even offsets
            uint64_t bits = r;
            for (int i = 0; i < 32; ++i) {
                if (i % 8 == 0 && i) bits = mix64(bits + i);
                int q = (int)(bits >> (8 * (i % 8)) & 0xFF) - 128;
                b[2 + i] = (uint8_t)(int8_t)max(q, -127);
            }
            continue;
        }
        const float x = uniform_pm1(r);
        const float v = init == (int)Init::norm ? 1.0f + 0.087f * x : 0.0346f * x;  // std 0.05 / 0.02
        if (type == (int)GgmlType::F16) reinterpret_cast<__half*>(dst)[u] = __float2half_rn(v);
        else if (type == (int)GgmlType::BF16) reinterpret_cast<uint16_t*>(dst)[u] = (uint16_t)(__float_as_uint(v) >> 16);
        else reinterpret_cast<float*>(dst)[u] = v;
    }
}

// The split layout for the Q8_0 matrices the split-layout GEMV takes (cuda_model.h). One
// group (a matrix, or matrices stored back to back that decode reads as one) is converted in
// place in row chunks, in order: a chunk's GGUF bytes go to a scratch buffer, its codes to
// the group's start + r0 * n_in (which ends before the next chunk's GGUF bytes begin, as a
// row of codes is shorter than a GGUF row), its scales to a second scratch buffer that lands
// behind all the codes at the end. Scratch: one chunk (<= 64 MiB) + the group's scales.
// On by default since session 27, when the split-layout GEMV became the sweep kernel (a block
// per contiguous row range, its warps interleaved over it in address order, row pairs per
// step; 14B shape, tok/s in one call, GGUF q16x -> split sweep1: f16 d = 0 205.9 -> 214.5,
// 8k 184.0 -> 191.6; sweep1 -> sweep1r2 another +4.5-8.6%; docs/perf-notes.md). With session
// 23's w8u4 kernel the split layout had gained only at d = 0 and lost up to 2% at depth.
constexpr uint32_t kDefaultSplitSites = 31;

struct SplitGroup {
    std::vector<CudaMatrix*> members;  // back to back, same n_in
    uint32_t rows = 0;
};

void convert_group_to_split(const SplitGroup& g, uint8_t* scratch, size_t scratch_bytes, uint16_t* scale_scratch,
                            cudaStream_t stream) {
    CudaMatrix& first = *g.members.front();
    const uint32_t n_in = first.n_in;
    const uint64_t row_bytes = first.row_bytes;
    uint8_t* base = const_cast<uint8_t*>(first.data);
    const uint32_t chunk_rows = (uint32_t)std::max<uint64_t>(1, scratch_bytes / row_bytes);
    for (uint32_t r0 = 0; r0 < g.rows; r0 += chunk_rows) {
        const uint32_t n = std::min(chunk_rows, g.rows - r0);
        SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(scratch, base + (uint64_t)r0 * row_bytes, (uint64_t)n * row_bytes,
                                            cudaMemcpyDeviceToDevice, stream));
        q8_0_to_split_cuda(scratch, n, n_in,
                           Q8Split{reinterpret_cast<int8_t*>(base + (uint64_t)r0 * n_in),
                                   scale_scratch + (uint64_t)r0 * (n_in / 32)},
                           stream);
    }
    uint8_t* scales = base + (uint64_t)g.rows * n_in;
    SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(scales, scale_scratch, (uint64_t)g.rows * (n_in / 32) * 2,
                                        cudaMemcpyDeviceToDevice, stream));
    uint32_t row = 0;
    for (CudaMatrix* w : g.members) {
        w->data = base + (uint64_t)row * n_in;
        w->q8_scales = reinterpret_cast<const uint16_t*>(scales) + (uint64_t)row * (n_in / 32);
        row += w->n_out;
    }
}

// Which matrices (a bit per decode site) take the split layout.
enum class SplitSite : uint32_t { qkv = 1, wo = 2, gate_up = 4, down = 8, head = 16 };

void convert_q8_0_to_split(CudaModel& m) {
    const uint32_t sites = lab_knob_uint("SPILLWAY_Q8_SPLIT", kDefaultSplitSites, 31);
    auto takes = [](const CudaMatrix& w) { return w.type == GgmlType::Q8_0 && matvec_q8s_fits(w.n_in); };
    std::vector<SplitGroup> groups;
    auto add_at = [&](SplitSite site, std::vector<CudaMatrix*> members) {
        if ((sites & (uint32_t)site) == 0) return;
        for (CudaMatrix* w : members)
            if (!takes(*w) || w->n_in != members.front()->n_in) return;
        SplitGroup g{members, 0};
        for (CudaMatrix* w : members) g.rows += w->n_out;
        groups.push_back(g);
    };
    for (CudaLayerWeights& L : m.layers) {
        if (L.fused_qkv) add_at(SplitSite::qkv, {&L.wq, &L.wk, &L.wv});
        else add_at(SplitSite::qkv, {&L.wq}), add_at(SplitSite::qkv, {&L.wk}), add_at(SplitSite::qkv, {&L.wv});
        add_at(SplitSite::wo, {&L.wo});
        if (L.fused_gate_up) add_at(SplitSite::gate_up, {&L.ffn_gate, &L.ffn_up});
        else add_at(SplitSite::gate_up, {&L.ffn_gate}), add_at(SplitSite::gate_up, {&L.ffn_up});
        add_at(SplitSite::down, {&L.ffn_down});
    }
    const bool tied = m.output.data == m.token_embd.data;
    if (!tied) add_at(SplitSite::head, {&m.output});
    if (groups.empty()) return;
    uint64_t most_scales = 0;
    for (const SplitGroup& g : groups)
        most_scales = std::max<uint64_t>(most_scales, (uint64_t)g.rows * g.members[0]->n_in / 16);
    const size_t scratch_bytes = 64ull << 20;
    // Transient: if VRAM cannot hold it, the weights stay in GGUF layout (decoded by the q16x
    // GEMV, as by default) rather than failing the load.
    uint8_t* scratch = nullptr;
    uint16_t* scale_scratch = nullptr;
    if (cudaMalloc(&scratch, scratch_bytes) != cudaSuccess ||
        cudaMalloc(&scale_scratch, std::max<uint64_t>(most_scales, 2)) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the allocation error
        if (scratch) cudaFree(scratch);
        log_warn("Q8_0 weights stay in GGUF layout: no VRAM for the " +
                 std::to_string((scratch_bytes + most_scales) >> 20) + " MiB the split-layout conversion needs");
        return;
    }
    cudaStream_t stream;
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (const SplitGroup& g : groups) convert_group_to_split(g, scratch, scratch_bytes, scale_scratch, stream);
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
    SPILLWAY_CUDA_CHECK(cudaStreamDestroy(stream));
    SPILLWAY_CUDA_CHECK(cudaFree(scratch));
    SPILLWAY_CUDA_CHECK(cudaFree(scale_scratch));
}

}  // namespace

bool cuda_weight_type_supported(GgmlType type) {
    return type == GgmlType::F16 || type == GgmlType::BF16 || type == GgmlType::Q8_0;
}

CudaModel upload_cuda_model(const CpuModel& cpu, bool show_progress) {
    CudaModel m;
    m.spec = cpu.spec;
    check_heads(m);
    ModelSources src;
    src.token_embd = {cpu.token_embd.type, cpu.token_embd.data};
    src.tied = cpu.output.data == cpu.token_embd.data;
    src.output = {cpu.output.type, cpu.output.data};
    src.output_norm = cpu.output_norm.data();
    src.has_bias = !cpu.layers.empty() && !cpu.layers[0].bq.empty();
    for (const CpuLayerWeights& l : cpu.layers) {
        LayerSources ls;
        ls.attn_norm = l.attn_norm.data();
        ls.ffn_norm = l.ffn_norm.data();
        if (src.has_bias) {
            if (l.bq.empty()) fail("CUDA model: QKV bias on some layers only");
            ls.bq = l.bq.data();
            ls.bk = l.bk.data();
            ls.bv = l.bv.data();
        }
        ls.wq = {l.wq.type, l.wq.data};
        ls.wk = {l.wk.type, l.wk.data};
        ls.wv = {l.wv.type, l.wv.data};
        ls.wo = {l.wo.type, l.wo.data};
        ls.gate = {l.ffn_gate.type, l.ffn_gate.data};
        ls.up = {l.ffn_up.type, l.ffn_up.data};
        ls.down = {l.ffn_down.type, l.ffn_down.data};
        src.layers.push_back(ls);
    }
    const ArenaPlan plan = plan_model(m, src);
    m.arena = DeviceBuffer<uint8_t>(plan.size);
    m.weight_bytes = plan.size;
    rebase(m);

    // Two pinned staging buffers: the CPU fills one (reading the mmap) while the copy
    // engine drains the other (pageable copies run at ~7 GB/s, pinned at ~55).
    constexpr size_t kStage = 64ull << 20;
    PinnedBuffer stage[2] = {PinnedBuffer(kStage), PinnedBuffer(kStage)};
    cudaStream_t stream;
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t done[2];
    for (auto& e : done) SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    bool used[2] = {false, false};
    std::unique_ptr<ProgressBar> bar;
    if (show_progress) bar = std::make_unique<ProgressBar>("upload", plan.size >> 20, "MiB");
    uint64_t copied = 0;
    int which = 0;
    for (const Slot& s : plan.slots) {
        for (uint64_t off = 0; off < s.bytes; off += kStage) {
            const size_t n = (size_t)std::min<uint64_t>(kStage, s.bytes - off);
            if (used[which]) SPILLWAY_CUDA_CHECK(cudaEventSynchronize(done[which]));
            std::memcpy(stage[which].data(), static_cast<const uint8_t*>(s.host) + off, n);
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(m.arena.data() + s.offset + off, stage[which].data(), n,
                                                cudaMemcpyHostToDevice, stream));
            SPILLWAY_CUDA_CHECK(cudaEventRecord(done[which], stream));
            used[which] = true;
            which ^= 1;
            copied += n;
            if (bar) bar->update(copied >> 20);
        }
    }
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (bar) bar->finish();
    for (auto& e : done) cudaEventDestroy(e);
    cudaStreamDestroy(stream);

    convert_q8_0_to_split(m);
    m.rope = cpu.rope;
    upload_rope(m);
    return m;
}

CudaModel make_synthetic_cuda_model(const std::string& preset, GgmlType wtype, uint64_t seed) {
    if (!cuda_weight_type_supported(wtype)) fail("--synthetic: weight type must be f16, bf16 or q8_0");
    const GgufHeader header = preset_header(preset, wtype);
    CudaModel m;
    m.spec = model_spec_from_gguf(header);
    check_heads(m);
    auto type_of = [&](const std::string& name) -> GgmlType {
        const GgufTensorInfo* t = header.find_tensor(name);
        if (!t) fail("preset " + preset + " has no tensor " + name);
        return t->type;
    };
    ModelSources src;
    src.token_embd = {type_of("token_embd.weight"), nullptr};
    src.tied = header.find_tensor("output.weight") == nullptr;
    if (!src.tied) src.output = {type_of("output.weight"), nullptr};
    src.has_bias = header.find_tensor("blk.0.attn_q.bias") != nullptr;
    for (uint32_t i = 0; i < m.spec.n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        LayerSources ls;
        ls.wq = {type_of(p + "attn_q.weight"), nullptr};
        ls.wk = {type_of(p + "attn_k.weight"), nullptr};
        ls.wv = {type_of(p + "attn_v.weight"), nullptr};
        ls.wo = {type_of(p + "attn_output.weight"), nullptr};
        ls.gate = {type_of(p + "ffn_gate.weight"), nullptr};
        ls.up = {type_of(p + "ffn_up.weight"), nullptr};
        ls.down = {type_of(p + "ffn_down.weight"), nullptr};
        src.layers.push_back(ls);
    }
    const ArenaPlan plan = plan_model(m, src);
    m.arena = DeviceBuffer<uint8_t>(plan.size);
    m.weight_bytes = plan.size;
    rebase(m);
    uint64_t tensor = 0;
    for (const Slot& s : plan.slots) {
        const uint64_t units = s.type == GgmlType::Q8_0 ? s.bytes / 34 : s.bytes / (s.type == GgmlType::F32 ? 4 : 2);
        const uint32_t blocks = (uint32_t)std::min<uint64_t>(132 * 16, (units + 255) / 256);
        fill_random_kernel<<<std::max(1u, blocks), 256>>>(m.arena.data() + s.offset, units, (int)s.type, (int)s.init,
                                                           seed * 1000003ull + (++tensor));
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
    }
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    convert_q8_0_to_split(m);
    m.rope = make_rope_tables(m.spec.rope, m.spec.head_dim_k);
    upload_rope(m);
    return m;
}

uint64_t cuda_decode_weight_bytes(const CudaModel& m) {
    uint64_t bytes = m.token_embd.row_bytes + m.output.bytes() + (uint64_t)m.spec.n_embd * 4;
    for (const CudaLayerWeights& l : m.layers)
        bytes += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.ffn_gate.bytes() + l.ffn_up.bytes() +
                 l.ffn_down.bytes() + 2ull * m.spec.n_embd * 4;
    return bytes;
}

}  // namespace spillway
