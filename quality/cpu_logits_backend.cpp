// LogitsBackend over the CPU reference engine (engine/cpu/forward.h).
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/cpu/forward.h"
#include "quality/logits_backend.h"

namespace spillway {

std::string gate_kv_name(const GateKv& kv) { return kv.exact_f32 ? "f32/f32" : kv_tier_name(kv.tier); }

std::optional<GateKv> parse_gate_kv(const std::string& text) {
    const size_t slash = text.find('/');
    const std::string k = text.substr(0, slash);
    const std::string v = slash == std::string::npos ? k : text.substr(slash + 1);
    if (k == "f32" && v == "f32") return GateKv{{}, true};
    auto kt = kv_type_from_name(k), vt = kv_type_from_name(v);
    if (!kt || !vt) return std::nullopt;
    return GateKv{{*kt, *vt}, false};
}

namespace {

class CpuLogitsBackend final : public LogitsBackend {
public:
    CpuLogitsBackend(const CpuModel& model, GateKv kv, uint32_t n_ctx, uint32_t chunk, unsigned threads)
        : model_(model), kv_(kv), chunk_(std::max<uint32_t>(1, std::min(chunk, n_ctx))),
          pool_(threads ? threads : std::max(1u, std::thread::hardware_concurrency())),
          cache_(kv.exact_f32 ? make_kv_cache_f32(model.spec, n_ctx)
                              : make_kv_cache(model.spec, n_ctx, kv.tier.k, kv.tier.v)) {
        if (n_ctx == 0) fail("logits backend: n_ctx is 0");
    }

    uint32_t n_vocab() const override { return model_.spec.n_vocab; }
    uint32_t n_ctx() const override { return cache_.n_ctx; }
    uint32_t position() const override { return pos_; }
    void reset() override { pos_ = 0; }  // cells past pos_ are never read, so no clearing

    const float* eval(const int32_t* tokens, uint32_t n, bool all_logits) override {
        if (n == 0) fail("logits backend: eval of 0 tokens");
        if ((uint64_t)pos_ + n > cache_.n_ctx)
            fail("logits backend: " + std::to_string(pos_ + (uint64_t)n) + " positions exceed the context of " +
                 std::to_string(cache_.n_ctx));
        const size_t V = model_.spec.n_vocab;
        // Two states share the cache: the head is evaluated for every row only when asked,
        // since for a 150k vocabulary it costs as much as a layer per token.
        CpuForwardState& state = all_logits ? state_for(all_, true) : state_for(last_, false);
        if (all_logits) rows_.resize((size_t)n * V);
        for (uint32_t done = 0; done < n;) {
            const uint32_t m = std::min(chunk_, n - done);
            forward_cpu(model_, cache_, state, pool_, tokens + done, m, pos_);
            if (all_logits) std::memcpy(rows_.data() + (size_t)done * V, state.logits.data(), (size_t)m * V * sizeof(float));
            pos_ += m;
            done += m;
        }
        return all_logits ? rows_.data() : state.logits.data();
    }

    std::string describe() const override { return "cpu " + gate_kv_name(kv_); }

private:
    CpuForwardState& state_for(std::optional<CpuForwardState>& slot, bool all_logits) {
        if (!slot) slot = make_forward_state(model_, chunk_, all_logits, pool_.size());
        return *slot;
    }

    const CpuModel& model_;
    GateKv kv_;
    uint32_t chunk_;
    ThreadPool pool_;
    KvCache cache_;
    std::optional<CpuForwardState> all_, last_;
    std::vector<float> rows_;
    uint32_t pos_ = 0;
};

}  // namespace

std::unique_ptr<LogitsBackend> make_cpu_logits_backend(const CpuModel& model, GateKv kv, uint32_t n_ctx,
                                                       uint32_t prefill_chunk, unsigned threads) {
    return std::make_unique<CpuLogitsBackend>(model, kv, n_ctx, prefill_chunk, threads);
}

}  // namespace spillway
