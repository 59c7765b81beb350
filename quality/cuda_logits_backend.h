#pragma once
// LogitsBackend over the CUDA engine (engine/cuda), with an optional KV spill: the gate runs
// the same tier resident and spilled through it. Implemented in engine/cuda, so it exists
// only in CUDA builds (SPILLWAY_HAVE_CUDA); no CUDA types here.
#include <cstdint>
#include <memory>

#include "quality/logits_backend.h"

namespace spillway {

// The CUDA engine over a cache of n_ctx cells of kv's tier, resident_cells of them in VRAM
// (UINT32_MAX: all) and the rest in pinned host memory, streamed each forward. `model`
// must outlive the backend. The exact f32 cache is CPU-only (throws). prefill_chunk: tokens
// per forward call. spilled_bytes() is the pinned tail's size.
std::unique_ptr<LogitsBackend> make_cuda_logits_backend(const CpuModel& model, GateKv kv, uint32_t n_ctx,
                                                        uint32_t resident_cells = UINT32_MAX,
                                                        uint32_t prefill_chunk = 512);

}  // namespace spillway
