#pragma once
// How a Q8_0 decode GEMV's rows are cut between warps: the q16x matvec (matvec.cu) and the
// persistent layer kernel (decode_layer.cu) use the same geometry.
//
// A warp streams row pairs (two rows sharing each x load) in chunks of up to 32 block pairs
// (2176 bytes per row; the last chunk of a row shorter). The unit of the cut is a quad: 4
// block pairs = 256 columns, 272 bytes per row, the finest cut that keeps every 16-byte copy
// aligned. Three ways to hand out the matrix's row pairs x quads:
//   pairs  - whole row pairs per warp (floor or ceil of the average);
//   chunks - whole chunks per warp: equal chunk counts, but a row's short last chunk makes
//            the bytes unequal (5120 columns: chunks of 32, 32 and 16 block pairs);
//   quads  - equal quads per warp (within one quad), the row pairs cut anywhere on a quad.
// With a cut, a row pair is shared by two warps: the later one computes its part first and
// publishes it; the earlier one adds it at its end (the kernels' carry slots). A split that
// cuts is only used when every warp gets at least a whole row pair's worth of quads, so no
// row pair spans three warps.
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

enum class Q16xSplit : uint32_t { pairs, chunks, quads };

constexpr uint32_t kQ16xChunkQuads = 8;   // 32 block pairs
constexpr uint32_t kQ16xQuadBytes = 272;  // one row's 4 block pairs

struct Q16xShare {
    uint32_t qpr, cpr;          // quads and chunks per row pair
    uint32_t q0, q1;            // this warp's quads [q0, q1) of the row pairs x quads sequence
    uint32_t c0, n_chunks;      // the chunks (rp * cpr + ci) those quads touch
    bool starts_cut, ends_cut;  // first / last row pair shared with the previous / next warp
};

// One chunk of a share: row pair rp, chunk ci of that row pair, its quads [lo, hi) (0..8);
// ends_pair: the chunk completes its row pair (the row's sums are whole, or the warp's part
// of a pair cut at its start is).
struct Q16xChunk {
    uint32_t rp, ci, lo, hi;
    bool ends_pair;
};

__host__ __device__ inline uint32_t q16x_chunks_per_row(uint32_t qpr) {
    return (qpr + kQ16xChunkQuads - 1) / kQ16xChunkQuads;
}

// The first quad of chunk c of the whole sequence (c = rp * cpr + ci; c may be one past the end).
__host__ __device__ inline uint32_t q16x_chunk_start(uint32_t c, uint32_t qpr, uint32_t cpr) {
    const uint32_t ci = c % cpr;
    return (c / cpr) * qpr + (ci * kQ16xChunkQuads < qpr ? ci * kQ16xChunkQuads : qpr);
}

// Whether a cutting split keeps every row pair within two warps (see above).
__host__ __device__ inline bool q16x_cut_allowed(Q16xSplit split, uint32_t n_pairs, uint32_t qpr, uint32_t n_warps) {
    const uint64_t cpr = q16x_chunks_per_row(qpr);
    if (split == Q16xSplit::chunks) return (uint64_t)n_pairs * cpr / n_warps >= cpr;
    return (uint64_t)n_pairs * qpr / n_warps >= qpr;
}

// Warp gw's share out of n_warps (gw >= n_warps: an empty share). The caller picks a cutting
// split only where q16x_cut_allowed says so.
__host__ __device__ inline Q16xShare q16x_share(Q16xSplit split, uint32_t n_pairs, uint32_t cols, uint32_t gw,
                                                uint32_t n_warps) {
    Q16xShare s;
    s.qpr = cols / 256;
    s.cpr = q16x_chunks_per_row(s.qpr);
    const uint32_t total = n_pairs * s.qpr;
    s.q0 = s.q1 = total;
    if (gw < n_warps) {
        if (split == Q16xSplit::quads) {
            s.q0 = (uint32_t)((uint64_t)gw * total / n_warps);
            s.q1 = (uint32_t)((uint64_t)(gw + 1) * total / n_warps);
        } else if (split == Q16xSplit::chunks) {
            const uint64_t chunks = (uint64_t)n_pairs * s.cpr;
            s.q0 = q16x_chunk_start((uint32_t)(gw * chunks / n_warps), s.qpr, s.cpr);
            s.q1 = q16x_chunk_start((uint32_t)((gw + 1) * chunks / n_warps), s.qpr, s.cpr);
        } else {
            s.q0 = (uint32_t)((uint64_t)gw * n_pairs / n_warps) * s.qpr;
            s.q1 = (uint32_t)((uint64_t)(gw + 1) * n_pairs / n_warps) * s.qpr;
        }
    }
    const bool any = s.q1 > s.q0;
    s.c0 = (s.q0 / s.qpr) * s.cpr + (s.q0 % s.qpr) / kQ16xChunkQuads;
    const uint32_t last = any ? ((s.q1 - 1) / s.qpr) * s.cpr + ((s.q1 - 1) % s.qpr) / kQ16xChunkQuads : s.c0;
    s.n_chunks = any ? last - s.c0 + 1 : 0;
    s.starts_cut = any && s.q0 % s.qpr != 0;
    s.ends_cut = any && s.q1 % s.qpr != 0;
    return s;
}

// Chunk k (< n_chunks) of a share.
__host__ __device__ inline Q16xChunk q16x_chunk(const Q16xShare& s, uint32_t k) {
    Q16xChunk c;
    const uint32_t g = s.c0 + k;
    c.rp = g / s.cpr;
    c.ci = g % s.cpr;
    const uint32_t base = c.rp * s.qpr + c.ci * kQ16xChunkQuads;
    const uint32_t full = s.qpr - c.ci * kQ16xChunkQuads < kQ16xChunkQuads ? s.qpr - c.ci * kQ16xChunkQuads
                                                                           : kQ16xChunkQuads;
    c.lo = s.q0 > base ? s.q0 - base : 0;
    c.hi = s.q1 - base < full ? s.q1 - base : full;
    c.ends_pair = c.ci == s.cpr - 1 && c.hi == full;
    return c;
}

}  // namespace spillway
