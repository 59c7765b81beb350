#pragma once
// Internal to engine/cuda: the tensor-core causal prefill attention behind
// prefill_attention_partial_cuda_with (cuda_prefill.cuh has the contract; shapes are checked
// there). wide: 8 warps and 128 query rows per block instead of 4 and 64. Not included by app/.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cpu/attention.h"

namespace spillway {

void prefill_attention_mma_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                                KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells,
                                uint32_t pos0, uint32_t n_tokens, float* out, float* lse, bool wide,
                                cudaStream_t stream);

}  // namespace spillway
