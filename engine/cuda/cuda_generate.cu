#include "engine/cuda/cuda_generate.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/cuda/cuda_forward.h"
#include "engine/cuda/cuda_model.h"

namespace spillway {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void require_gpu() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        fail(std::string("--device cuda: no usable CUDA GPU (") +
             (err != cudaSuccess ? cudaGetErrorString(err) : "no devices") + ")");
}

}  // namespace

CudaGenerateStats generate_cuda(const CpuModel& cpu_model, std::span<const int32_t> prompt, uint32_t n_generate,
                                const SamplerConfig& sampling, const CudaGenerateOptions& opt,
                                const TokenSink& on_token, const LogitsSink& on_logits) {
    require_gpu();
    if (prompt.empty()) fail("generate_cuda: the prompt is empty");
    if (prompt.size() >= opt.n_ctx) fail("generate_cuda: the prompt does not fit the context");
    CudaGenerateStats stats;
    const auto t_upload = Clock::now();
    const CudaModel model = upload_cuda_model(cpu_model, opt.show_progress);
    stats.upload_s = seconds_since(t_upload);
    const uint32_t V = model.spec.n_vocab;

    CudaKvCache cache = make_cuda_kv_cache(model, opt.n_ctx, opt.k_type, opt.v_type, opt.resident_cells);
    const uint32_t batch = opt.batch != 0 ? opt.batch : cuda_long_prompt_chunk(model);
    const uint32_t chunk = std::max<uint32_t>(1, std::min<uint32_t>(batch, (uint32_t)prompt.size()));
    CudaForwardState st;
    init_cuda_forward_state(st, model, chunk, on_logits != nullptr, opt.n_ctx);
    const bool greedy = sampling.temperature <= 0 && sampling.repeat_penalty == 1.0f;
    Sampler sampler = make_sampler(sampling, V);
    std::vector<int32_t> history(prompt.begin(), prompt.end());
    history.reserve(prompt.size() + n_generate + 1);
    // Host copies of logits: a chunk's rows with on_logits, else one row (non-greedy sampling).
    PinnedBuffer host_logits((size_t)(on_logits ? chunk : 1) * V * sizeof(float));
    float* logits_h = static_cast<float*>(host_logits.data());
    int32_t* token_h = static_cast<int32_t*>(st.host_token.data());

    const auto t_prefill = Clock::now();
    uint32_t last_n = 0;
    for (uint32_t pos = 0; pos < prompt.size(); pos += chunk) {
        const uint32_t n = std::min<uint32_t>(chunk, (uint32_t)prompt.size() - pos);
        forward_cuda_tokens(model, cache, st, prompt.data() + pos, n, pos);
        last_n = n;
        if (on_logits) {
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(logits_h, st.logits.data(), (size_t)n * V * sizeof(float),
                                                cudaMemcpyDeviceToHost, st.stream));
            SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
            for (uint32_t i = 0; i < n; ++i) on_logits(prompt[pos + i], (int32_t)(pos + i), logits_h + (size_t)i * V);
        }
    }
    const uint32_t last_row = on_logits ? last_n - 1 : 0;
    // The first token: from the prompt's last logits.
    auto next_token = [&](uint32_t row) -> int32_t {
        if (greedy) {
            SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
            return *token_h;
        }
        SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(logits_h, st.logits.data() + (size_t)row * V, (size_t)V * sizeof(float),
                                            cudaMemcpyDeviceToHost, st.stream));
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
        return sample_token(sampler, logits_h, history);
    };
    if (greedy) argmax_logits_cuda(st, V, last_row);
    int32_t token = next_token(last_row);
    stats.prefill_s = seconds_since(t_prefill);
    stats.prefill_tokens = (uint32_t)prompt.size();

    const uint64_t weight_bytes = cuda_decode_weight_bytes(model);
    const uint64_t kv_cell_bytes = (cache.k_row_bytes + cache.v_row_bytes) * model.spec.n_layer;
    const auto t_decode = Clock::now();
    uint32_t pos = (uint32_t)prompt.size();
    for (uint32_t i = 0; i < n_generate; ++i) {
        history.push_back(token);
        const bool stop = !on_token(token);
        if (stop || i + 1 == n_generate || pos >= opt.n_ctx) break;
        if (!greedy) {
            *token_h = token;  // the step reads its input token from next_token
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(st.next_token.data(), token_h, sizeof(int32_t),
                                                cudaMemcpyHostToDevice, st.stream));
        }
        decode_step_cuda(model, cache, st, pos, greedy, true);
        // Capture the next step's graph while the GPU runs this one.
        if (i + 2 < n_generate && pos + 1 < opt.n_ctx) prepare_decode_graph(model, cache, st, pos + 1, greedy);
        stats.bytes_read += weight_bytes + kv_cell_bytes * (pos + 1);
        if (on_logits) {
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(logits_h, st.logits.data(), (size_t)V * sizeof(float),
                                                cudaMemcpyDeviceToHost, st.stream));
            SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
            on_logits(token, (int32_t)pos, logits_h);
        }
        token = next_token(0);
        ++pos;
    }
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
    stats.decode_s = seconds_since(t_decode);
    stats.n_decoded = pos - (uint32_t)prompt.size();
    stats.vram_weights = model.weight_bytes;
    stats.vram_kv = cache.arena.bytes();
    stats.vram_scratch = cuda_forward_scratch_bytes(st);
    stats.vram_graphs = st.graph_bytes;
    stats.spilled_bytes = cuda_kv_spilled_bytes(cache);
    stats.staging_bytes = cuda_kv_staging_bytes(cache);
    return stats;
}

}  // namespace spillway
