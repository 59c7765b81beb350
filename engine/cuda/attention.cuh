#pragma once
// Flash-decoding attention of one query token over a contiguous range of KV cells, with the
// contract of engine/cpu/attention.h: the result is a partial (output normalised within the
// range, plus the natural-log log-sum-exp of its scaled scores), and partials merge exactly.
// Internally the cells are split across thread blocks (GQA-aware: a block reads each of its
// KV head's cells once for all the query heads that share it) into workspace partials that
// a second kernel merges; the spill path merges a resident partial with a streamed tail the
// same way, with attention_merge_cuda.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/cpu/attention.h"
#include "model/model_spec.h"

namespace spillway {

// head_dim_k == head_dim_v, one of 64 or 128; n_head / n_head_kv <= 16.
bool attention_supports(const AttentionShape& shape);

// Cell-range splits used for n_cells on a GPU with sm_count multiprocessors: a pure function
// so the planner and the tests can see the choice.
uint32_t attention_split_count(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count);

// Device scratch needed by attention_partial_cuda for n_cells cells (0 when none is needed).
size_t attention_workspace_bytes(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count);

// All pointers are device pointers. q: [n_head][head_dim_k] f32; k_cells / v_cells: n_cells
// rows laid out as in kv/kv_layout.h (16-byte aligned base); out: [n_head][head_dim_v];
// lse: [n_head]. n_cells == 0 gives out = 0, lse = -inf. sm_count: the device's
// multiprocessor count (cudaDevAttrMultiProcessorCount), the same value given to
// attention_workspace_bytes.
void attention_partial_cuda(const AttentionShape& shape, const float* q, KvType k_type,
                            const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                            uint32_t n_cells, float* out, float* lse, void* workspace,
                            size_t workspace_bytes, uint32_t sm_count, cudaStream_t stream);

// a := merge(a, b), in place, as attention_merge_cpu.
void attention_merge_cuda(uint32_t n_head, uint32_t head_dim_v, float* out_a, float* lse_a,
                          const float* out_b, const float* lse_b, cudaStream_t stream);

}  // namespace spillway
