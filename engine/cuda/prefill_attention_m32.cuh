#pragma once
// Internal to engine/cuda: the tensor-core causal prefill attention with 32 query rows per warp
// (prefill_attention_m32.cu says why; wide: 8 warps and 256 rows per block instead of 4 and
// 128), behind prefill_attention_partial_cuda_with
// (cuda_prefill.cuh has the contract; shapes are checked there). Not included by app/.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cpu/attention.h"

namespace spillway {

// Returns false, launching nothing, when a block's shared memory (104 KB at D = 128 with 4
// warps, 139 KB with 8) exceeds what this device grants one block (99 KB on sm_86 / sm_89).
bool prefill_attention_m32_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                                KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells,
                                uint32_t pos0, uint32_t n_tokens, float* out, float* lse, bool wide, uint32_t split,
                                cudaStream_t stream);

// split: 0 = automatic (below), 1 = never, 2 / 4 / 8 = that many CTAs per row block (tests).
// On GPUs with thread-block clusters (sm_90+) a row block's cells may be shared by a cluster of
// 2, 4 or 8 CTAs that merge their partials through distributed shared memory. Automatic: when
// the row blocks are about equally long (a chunk deep in the cache: the first one's
// `min_tiles` 64-cell tiles >= 3/4 of the last one's `max_tiles`) and `blocks` (row blocks x
// KV heads) fill the `slots` (SMs x resident blocks per SM) of the last wave poorly: the n in
// {1, 2, 4, 8} whose waves are fullest, a larger n only when > 5% fuller and when it leaves
// >= 32 tiles per CTA. A pure function (unit-tested).
uint32_t prefill_attention_split_for(uint64_t blocks, uint64_t slots, uint64_t min_tiles, uint64_t max_tiles);

}  // namespace spillway
