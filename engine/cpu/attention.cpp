#include "engine/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "engine/cpu/attention_ranges.h"
#include "kv/kv_codec.h"

namespace spillway {
namespace {

// Query heads of one KV head are processed together so each K and V row is read once per
// group (GQA); the running softmax state lives on the stack, in chunks of this many heads.
constexpr uint32_t kHeadChunk = 16;

void check_shape(const AttentionShape& s) {
    if (s.n_head == 0 || s.n_head_kv == 0 || s.n_head % s.n_head_kv != 0)
        fail("attention: n_head must be a positive multiple of n_head_kv");
    if (s.head_dim_k == 0 || s.head_dim_v == 0 || s.head_dim_k % 32 != 0 || s.head_dim_v % 32 != 0)
        fail("attention: head dims must be positive multiples of 32");
}

}  // namespace

void attention_partial_cpu_kv_heads(const AttentionShape& s, const float* q, KvFormat k_type,
                                    const uint8_t* k_cells, KvFormat v_type, const uint8_t* v_cells,
                                    uint32_t n_cells, uint32_t kv_head_begin, uint32_t kv_head_end,
                                    float* out, float* lse) {
    check_shape(s);
    const uint32_t group = s.n_head / s.n_head_kv;
    const uint64_t k_row = kv_bytes(k_type, (uint64_t)s.n_head_kv * s.head_dim_k);
    const uint64_t v_row = kv_bytes(v_type, (uint64_t)s.n_head_kv * s.head_dim_v);
    const uint64_t k_head = kv_bytes(k_type, s.head_dim_k);
    const uint64_t v_head = kv_bytes(v_type, s.head_dim_v);
    const float neg_inf = -std::numeric_limits<float>::infinity();

    for (uint32_t g = kv_head_begin; g < kv_head_end; ++g) {
        for (uint32_t h0 = g * group; h0 < (g + 1) * group; h0 += kHeadChunk) {
            const uint32_t nh = std::min(kHeadChunk, (g + 1) * group - h0);
            float running_max[kHeadChunk];
            float running_sum[kHeadChunk];
            for (uint32_t j = 0; j < nh; ++j) {
                running_max[j] = neg_inf;
                running_sum[j] = 0.0f;
                std::fill_n(out + (uint64_t)(h0 + j) * s.head_dim_v, s.head_dim_v, 0.0f);
            }
            for (uint32_t c = 0; c < n_cells; ++c) {
                const uint8_t* k = k_cells + c * k_row + g * k_head;
                const uint8_t* v = v_cells + c * v_row + g * v_head;
                for (uint32_t j = 0; j < nh; ++j) {
                    const float* qh = q + (uint64_t)(h0 + j) * s.head_dim_k;
                    float* oh = out + (uint64_t)(h0 + j) * s.head_dim_v;
                    const float score = s.scale * kv_dot(k_type, k, qh, s.head_dim_k);
                    if (score > running_max[j]) {
                        // Online softmax: rescale what was accumulated under the old max.
                        const float rescale = std::exp(running_max[j] - score);
                        if (running_sum[j] > 0.0f) {
                            running_sum[j] *= rescale;
                            for (uint32_t d = 0; d < s.head_dim_v; ++d) oh[d] *= rescale;
                        }
                        running_max[j] = score;
                    }
                    const float p = std::exp(score - running_max[j]);
                    running_sum[j] += p;
                    kv_axpy(v_type, v, p, oh, s.head_dim_v);
                }
            }
            for (uint32_t j = 0; j < nh; ++j) {
                float* oh = out + (uint64_t)(h0 + j) * s.head_dim_v;
                if (running_sum[j] > 0.0f) {
                    const float inv = 1.0f / running_sum[j];
                    for (uint32_t d = 0; d < s.head_dim_v; ++d) oh[d] *= inv;
                    lse[h0 + j] = running_max[j] + std::log(running_sum[j]);
                } else {
                    lse[h0 + j] = neg_inf;
                }
            }
        }
    }
}

void attention_partial_cpu(const AttentionShape& shape, const float* q, KvType k_type,
                           const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                           uint32_t n_cells, float* out, float* lse) {
    attention_partial_cpu_kv_heads(shape, q, kv_format(k_type), k_cells, kv_format(v_type), v_cells, n_cells, 0,
                                   shape.n_head_kv, out, lse);
}

void attention_merge_cpu(uint32_t n_head, uint32_t head_dim_v, float* out_a, float* lse_a,
                         const float* out_b, const float* lse_b) {
    for (uint32_t h = 0; h < n_head; ++h) {
        float* a = out_a + (uint64_t)h * head_dim_v;
        const float* b = out_b + (uint64_t)h * head_dim_v;
        if (std::isinf(lse_b[h]) && lse_b[h] < 0) continue;  // b is empty: identity
        if (std::isinf(lse_a[h]) && lse_a[h] < 0) {          // a is empty: take b
            std::copy_n(b, head_dim_v, a);
            lse_a[h] = lse_b[h];
            continue;
        }
        const float m = std::max(lse_a[h], lse_b[h]);
        const float wa = std::exp(lse_a[h] - m);
        const float wb = std::exp(lse_b[h] - m);
        const float inv = 1.0f / (wa + wb);
        for (uint32_t d = 0; d < head_dim_v; ++d) a[d] = (wa * a[d] + wb * b[d]) * inv;
        lse_a[h] = m + std::log(wa + wb);
    }
}

}  // namespace spillway
