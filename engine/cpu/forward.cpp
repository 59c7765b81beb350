#include "engine/cpu/forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "engine/cpu/attention_ranges.h"
#include "engine/cpu/rmsnorm.h"
#include "engine/cpu/swiglu.h"

namespace spillway {
namespace {

// Below this many cells per piece, splitting a (token, KV head) across threads costs more
// in merges than it saves.
constexpr uint32_t kMinCellsPerSplit = 64;

void attention_layer(const CpuModel& m, const KvCache& cache, CpuForwardState& st, ThreadPool& pool,
                     uint32_t layer, uint32_t n_tokens, uint32_t pos0) {
    const ModelSpec& s = m.spec;
    const AttentionShape shape{s.n_head, m.n_head_kv, s.head_dim_k, s.head_dim_v,
                               1.0f / std::sqrt((float)s.head_dim_k)};
    const uint32_t n_kv = m.n_head_kv, group = s.n_head / n_kv;
    const uint64_t q_stride = (uint64_t)s.n_head * s.head_dim_k;
    const uint64_t out_stride = (uint64_t)s.n_head * s.head_dim_v;
    const uint64_t split_stride = out_stride * st.max_tokens;
    const uint64_t lse_split_stride = (uint64_t)s.n_head * st.max_tokens;

    // Decode with few KV heads would leave threads idle: split the cells of each
    // (token, KV head) into ranges and merge the partials (the flash-decoding split).
    uint32_t splits = 1;
    const uint32_t items = n_tokens * n_kv;
    if (items < st.n_threads) {
        const uint32_t longest = pos0 + n_tokens;
        splits = std::min({st.max_splits, (st.n_threads + items - 1) / items,
                           std::max(1u, longest / kMinCellsPerSplit)});
    }
    const uint8_t* k_cells = kv_k_cells(cache, layer, 0);
    const uint8_t* v_cells = kv_v_cells(cache, layer, 0);
    const uint64_t k_row = kv_k_row_bytes(cache, layer), v_row = kv_v_row_bytes(cache, layer);

    pool.parallel_for((size_t)items * splits, [&](size_t begin, size_t end, unsigned) {
        for (size_t item = begin; item < end; ++item) {
            const uint32_t split = (uint32_t)(item % splits);
            const uint32_t g = (uint32_t)(item / splits % n_kv);
            const uint32_t t = (uint32_t)(item / splits / n_kv);
            const uint32_t n_cells = pos0 + t + 1;  // causal: the token sees itself and all before
            const uint32_t c0 = (uint32_t)((uint64_t)n_cells * split / splits);
            const uint32_t c1 = (uint32_t)((uint64_t)n_cells * (split + 1) / splits);
            attention_partial_cpu_kv_heads(shape, st.q.data() + t * q_stride, cache.k_format, k_cells + c0 * k_row,
                                           cache.v_format, v_cells + c0 * v_row, c1 - c0, g, g + 1,
                                           st.attn.data() + split * split_stride + t * out_stride,
                                           st.attn_lse.data() + split * lse_split_stride + (uint64_t)t * s.n_head);
        }
    });
    if (splits > 1) {
        pool.parallel_for(items, [&](size_t begin, size_t end, unsigned) {
            for (size_t item = begin; item < end; ++item) {
                const uint32_t g = (uint32_t)(item % n_kv), t = (uint32_t)(item / n_kv);
                const uint32_t h0 = g * group;
                float* out = st.attn.data() + t * out_stride + (uint64_t)h0 * s.head_dim_v;
                float* lse = st.attn_lse.data() + (uint64_t)t * s.n_head + h0;
                for (uint32_t split = 1; split < splits; ++split)
                    attention_merge_cpu(group, s.head_dim_v, out, lse, out + split * split_stride,
                                        lse + split * lse_split_stride);
            }
        });
    }
}

}  // namespace

CpuForwardState make_forward_state(const CpuModel& m, uint32_t max_tokens, bool all_logits, unsigned n_threads) {
    if (max_tokens == 0) fail("forward state: max_tokens must be at least 1");
    const ModelSpec& s = m.spec;
    CpuForwardState st;
    st.max_tokens = max_tokens;
    st.all_logits = all_logits;
    st.n_threads = std::max(1u, n_threads);
    st.max_splits = st.n_threads;
    const size_t T = max_tokens;
    st.x.resize(T * s.n_embd);
    st.xn.resize(T * s.n_embd);
    st.q.resize(T * s.n_head * s.head_dim_k);
    st.k.resize(T * m.n_head_kv * s.head_dim_k);
    st.v.resize(T * m.n_head_kv * s.head_dim_v);
    st.attn.resize((size_t)st.max_splits * T * s.n_head * s.head_dim_v);
    st.attn_lse.resize((size_t)st.max_splits * T * s.n_head);
    st.gate.resize(T * s.n_ff);
    st.up.resize(T * s.n_ff);
    st.rope_cos.resize(T * std::max(1u, m.rope.n_dims / 2));
    st.rope_sin.resize(T * std::max(1u, m.rope.n_dims / 2));
    const size_t widest_in = std::max({(size_t)s.n_embd, (size_t)s.n_ff, (size_t)s.n_head * s.head_dim_v});
    st.scratch.resize(st.n_threads * widest_in);
    st.logits.resize((all_logits ? T : 1) * (size_t)s.n_vocab);
    return st;
}

void forward_cpu(const CpuModel& m, KvCache& cache, CpuForwardState& st, ThreadPool& pool,
                 const int32_t* tokens, uint32_t n_tokens, uint32_t pos0) {
    const ModelSpec& s = m.spec;
    if (n_tokens == 0) return;
    if (n_tokens > st.max_tokens) fail("forward: chunk larger than the state was made for");
    if (pool.size() > st.n_threads) fail("forward: thread pool larger than the state was made for");
    if ((uint64_t)pos0 + n_tokens > cache.n_ctx)
        fail("forward: positions up to " + std::to_string(pos0 + n_tokens) + " exceed the context of " +
             std::to_string(cache.n_ctx));
    const uint32_t E = s.n_embd, F = s.n_ff;
    const uint32_t q_dim = s.n_head * s.head_dim_k, k_dim = m.n_head_kv * s.head_dim_k,
                   v_dim = m.n_head_kv * s.head_dim_v, attn_dim = s.n_head * s.head_dim_v;
    const uint32_t half = m.rope.n_dims / 2;

    for (uint32_t t = 0; t < n_tokens; ++t) {
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= s.n_vocab)
            fail("token id " + std::to_string(tokens[t]) + " outside the vocabulary of " + std::to_string(s.n_vocab));
        weight_row_f32(m.token_embd, (uint32_t)tokens[t], st.x.data() + (size_t)t * E);
        rope_angles(m.rope, pos0 + t, st.rope_cos.data() + (size_t)t * half, st.rope_sin.data() + (size_t)t * half);
    }
    float* scratch = st.scratch.data();
    auto norm_rows = [&](const std::vector<float>& weight) {
        pool.parallel_for(n_tokens, [&](size_t b, size_t e, unsigned) {
            for (size_t t = b; t < e; ++t) rmsnorm_cpu(st.x.data() + t * E, weight.data(), st.xn.data() + t * E, E, s.norm_eps);
        });
    };

