#pragma once
// The Llama/Qwen2 forward pass on the CPU, in f32: embeddings -> n_layer x (RMSNorm,
// QKV (+bias), RoPE, KV write, GQA attention over the cache, output proj, residual,
// RMSNorm, SwiGLU FFN, residual) -> final norm -> head. One call evaluates a chunk of
// consecutive positions (prefill) or one token (decode) into a preallocated state: a
// call allocates nothing.
#include <cstdint>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/thread_pool.h"
#include "kv/kv_cache.h"

namespace spillway {

struct CpuForwardState {
    uint32_t max_tokens = 0;   // largest chunk one call may evaluate
    bool all_logits = false;   // logits for every token of a chunk, or only for its last
    unsigned n_threads = 1;
    uint32_t max_splits = 1;   // attention cell-range splits per (token, KV head)
    std::vector<float> x;          // [max_tokens][n_embd] residual stream
    std::vector<float> xn;         // [max_tokens][n_embd] normed input
    std::vector<float> q, k, v;    // [max_tokens][n_head*dk], [..][n_kv*dk], [..][n_kv*dv]
    std::vector<float> attn;       // [max_splits][max_tokens][n_head*dv] partials; split 0 = result
    std::vector<float> attn_lse;   // [max_splits][max_tokens][n_head]
    std::vector<float> gate, up;   // [max_tokens][n_ff]
    std::vector<float> rope_cos, rope_sin;  // [max_tokens][n_dims/2]
    std::vector<float> scratch;    // [n_threads][max(n_embd, n_ff, n_head*dv)] dequantised rows
    std::vector<float> logits;     // [all_logits ? max_tokens : 1][n_vocab]
};

CpuForwardState make_forward_state(const CpuModel& model, uint32_t max_tokens, bool all_logits,
                                   unsigned n_threads);

// Evaluates tokens[0..n) at positions pos0..pos0+n-1, writing their K/V into those cells.
// Afterwards state.logits holds row i for token i (all_logits) or the last token's row.
// Throws spillway::Error on a token id outside the vocabulary or a position past the cache.
void forward_cpu(const CpuModel& model, KvCache& cache, CpuForwardState& state, ThreadPool& pool,
                 const int32_t* tokens, uint32_t n_tokens, uint32_t pos0);

}  // namespace spillway
