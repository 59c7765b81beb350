#pragma once
// What the quality gate needs from an engine: feed tokens of one sequence, get logits back.
// The gate (NIAH runner, logit metrics, four-cell table) only talks to this interface, so the
// CUDA engine (and later the spilled KV cache) plugs in by implementing three functions.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "plan/kv_tiers.h"

namespace spillway {

struct CpuModel;

class LogitsBackend {
public:
    virtual ~LogitsBackend() = default;
    virtual uint32_t n_vocab() const = 0;
    virtual uint32_t n_ctx() const = 0;       // positions the sequence may reach
    virtual uint32_t position() const = 0;    // tokens evaluated since reset()
    // Starts a new sequence at position 0 (the KV cache contents are forgotten).
    virtual void reset() = 0;
    // Appends tokens[0..n) to the sequence. Returns n rows of n_vocab logits (all_logits) or
    // only the last token's row; valid until the next call. The backend splits long inputs
    // into its own chunks. Throws spillway::Error past n_ctx.
    virtual const float* eval(const int32_t* tokens, uint32_t n, bool all_logits) = 0;
    // "cpu f16/f16", for reports.
    virtual std::string describe() const = 0;
    // KV bytes held in the host tail and streamed each step (the spill engine's; 0 for a
    // cache that is wholly in the engine's own memory, as the CPU engine's is).
    virtual uint64_t spilled_bytes() const { return 0; }
};

// The KV cache formats the gate compares: a tier of the ladder, or the CPU engine's exact
// f32 cache (no tier; it measures how far f16 itself is from exact).
struct GateKv {
    KvTier tier;
    bool exact_f32 = false;
    bool operator==(const GateKv&) const = default;
};
std::string gate_kv_name(const GateKv& kv);  // "q8_0/q4_0", "f32/f32"
// Accepts "K/V" with K, V in {f16, q8_0, q4_0}, a single type for both ("q8_0"), and
// "f32/f32" or "f32". nullopt on anything else.
std::optional<GateKv> parse_gate_kv(const std::string& text);

// The CPU engine (engine/cpu) over a KvCache of the given format. `model` must outlive the
// backend. prefill_chunk: tokens per forward call; threads: 0 = all cores.
std::unique_ptr<LogitsBackend> make_cpu_logits_backend(const CpuModel& model, GateKv kv, uint32_t n_ctx,
                                                       uint32_t prefill_chunk = 512, unsigned threads = 0);

}  // namespace spillway
