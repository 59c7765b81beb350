#pragma once
// The warp-specialized causal prefill attention for f16 K and V, head dim 128 (sm_90a): see
// prefill_attention_ws.cu. Reached through prefill_attention_wgmma_cuda (schedule
// `specialized`). Internal to engine/cuda.
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

namespace prefill_mma {
struct Params;
}

// True when the driver gives us its tensor-map encoder (cuTensorMapEncodeTiled, CUDA 12.0+):
// the TMA copies need it. The caller also checks prefill_attention_wgmma_available().
bool prefill_attention_ws_available();

// Launches the kernel over p's rows and cells (f16 K and V of n_head_kv heads, head dim 128);
// false (nothing launched) when not available, or where the cells are not 16-byte aligned.
bool prefill_attention_ws_launch(const prefill_mma::Params& p, uint32_t n_head_kv, cudaStream_t stream);

}  // namespace spillway
