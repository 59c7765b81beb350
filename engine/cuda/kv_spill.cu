// The streamed KV tail: pinned host arena, staging ring, and the per-layer attention that
// merges the resident window with the streamed chunks (see kv_spill.h for the schedule).
#include "engine/cuda/kv_spill.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "engine/cuda/attention.cuh"
#include "engine/cuda/cuda_prefill.cuh"
#include "engine/cuda/kv_write.cuh"
#include "engine/cuda/lab_knob.h"

namespace spillway {
namespace {

uint64_t aligned256(uint64_t n) { return (n + 255) / 256 * 256; }

// Tail indices (cell - n_resident) of item (layer, chunk) and the split of its cells into
// old ones (already in the host tail: copied in) and new ones (written by this forward).
struct ChunkCells {
    uint32_t begin = 0, end = 0;  // tail indices [begin, end)
    uint32_t n_old = 0;           // cells [begin, begin + n_old) come from the host
    uint32_t new_begin = 0;       // cells [new_begin, end) are this forward's tokens
};

ChunkCells chunk_cells_of(const CudaKvSpill& s, const SpillCursor& c, uint32_t chunk) {
    const uint32_t n_exist = c.pos0 + c.n_tokens - s.n_resident;   // tail cells after this forward
    const uint32_t first_new = c.pos0 > s.n_resident ? c.pos0 - s.n_resident : 0;
    ChunkCells r;
    r.begin = chunk * s.chunk_cells;
    r.end = std::min(r.begin + s.chunk_cells, n_exist);
    // A chunk wholly before the first new cell has none (new_begin == end).
    r.new_begin = std::min(std::max(r.begin, first_new), r.end);
    r.n_old = r.new_begin - r.begin;
    return r;
}

uint32_t item_count(const SpillCursor& c) { return c.n_layer * c.chunks_per_layer; }

// The H2D of item i's old cells into staging buffer i % B, on the copy stream.
void issue_copy(CudaKvSpill& s, SpillCursor& c, uint32_t item) {
    const uint32_t layer = item / c.chunks_per_layer, chunk = item % c.chunks_per_layer;
    const uint32_t b = item % kSpillStagingBuffers;
    const cudaStream_t copy = s.copy_stream.get();
    // The buffer's previous user (item - B) must have been attended; items < B follow the fork.
    if (item >= kSpillStagingBuffers) SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(copy, s.consumed[b].get(), 0));
    // ... and its new cells read back to the host before this copy overwrites them.
    if (c.writeback_pending[b]) {
        SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(copy, s.written_back[b].get(), 0));
        c.writeback_pending[b] = false;
    }
    const ChunkCells cells = chunk_cells_of(s, c, chunk);
    if (cells.n_old > 0) {
        SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(s.stage_k[b], s.host_k[layer] + (uint64_t)cells.begin * s.k_row_bytes,
                                            (uint64_t)cells.n_old * s.k_row_bytes, cudaMemcpyHostToDevice, copy));
        SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(s.stage_v[b], s.host_v[layer] + (uint64_t)cells.begin * s.v_row_bytes,
                                            (uint64_t)cells.n_old * s.v_row_bytes, cudaMemcpyHostToDevice, copy));
    }
    SPILLWAY_CUDA_CHECK(cudaEventRecord(s.copied[b].get(), copy));
}

}  // namespace


