#pragma once
// Causal prefill attention on Hopper's warpgroup MMA (wgmma), any K/V tiers, head dim 128: see
// prefill_attention_wgmma.cu. Same contract as prefill_attention_partial_cuda_with.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cpu/attention.h"
#include "kv/kv_codec.h"

namespace spillway {

// True when this build holds the sm_90a kernel and the current GPU can run it (compute
// capability 9.0, enough shared memory per block).
bool prefill_attention_wgmma_available();

// Which kernel attends. automatic: specialized, or what SPILLWAY_WGMMA_SCHEDULE names (lab).
// specialized: the warp-specialized kernel (prefill_attention_ws.cu: TMA copies from a producer
// warpgroup, ping-pong consumers), f16 K and V only; skew128 for quantized tiers and where the
// driver's tensor-map encoder is missing. skew128: prefill_attention_wgmma.cu's kernel, its two
// warpgroups skewed by half a tile and meeting at a barrier per 128-cell tile.
enum class WgmmaSchedule { automatic, skew128, specialized };

// Runs the kernel; false (and nothing launched) when it is not available or the shape is not
// its own: head dim 128, n_head / n_head_kv <= 16. out_f16: where set, the output goes there
// as f16 ([n_tokens][n_head][dv], 4-byte aligned) and `out` is not written.
bool prefill_attention_wgmma_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                                  KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells,
                                  uint32_t pos0, uint32_t n_tokens, float* out, float* lse, cudaStream_t stream,
                                  WgmmaSchedule schedule = WgmmaSchedule::automatic, __half* out_f16 = nullptr);

}  // namespace spillway
