// LogitsBackend over the CUDA engine (quality/cuda_logits_backend.h): forward_cuda in
// chunks, every row's logits copied back when asked, else the last row only.
#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/cpu/cpu_model.h"
#include "engine/cuda/cuda_forward.h"
#include "engine/cuda/cuda_model.h"
#include "quality/cuda_logits_backend.h"

namespace spillway {
namespace {

class CudaLogitsBackend final : public LogitsBackend {
public:
    CudaLogitsBackend(const CpuModel& model, GateKv kv, uint32_t n_ctx, uint32_t resident_cells, uint32_t chunk)
        : kv_(kv), gpu_(upload_cuda_model(model, false)) {
        if (kv.exact_f32) fail("CUDA logits backend: the exact f32 KV cache exists on the CPU engine only");
        if (n_ctx == 0) fail("logits backend: n_ctx is 0");
        chunk_ = std::max<uint32_t>(1, std::min(chunk, n_ctx));
        cache_ = make_cuda_kv_cache(gpu_, n_ctx, kv.tier.k, kv.tier.v, resident_cells);
        init_cuda_forward_state(state_, gpu_, chunk_, true, n_ctx);
    }

    uint32_t n_vocab() const override { return gpu_.spec.n_vocab; }
    uint32_t n_ctx() const override { return cache_.n_ctx; }
    uint32_t position() const override { return pos_; }
    void reset() override { pos_ = 0; }  // cells past pos_ are never read

    const float* eval(const int32_t* tokens, uint32_t n, bool all_logits) override {
        if (n == 0) fail("logits backend: eval of 0 tokens");
        if ((uint64_t)pos_ + n > cache_.n_ctx)
            fail("logits backend: " + std::to_string(pos_ + (uint64_t)n) + " positions exceed the context of " +
                 std::to_string(cache_.n_ctx));
        const size_t V = gpu_.spec.n_vocab;
        rows_.resize((all_logits ? n : 1) * V);
        for (uint32_t done = 0; done < n;) {
            const uint32_t m = std::min(chunk_, n - done);
            forward_cuda_tokens(gpu_, cache_, state_, tokens + done, m, pos_);
            if (all_logits)
                SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(rows_.data() + (size_t)done * V, state_.logits.data(),
                                                    (size_t)m * V * sizeof(float), cudaMemcpyDeviceToHost,
                                                    state_.stream));
            else if (done + m == n)
                SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(rows_.data(), state_.logits.data() + (size_t)(m - 1) * V,
                                                    V * sizeof(float), cudaMemcpyDeviceToHost, state_.stream));
            // forward_cuda_tokens reads its host tokens asynchronously; they stay valid (the
            // caller's array) until the sync below.
            pos_ += m;
            done += m;
        }
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(state_.stream));
        return rows_.data();
    }

    std::string describe() const override {
        return "cuda " + gate_kv_name(kv_) + (cache_.spill ? " (spill " + std::to_string(spilled_bytes() >> 20) + " MiB)" : "");
    }
    uint64_t spilled_bytes() const override { return cuda_kv_spilled_bytes(cache_); }

private:
    GateKv kv_;
    CudaModel gpu_;
    uint32_t chunk_ = 1;
    CudaKvCache cache_;
    CudaForwardState state_;
    std::vector<float> rows_;
    uint32_t pos_ = 0;
};

}  // namespace

std::unique_ptr<LogitsBackend> make_cuda_logits_backend(const CpuModel& model, GateKv kv, uint32_t n_ctx,
                                                        uint32_t resident_cells, uint32_t prefill_chunk) {
    return std::make_unique<CudaLogitsBackend>(model, kv, n_ctx, resident_cells, prefill_chunk);
}

}  // namespace spillway
