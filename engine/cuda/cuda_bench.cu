// spillway bench on the GPU. Per KV tier: one cache of max(depth) + n_gen + 1 cells filled
// with random valid cells (speed depends on shapes, not values), a prefill test from cell 0,
// then at each depth n_gen greedy decode steps through the graph path, timed with events.
// The roofline is measured in the same run with the probe's HBM read kernel.
#include "engine/cuda/cuda_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/sample_stats.h"
#include "engine/cpu/cpu_model.h"
#include "engine/cuda/attention.cuh"
#include "engine/cuda/attention_mma.cuh"
#include "engine/cuda/attention_timeline.h"
#include "engine/cuda/cuda_forward.h"
#include "engine/cuda/cuda_model.h"
#include "engine/cuda/lab_knob.h"
#include "probe/device_probe.h"

namespace spillway {
namespace {

using Clock = std::chrono::steady_clock;

class EventTimer {
public:
    EventTimer() {
        SPILLWAY_CUDA_CHECK(cudaEventCreate(&a_));
        SPILLWAY_CUDA_CHECK(cudaEventCreate(&b_));
    }
    ~EventTimer() {
        cudaEventDestroy(a_);
        cudaEventDestroy(b_);
    }
    void start(cudaStream_t s) { SPILLWAY_CUDA_CHECK(cudaEventRecord(a_, s)); }
    double stop_ms(cudaStream_t s) {
        SPILLWAY_CUDA_CHECK(cudaEventRecord(b_, s));
        SPILLWAY_CUDA_CHECK(cudaEventSynchronize(b_));
        float ms = 0;
        SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
        return ms;
    }

private:
    cudaEvent_t a_ = nullptr, b_ = nullptr;
};


std::string device_name() {
    int dev = 0;
    cudaDeviceProp prop{};
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
    SPILLWAY_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    return prop.name;
}

}  // namespace

uint64_t spill_cells_for_mib(uint64_t mib, uint64_t cell_bytes) {
    if (cell_bytes == 0) fail("spill_cells_for_mib: zero cell size");
    return ((mib << 20) + cell_bytes - 1) / cell_bytes;
}

CudaBenchReport run_cuda_bench(const CudaBenchOptions& o) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        fail(std::string("bench needs a CUDA GPU, and none is usable here (") +
             (err != cudaSuccess ? cudaGetErrorString(err) : "no devices") + ")");
    if (o.depths.empty() || o.kv_types.empty()) fail("bench: no depths or KV types");
    if (o.repetitions == 0) fail("bench: repetitions must be at least 1");
    const uint32_t repetitions = o.repetitions;
    CudaBenchReport report;
    report.device = device_name();

    CudaModel model;
    if (!o.synthetic_preset.empty()) {
        model = make_synthetic_cuda_model(o.synthetic_preset, o.wtype, o.seed);
        report.model = "synthetic " + o.synthetic_preset + " (" + ggml_type_name(o.wtype) + ")";
    } else {
        const CpuModel cpu = load_cpu_model_file(o.model_path);
        model = upload_cuda_model(cpu, o.show_progress);
        report.model = o.model_path;
    }
    report.vram_weights = model.weight_bytes;
    const ModelSpec& s = model.spec;

