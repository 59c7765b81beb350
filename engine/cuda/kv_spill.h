#pragma once
// The spilled tail of the GPU KV cache (issue 6): cells [n_resident, n_ctx) of every layer
// live in one pinned host arena; each forward streams the tail cells that exist into VRAM
// staging buffers on a copy stream, attends over them chunk by chunk and merges the
// (out, lse) partials with the resident window's (attention_merge_cuda). New cells of
// positions >= n_resident are written into the staging buffer (so this step attends over
// them) and copied back to the pinned tail on the copy stream (so the next step finds them).
//
// Why a ring of staging buffers instead of a resident copy of the tail: the tail is larger
// than the budget by definition; two chunk buffers let the copy of item i+1 run while item i
// is attended, and the copy engine reads pinned memory at full link speed (DESIGN.md).
//
// The ring, per forward (one "step"): items = (layer, chunk) in layer order; item i uses
// buffer i % B. Copy stream: [wait fork] H2D(0) .. H2D(B-1), then for each item i, once it
// is enqueued: D2H of its new cells (after `written`), H2D(i+B) (after `consumed[b]`).
// Per layer, the tail branch (its own stream, forked from the compute stream once q/k/v
// exist): wait copied[b], kv_write into staging, partial, record consumed[b], merge chunks.
// The D2H write-backs of new cells run on a third stream (writeback_stream), so the H2D chain
// never waits behind them; the H2D that next fills a buffer waits for that buffer's
// write-back (written_back[b]). SPILLWAY_SPILL_WRITEBACK=copy puts them back on the copy
// stream (the earlier schedule, kept to measure the difference: docs/perf-notes.md, "Spill").
// The compute stream meanwhile writes resident cells and attends over the resident window,
// then waits for the tail branch and merges once. Why a branch: the tail's partial then runs
// beside the resident attention, and the engagement cost per layer is one merge launch plus
// the edges (measured: docs/perf-notes.md, "Spill"). At the end the copy stream joins the
// compute stream, so the whole step is one fork/join and captures into one CUDA graph.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cpu/attention.h"
#include "engine/cuda/cuda_check.h"
#include "model/model_spec.h"
#include "plan/kv_tiers.h"