std::unique_ptr<CudaKvSpill> make_cuda_kv_spill(uint32_t n_layer, uint32_t n_ctx, uint32_t n_resident,
                                                uint64_t k_row_bytes, uint64_t v_row_bytes, uint32_t chunk_cells) {
    if (n_resident == 0 || n_resident >= n_ctx)
        fail("KV spill: the resident window must hold 1 .. n_ctx - 1 cells (got " + std::to_string(n_resident) +
             " of " + std::to_string(n_ctx) + ")");
    auto s = std::make_unique<CudaKvSpill>();
    s->n_resident = n_resident;
    s->n_tail = n_ctx - n_resident;
    s->k_row_bytes = k_row_bytes;
    s->v_row_bytes = v_row_bytes;
    const uint64_t cell = k_row_bytes + v_row_bytes;
    // The cap holds the two 256-byte alignments too, so the ring never exceeds what the
    // planner pays for it (plan/kv_tiers.h: spill_staging_bytes).
    const uint64_t auto_cells = std::max<uint64_t>(1, (kSpillChunkBytes - 512) / cell);
    s->chunk_cells = (uint32_t)std::min<uint64_t>(chunk_cells ? chunk_cells : auto_cells, s->n_tail);
    s->writeback_on_copy_stream = lab_knob("SPILLWAY_SPILL_WRITEBACK", "copy", "own");

    const uint64_t host_k = aligned256(k_row_bytes * s->n_tail), host_v = aligned256(v_row_bytes * s->n_tail);
    const size_t tail_bytes = (host_k + host_v) * n_layer;
    try {
        s->host = PinnedBuffer(tail_bytes);
    } catch (const Error& e) {
        (void)cudaGetLastError();  // a failed host allocation must not look like a later kernel's error
        fail("KV spill: could not pin " + std::to_string(tail_bytes >> 20) + " MiB of host memory for the KV tail (" +
             e.what() + "); spill less (a larger --vram-target) or free host RAM");
    }
    uint8_t* const tail = static_cast<uint8_t*>(s->host.data());
    for (uint32_t l = 0; l < n_layer; ++l) {
        s->host_k.push_back(tail + (host_k + host_v) * l);
        s->host_v.push_back(tail + (host_k + host_v) * l + host_k);
    }
    const uint64_t stage_k = aligned256(k_row_bytes * s->chunk_cells),
                   stage_v = aligned256(v_row_bytes * s->chunk_cells);
    s->staging = DeviceBuffer<uint8_t>((stage_k + stage_v) * kSpillStagingBuffers);
    for (uint32_t b = 0; b < kSpillStagingBuffers; ++b) {
        s->stage_k.push_back(s->staging.data() + (stage_k + stage_v) * b);
        s->stage_v.push_back(s->staging.data() + (stage_k + stage_v) * b + stage_k);
        s->copied.emplace_back();
        s->consumed.emplace_back();
        s->written_back.emplace_back();
    }
    return s;
}

uint64_t cuda_kv_spill_host_bytes(const CudaKvSpill& s) {
    return (s.k_row_bytes + s.v_row_bytes) * s.n_tail * s.host_k.size();
}

uint64_t cuda_kv_spill_staging_bytes(const CudaKvSpill& s) { return s.staging.bytes(); }

void spill_forward_begin(CudaKvSpill& s, SpillCursor& c, uint32_t n_layer, uint32_t pos0, uint32_t n_tokens,
                         cudaStream_t compute) {
    c = SpillCursor{};
    c.pos0 = pos0;
    c.n_tokens = n_tokens;
    c.n_layer = n_layer;
    if (!spill_engaged(&s, pos0, n_tokens)) return;
    const uint32_t n_exist = pos0 + n_tokens - s.n_resident;
    c.chunks_per_layer = (n_exist + s.chunk_cells - 1) / s.chunk_cells;
    // Fork: the copy stream joins the forward here (and, under capture, the graph).
    SPILLWAY_CUDA_CHECK(cudaEventRecord(s.fork.get(), compute));
    SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(s.copy_stream.get(), s.fork.get(), 0));
    SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(s.writeback_stream.get(), s.fork.get(), 0));
    const uint32_t primed = std::min(kSpillStagingBuffers, item_count(c));
    for (; c.next_copy < primed; ++c.next_copy) issue_copy(s, c, c.next_copy);
}