    const uint32_t max_depth = *std::max_element(o.depths.begin(), o.depths.end());
    const uint32_t n_ctx = std::max(max_depth + o.n_gen + 2, o.n_prompt + 1);
    report.kv_cells = n_ctx;
    const uint32_t chunk = std::max(1u, std::min(o.batch, std::max(1u, o.n_prompt)));
    CudaForwardState st;
    init_cuda_forward_state(st, model, chunk, false, n_ctx);
    report.hbm_gb_s = measure_vram_read_gbps();
    // Lab, SPILLWAY_ATTN_ENGINE_TIMELINE=1 (attention_timeline.h): every layer's mma
    // decode attention stamps its timeline inside the graphs; each decode row's last step is
    // summarised on stderr.
    const AttentionShape attn_shape{s.n_head, model.n_head_kv, s.head_dim_k, s.head_dim_v,
                                    1.0f / std::sqrt((float)s.head_dim_k)};
    DeviceBuffer<uint64_t> attn_stamps;
    if (lab_knob("SPILLWAY_ATTN_ENGINE_TIMELINE", "1", "0")) {
        // The stamps are the single-warp kernel's, so it runs (and plans) wherever the
        // warp-specialized one would be the default.
        attention_mma::lab_warp_specialized(0, 0);
        uint32_t splits = 1;
        for (const auto& [kt, vt] : o.kv_types)
            splits = std::max(splits, attention_split_count(AttentionKernel::mma, attn_shape, kt, vt, n_ctx, st.sm_count));
        st.attn_timeline_stride = attention_timeline_slots(s.n_head, model.n_head_kv, splits);
        attn_stamps = DeviceBuffer<uint64_t>(st.attn_timeline_stride * s.n_layer);
        st.attn_timeline = attn_stamps.data();
    }
    const bool spilling = std::any_of(o.spill_mib.begin(), o.spill_mib.end(), [](uint64_t m) { return m > 0; });
    if (spilling) {
        if (o.n_gen == 0) fail("bench: --spill measures decode; -n must be > 0");
        // A spill is measured at the depths whose cache it leaves at least one resident cell
        // (a sweep over depths skips the rest); one that fits no depth is an error, found
        // before anything is measured.
        for (const auto& [kt, vt] : o.kv_types) {
            const uint64_t cell = (kv_row_bytes(kt, (uint64_t)model.n_head_kv * s.head_dim_k) +
                                   kv_row_bytes(vt, (uint64_t)model.n_head_kv * s.head_dim_v)) * s.n_layer;
            for (uint64_t mib : o.spill_mib) {
                const uint64_t cells = mib ? spill_cells_for_mib(mib, cell) : 1;
                if (cells >= max_depth)
                    fail("bench: a spill of " + std::to_string(mib) + " MiB (" + std::to_string(cells) +
                         " cells) does not fit the " + kv_type_name(kt) + "/" + kv_type_name(vt) +
                         " KV cache at any depth (the deepest, " + std::to_string(max_depth) + ", holds " +
                         std::to_string(cell * max_depth >> 20) + " MiB; at least one cell stays in VRAM)");
            }
        }
        report.h2d_gb_s = measure_pinned_h2d_gbps();
    }

    std::mt19937_64 rng(o.seed);
    std::vector<int32_t> prompt(o.n_prompt);
    for (auto& t : prompt) t = (int32_t)(rng() % s.n_vocab);
    const uint64_t weight_bytes = cuda_decode_weight_bytes(model);
    EventTimer timer;