    for (uint32_t il = 0; il < s.n_layer; ++il) {
        const CpuLayerWeights& L = m.layers[il];
        norm_rows(L.attn_norm);
        const bool bias = !L.bq.empty();
        matmul_cpu(pool, L.wq, st.xn.data(), n_tokens, bias ? L.bq.data() : nullptr, st.q.data(), scratch);
        matmul_cpu(pool, L.wk, st.xn.data(), n_tokens, bias ? L.bk.data() : nullptr, st.k.data(), scratch);
        matmul_cpu(pool, L.wv, st.xn.data(), n_tokens, bias ? L.bv.data() : nullptr, st.v.data(), scratch);
        pool.parallel_for(n_tokens, [&](size_t b, size_t e, unsigned) {
            for (size_t t = b; t < e; ++t) {
                const float* c = st.rope_cos.data() + t * half;
                const float* sn = st.rope_sin.data() + t * half;
                rope_apply_cpu(m.rope, c, sn, st.q.data() + t * q_dim, s.n_head, s.head_dim_k);
                rope_apply_cpu(m.rope, c, sn, st.k.data() + t * k_dim, m.n_head_kv, s.head_dim_k);
                // The chunk's K/V go into the cache first, so prefill reads them back through
                // the same quantization as a later decode step would.
                kv_write_cell(cache, il, pos0 + (uint32_t)t, st.k.data() + t * k_dim, st.v.data() + t * v_dim);
            }
        });
        attention_layer(m, cache, st, pool, il, n_tokens, pos0);
        // Output projection into xn (free now), then the residual add.
        matmul_cpu(pool, L.wo, st.attn.data(), n_tokens, nullptr, st.xn.data(), scratch);
        for (size_t i = 0; i < (size_t)n_tokens * E; ++i) st.x[i] += st.xn[i];
        (void)attn_dim;

        norm_rows(L.ffn_norm);
        matmul_cpu(pool, L.ffn_gate, st.xn.data(), n_tokens, nullptr, st.gate.data(), scratch);
        matmul_cpu(pool, L.ffn_up, st.xn.data(), n_tokens, nullptr, st.up.data(), scratch);
        pool.parallel_for(n_tokens, [&](size_t b, size_t e, unsigned) {
            for (size_t t = b; t < e; ++t)
                swiglu_cpu(st.gate.data() + t * F, st.up.data() + t * F, st.gate.data() + t * F, F);
        });
        matmul_cpu(pool, L.ffn_down, st.gate.data(), n_tokens, nullptr, st.xn.data(), scratch);
        for (size_t i = 0; i < (size_t)n_tokens * E; ++i) st.x[i] += st.xn[i];
    }

    // Head: every token's logits, or only the last token's.
    const uint32_t first = st.all_logits ? 0 : n_tokens - 1;
    const uint32_t n_out = n_tokens - first;
    for (uint32_t t = first; t < n_tokens; ++t)
        rmsnorm_cpu(st.x.data() + (size_t)t * E, m.output_norm.data(), st.xn.data() + (size_t)(t - first) * E, E,
                    s.norm_eps);
    matmul_cpu(pool, m.output, st.xn.data(), n_out, nullptr, st.logits.data(), scratch);
}

}  // namespace spillway