void spill_layer_attention(CudaKvSpill& s, SpillCursor& c, const SpillLayerArgs& a, cudaStream_t compute) {
    if (c.chunks_per_layer == 0) fail("spill_layer_attention: the forward does not reach the tail");
    const AttentionShape& sh = a.shape;
    const uint32_t T = c.n_tokens, pos0 = c.pos0;
    const uint32_t kd = sh.n_head_kv * sh.head_dim_k, vd = sh.n_head_kv * sh.head_dim_v;
    const cudaStream_t tail = s.tail_stream.get(), copy = s.copy_stream.get();

    // New cells inside the resident window go to VRAM as in the unspilled path.
    if (pos0 < s.n_resident) {
        const uint32_t n = s.n_resident - pos0;
        kv_write_cuda(a.k_type, a.k, a.resident_k, pos0, n, kd, compute);
        kv_write_cuda(a.v_type, a.v, a.resident_v, pos0, n, vd, compute);
    }
    // The tail branch forks here (q, k, v are ready) and runs beside the resident attention:
    // only the final merge is on the compute stream's path (c_engage, kv_spill.h).
    SPILLWAY_CUDA_CHECK(cudaEventRecord(s.layer_fork.get(), compute));
    SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(tail, s.layer_fork.get(), 0));
    for (uint32_t chunk = 0; chunk < c.chunks_per_layer; ++chunk) {
        const uint32_t item = a.layer * c.chunks_per_layer + chunk;
        const uint32_t b = item % kSpillStagingBuffers;
        const ChunkCells cells = chunk_cells_of(s, c, chunk);
        SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(tail, s.copied[b].get(), 0));
        const uint32_t n_new = cells.end - cells.new_begin;
        if (n_new > 0) {
            // This forward's cells: into the staging chunk (attended below), then back to the
            // pinned tail; no later copy of this forward reads them (the join at the end
            // orders them before the next forward's), but the buffer's next H2D must wait.
            const uint32_t token = s.n_resident + cells.new_begin - pos0;
            const uint32_t slot = cells.new_begin - cells.begin;
            kv_write_cuda(a.k_type, a.k + (size_t)token * kd, s.stage_k[b], slot, n_new, kd, tail);
            kv_write_cuda(a.v_type, a.v + (size_t)token * vd, s.stage_v[b], slot, n_new, vd, tail);
            const cudaStream_t writeback = s.writeback_on_copy_stream ? copy : s.writeback_stream.get();
            SPILLWAY_CUDA_CHECK(cudaEventRecord(s.written.get(), tail));
            SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(writeback, s.written.get(), 0));
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(s.host_k[a.layer] + (uint64_t)cells.new_begin * s.k_row_bytes,
                                                s.stage_k[b] + (uint64_t)slot * s.k_row_bytes,
                                                (uint64_t)n_new * s.k_row_bytes, cudaMemcpyDeviceToHost, writeback));
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(s.host_v[a.layer] + (uint64_t)cells.new_begin * s.v_row_bytes,
                                                s.stage_v[b] + (uint64_t)slot * s.v_row_bytes,
                                                (uint64_t)n_new * s.v_row_bytes, cudaMemcpyDeviceToHost, writeback));
            if (!s.writeback_on_copy_stream) {
                SPILLWAY_CUDA_CHECK(cudaEventRecord(s.written_back[b].get(), writeback));
                c.writeback_pending[b] = true;
            }
        }
        // Chunk 0 lands in the tail accumulator, later chunks in the scratch pair and merge in.
        const uint32_t n_cells = cells.end - cells.begin;
        float* out = chunk == 0 ? a.tail_out : a.chunk_out;
        float* lse = chunk == 0 ? a.tail_lse : a.chunk_lse;
        if (T == 1)
            attention_partial_cuda(sh, a.q, a.k_type, s.stage_k[b], a.v_type, s.stage_v[b], n_cells, out, lse,
                                   a.tail_workspace, a.tail_workspace_bytes, a.sm_count, tail);
        else
            prefill_attention_partial_cuda(sh, a.q, a.k_type, s.stage_k[b], a.v_type, s.stage_v[b],
                                           s.n_resident + cells.begin, n_cells, pos0, T, out, lse, tail);
        SPILLWAY_CUDA_CHECK(cudaEventRecord(s.consumed[b].get(), tail));
        if (chunk > 0) attention_merge_cuda(sh.n_head * T, sh.head_dim_v, a.tail_out, a.tail_lse, out, lse, tail);
        if (c.next_copy < item_count(c)) issue_copy(s, c, c.next_copy++);
    }
    SPILLWAY_CUDA_CHECK(cudaEventRecord(s.tail_done.get(), tail));

    // The resident window: cells [0, n_resident), all of which this forward's tokens may see.
    if (T == 1)
        attention_partial_cuda(sh, a.q, a.k_type, a.resident_k, a.v_type, a.resident_v, s.n_resident, a.out, a.lse,
                               a.workspace, a.workspace_bytes, a.sm_count, compute);
    else
        prefill_attention_partial_cuda(sh, a.q, a.k_type, a.resident_k, a.v_type, a.resident_v, 0, s.n_resident, pos0,
                                       T, a.out, a.lse, compute);
    SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(compute, s.tail_done.get(), 0));
    attention_merge_cuda(sh.n_head * T, sh.head_dim_v, a.out, a.lse, a.tail_out, a.tail_lse, compute);
}

void spill_forward_end(CudaKvSpill& s, SpillCursor& c, cudaStream_t compute) {
    if (c.chunks_per_layer == 0) return;
    // Join: the write-backs of the last items and the copy stream's tail end before the
    // forward does, so the next forward (or the host) sees every cell.
    SPILLWAY_CUDA_CHECK(cudaEventRecord(s.join.get(), s.copy_stream.get()));
    SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(compute, s.join.get(), 0));
    SPILLWAY_CUDA_CHECK(cudaEventRecord(s.writeback_join.get(), s.writeback_stream.get()));
    SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(compute, s.writeback_join.get(), 0));
}

}  // namespace spillway