namespace spillway {

// Own one CUDA stream (non-blocking) / event (timing disabled); never copied.
class CudaStreamOwner {
public:
    CudaStreamOwner() { SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    CudaStreamOwner(const CudaStreamOwner&) = delete;
    CudaStreamOwner& operator=(const CudaStreamOwner&) = delete;
    ~CudaStreamOwner() {
        if (s_) cudaStreamDestroy(s_);
    }
    cudaStream_t get() const { return s_; }

private:
    cudaStream_t s_ = nullptr;
};

class CudaEventOwner {
public:
    CudaEventOwner() { SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
    CudaEventOwner(CudaEventOwner&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
    CudaEventOwner(const CudaEventOwner&) = delete;
    CudaEventOwner& operator=(const CudaEventOwner&) = delete;
    ~CudaEventOwner() {
        if (e_) cudaEventDestroy(e_);
    }
    cudaEvent_t get() const { return e_; }

private:
    cudaEvent_t e_ = nullptr;
};


// kSpillStagingBuffers (two: the minimum for overlap) and kSpillChunkBytes (one buffer's cap
// on one layer's tail chunk, K + V: 32 MiB = 8192 cells of the 14B shape's f16, so 4 GiB of
// spill streams in 3 chunks per layer) live in plan/kv_tiers.h: the planner pays the same
// ring from the budget.

struct CudaKvSpill {
    uint32_t n_resident = 0;      // first tail cell
    uint32_t n_tail = 0;          // cells in the host tail (n_ctx - n_resident)
    uint32_t chunk_cells = 0;     // capacity of one staging buffer
    uint64_t k_row_bytes = 0, v_row_bytes = 0;
    PinnedBuffer host;  // the pinned tail of every layer
    std::vector<uint8_t*> host_k, host_v;   // per layer: tail cell 0 (= cache cell n_resident)
    DeviceBuffer<uint8_t> staging;
    std::vector<uint8_t*> stage_k, stage_v; // per staging buffer
    CudaStreamOwner copy_stream;
    CudaStreamOwner tail_stream;   // the tail's writes, partials and merges, beside the resident attention
    CudaStreamOwner writeback_stream;  // D2H of new cells to the pinned tail
    bool writeback_on_copy_stream = false;  // SPILLWAY_SPILL_WRITEBACK=copy
    CudaEventOwner fork, join, writeback_join, written, layer_fork, tail_done;
    std::vector<CudaEventOwner> copied, consumed, written_back;  // per staging buffer
};

// Host tail + staging for cells [n_resident, n_ctx) of n_layer layers. chunk_cells = 0 picks
// the cap from kSpillChunkBytes (never more than the tail). 1 <= n_resident < n_ctx.
std::unique_ptr<CudaKvSpill> make_cuda_kv_spill(uint32_t n_layer, uint32_t n_ctx, uint32_t n_resident,
                                                uint64_t k_row_bytes, uint64_t v_row_bytes, uint32_t chunk_cells);

// Bytes of the pinned tail that hold cells (all layers, K + V) and of the staging buffers.
uint64_t cuda_kv_spill_host_bytes(const CudaKvSpill& spill);
uint64_t cuda_kv_spill_staging_bytes(const CudaKvSpill& spill);

// The attention of one layer of a forward whose tokens are at positions pos0 .. pos0+T-1 and
// whose cells reach past the resident window (pos0 + T > n_resident). Inputs of the layer:
// q [T][n_head][dk], k [T][kd], v [T][vd] f32 (after RoPE). It writes the layer's new cells
// where they live, attends over resident + tail and leaves out [T][n_head][dv] in `out`.
struct SpillLayerArgs {
    AttentionShape shape;
    KvType k_type, v_type;
    uint32_t layer;
    uint8_t* resident_k;          // the layer's VRAM cells from cell 0
    uint8_t* resident_v;
    const float* q;
    const float* k;
    const float* v;
    float* out;                   // [T][n_head][dv]
    float* lse;                   // [T][n_head] scratch for the accumulated lse
    float* tail_out;              // [T][n_head][dv] scratch: the tail's accumulated partial
    float* tail_lse;              // [T][n_head]
    float* chunk_out;             // [T][n_head][dv] scratch: one later chunk's partial
    float* chunk_lse;             // [T][n_head]
    void* workspace;              // decode attention split workspace (resident, compute stream)
    size_t workspace_bytes;
    void* tail_workspace;         // the same for the tail branch (runs concurrently)
    size_t tail_workspace_bytes;
    uint32_t sm_count;
};

// Per-forward state of the ring; begin/end bracket the layers of one forward.
struct SpillCursor {
    uint32_t pos0 = 0, n_tokens = 0;
    uint32_t n_layer = 0;
    uint32_t chunks_per_layer = 0;  // 0: this forward touches no tail cell
    uint32_t next_copy = 0;         // next item whose H2D is to be issued
    bool writeback_pending[kSpillStagingBuffers] = {};  // buffer b's new cells are being copied back
};

// True when a forward of n_tokens at pos0 reaches tail cells (and needs the spill path).
inline bool spill_engaged(const CudaKvSpill* spill, uint32_t pos0, uint32_t n_tokens) {
    return spill != nullptr && (uint64_t)pos0 + n_tokens > spill->n_resident;
}

void spill_forward_begin(CudaKvSpill& spill, SpillCursor& cursor, uint32_t n_layer, uint32_t pos0, uint32_t n_tokens,
                         cudaStream_t compute);
void spill_layer_attention(CudaKvSpill& spill, SpillCursor& cursor, const SpillLayerArgs& args, cudaStream_t compute);
void spill_forward_end(CudaKvSpill& spill, SpillCursor& cursor, cudaStream_t compute);

}  // namespace spillway
