#pragma once
// Writes f32 K or V rows into the cache at consecutive cells, quantizing to the cache's
// KvType in GGUF block layout (kv/kv_layout.h). Rounding follows gguf/quants.h (ggml's
// reference quantizers), so a row written here equals one written by the CPU engine.
#include <cuda_runtime.h>

#include <cstdint>

#include "model/model_spec.h"

namespace spillway {

// src: [n_tokens][n_values] f32 (n_values = n_head_kv * head_dim, a multiple of 32);
// cache: the layer's K (or V) cells; token t goes to cell first_cell + t. Device pointers.
void kv_write_cuda(KvType type, const float* src, uint8_t* cache, uint32_t first_cell,
                   uint32_t n_tokens, uint32_t n_values, cudaStream_t stream);

}  // namespace spillway