    // n_gen greedy decode steps at positions depth.. through the graph path, event-timed.
    struct DecodeTiming {
        double ms_per_token = 0, capture_us = 0, tok_s = 0, tok_s_sd = 0;
    };
    auto time_decode = [&](CudaKvCache& cache, uint32_t depth) {
        // The first token's id: any valid one; then each step feeds its argmax to the next.
        const int32_t first = 1;
        SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(st.next_token.data(), &first, sizeof(first), cudaMemcpyHostToDevice,
                                            st.stream));
        // Warm-up at this depth (cells depth, depth+1 are rewritten by the timed steps).
        for (uint32_t i = 0; i < 2; ++i) decode_step_cuda(model, cache, st, depth + i, true, o.use_graph);
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
        double capture_s = 0;
        uint32_t captures = 0;
        if (o.use_graph) prepare_decode_graph(model, cache, st, depth, true);
        timer.start(st.stream);
        for (uint32_t i = 0; i < o.n_gen; ++i) {
            decode_step_cuda(model, cache, st, depth + i, true, o.use_graph);
            if (o.use_graph && i + 1 < o.n_gen) {
                // Wait for the step that last used the next slot (i - 1) outside the timed
                // part, so capture_us is host work only, not GPU time.
                const int slot = (int)((depth + i + 1) & 1);
                if (st.graph_launched[slot]) SPILLWAY_CUDA_CHECK(cudaEventSynchronize(st.graph_done[slot]));
                const auto t0 = Clock::now();
                prepare_decode_graph(model, cache, st, depth + i + 1, true);  // overlaps step i
                capture_s += std::chrono::duration<double>(Clock::now() - t0).count();
                ++captures;
            }
        }
        DecodeTiming t;
        t.ms_per_token = timer.stop_ms(st.stream) / o.n_gen;
        t.capture_us = captures ? capture_s / captures * 1e6 : 0;
        return t;
    };
    // o.repetitions runs of time_decode: means of ms per token, capture time and tok/s.
    auto time_decode_repeated = [&](CudaKvCache& cache, uint32_t depth) {
        std::vector<double> ms, capture, tok_s;
        for (uint32_t rep = 0; rep < repetitions; ++rep) {
            const DecodeTiming t = time_decode(cache, depth);
            ms.push_back(t.ms_per_token);
            capture.push_back(t.capture_us);
            tok_s.push_back(1e3 / t.ms_per_token);
        }
        DecodeTiming t;
        t.ms_per_token = sample_stats(ms).mean;
        t.capture_us = sample_stats(capture).mean;
        const SampleStats speed = sample_stats(tok_s);
        t.tok_s = speed.mean;
        t.tok_s_sd = speed.sd;
        return t;
    };

    for (const auto& [kt, vt] : o.kv_types) {
        CudaKvCache cache = make_cuda_kv_cache(model, n_ctx, kt, vt);
        fill_cuda_kv_cache_random(cache, o.seed * 7919 + (uint64_t)kt * 3 + (uint64_t)vt, st.stream);
        const uint64_t cell_bytes = (cache.k_row_bytes + cache.v_row_bytes) * s.n_layer;

        if (o.n_prompt > 0) {
            auto prefill = [&] {
                for (uint32_t pos = 0; pos < o.n_prompt; pos += chunk) {
                    const uint32_t n = std::min(chunk, o.n_prompt - pos);
                    forward_cuda_tokens(model, cache, st, prompt.data() + pos, n, pos);
                }
            };
            prefill();  // warm-up: cuBLAS heuristics, first-touch of scratch
            SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
            std::vector<double> ms, tok_s;
            for (uint32_t rep = 0; rep < repetitions; ++rep) {
                timer.start(st.stream);
                prefill();
                ms.push_back(timer.stop_ms(st.stream));
                tok_s.push_back(o.n_prompt / (ms.back() * 1e-3));
            }
            CudaBenchRow row;
            row.k_type = kt;
            row.v_type = vt;
            row.test = "pp" + std::to_string(o.n_prompt);
            const SampleStats speed = sample_stats(tok_s);
            row.tok_s = speed.mean;
            row.tok_s_sd = speed.sd;
            row.ms_per_token = sample_stats(ms).mean / o.n_prompt;
            row.vram_kv = cache.arena.bytes();
            report.rows.push_back(row);
        }
        if (o.n_gen == 0) continue;
        for (uint32_t depth : o.depths) {
            if (st.attn_timeline != nullptr)
                SPILLWAY_CUDA_CHECK(cudaMemsetAsync(attn_stamps.data(), 0, attn_stamps.bytes(), st.stream));
            const DecodeTiming t = time_decode_repeated(cache, depth);
            const uint32_t last_cells = depth + o.n_gen;  // the last timed step's cells
            if (st.attn_timeline != nullptr &&
                attention_default_kernel(attn_shape, kt, vt, last_cells) == AttentionKernel::mma) {
                std::vector<uint64_t> stamps(attn_stamps.size());
                SPILLWAY_CUDA_CHECK(cudaMemcpy(stamps.data(), attn_stamps.data(), attn_stamps.bytes(),
                                               cudaMemcpyDeviceToHost));
                const uint32_t splits =
                    attention_split_count(AttentionKernel::mma, attn_shape, kt, vt, last_cells, st.sm_count);
                const std::string line = attention_engine_timeline_summary(
                    stamps, st.attn_timeline_stride, s.n_layer, s.n_head, model.n_head_kv, splits);
                std::fprintf(stderr, "%s/%s depth %u: %s\n", kv_type_name(kt), kv_type_name(vt), depth,
                             line.empty() ? "no stamps" : line.c_str());
            }
            CudaBenchRow row;
            row.k_type = kt;
            row.v_type = vt;
            row.test = "tg" + std::to_string(o.n_gen);
            row.depth = depth;
            row.ms_per_token = t.ms_per_token;
            row.tok_s = t.tok_s;
            row.tok_s_sd = t.tok_s_sd;
            // Step i reads depth + i + 1 cells; the mean over the run.
            row.bytes_per_token = weight_bytes + cell_bytes * (depth + (o.n_gen + 1) / 2);
            row.gb_s = row.bytes_per_token / (row.ms_per_token * 1e-3) / 1e9;
            row.roofline_pct = 100.0 * (row.bytes_per_token / (report.hbm_gb_s * 1e9)) / (row.ms_per_token * 1e-3);
            row.capture_us = t.capture_us;
            row.vram_kv = cache.arena.bytes();
            report.rows.push_back(row);
            if (!spilling) continue;
            // Spilled rows: a cache of this depth whose last spill_cells filled cells live in
            // the pinned tail; the engage row spills one cell (c_engage = it - the row above).
            std::vector<std::pair<uint64_t, bool>> spills = {{0, true}};
            for (uint64_t mib : o.spill_mib)
                if (mib > 0) spills.push_back({mib, false});
            for (const auto& [mib, engage] : spills) {
                const uint64_t cells = engage ? 1 : spill_cells_for_mib(mib, cell_bytes);
                if (cells >= depth) continue;  // does not fit this depth's cache (checked above for some depth)
                const uint32_t row_ctx = depth + o.n_gen + 2;
                CudaKvCache spilled = make_cuda_kv_cache(model, row_ctx, kt, vt, (uint32_t)(depth - cells));
                fill_cuda_kv_cache_random(spilled, o.seed * 7919 + depth + cells, st.stream);
                const DecodeTiming ts = time_decode_repeated(spilled, depth);
                CudaBenchRow r = row;
                r.spill_mib = mib;
                r.engage = engage;
                r.spill_cells = (uint32_t)cells;
                r.ms_per_token = ts.ms_per_token;
                r.tok_s = ts.tok_s;
                r.tok_s_sd = ts.tok_s_sd;
                // The resident part is read from VRAM, the tail streamed: report the same
                // bytes per token as the resident row, and the streamed share on its own.
                r.gb_s = r.bytes_per_token / (r.ms_per_token * 1e-3) / 1e9;
                r.roofline_pct = 100.0 * (r.bytes_per_token / (report.hbm_gb_s * 1e9)) / (r.ms_per_token * 1e-3);
                // Step i copies spill_cells + i old cells (its own cell is written, not copied).
                r.tail_bytes_per_token = (uint64_t)((double)cell_bytes * ((double)cells + (o.n_gen - 1) / 2.0));
                r.capture_us = ts.capture_us;
                r.vram_kv = spilled.arena.bytes();
                r.staging_bytes = cuda_kv_staging_bytes(spilled);
                r.spilled_bytes = cuda_kv_spilled_bytes(spilled);
                report.rows.push_back(r);
            }
        }
    }
    report.vram_graphs = st.graph_bytes;
    report.vram_scratch = cuda_forward_scratch_bytes(st);  // after the runs: includes the spill scratch
    for (const ScratchPart& part : cuda_forward_scratch_parts(st)) report.vram_scratch_parts.emplace_back(part.name, part.bytes);
    return report;
}

}  // namespace spillway
