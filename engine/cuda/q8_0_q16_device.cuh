#pragma once
// Device side of the Q8_0 x int16-activation product shared by the decode GEMVs
// (matvec.cu's q16x kernel, decode_layer.cu): 8 consecutive weights of one row against 8
// int16 x values, with the lane roles both kernels use. 8 lanes share a 68-byte block pair
// (two Q8_0 blocks of 32: f16 scale + 32 int8 each) held in shared memory as 17 words;
// lanes t = 0..3 take block A's weights 8t..8t+7, lanes 4..7 block B's. Block A's int8 are
// two bytes off word alignment, so each lane loads 3 whole words and realigns them with one
// byte permute per 4 weights: every shared-memory load is a full 32-bit word.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

// Per-lane constants of a pair's 8-lane group (t = lane % 8).
struct Q8PairLane {
    uint32_t t, col_in_pair, realign, scale_shift;
    bool in_a;
};

__device__ __forceinline__ Q8PairLane q8_pair_lane(uint32_t lane) {
    Q8PairLane l;
    l.t = lane % 8;
    l.in_a = l.t < 4;
    l.col_in_pair = (l.in_a ? 0 : 32) + (l.t % 4) * 8;
    l.realign = l.in_a ? 0x5432u : 0x7654u;
    l.scale_shift = l.in_a ? 0 : 16;
    return l;
}

// The sum of v over the warp (every lane gets it): a GEMV row's partial sums.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// acc + sum of 8 int16 x values times 8 int8 weights: x values 0,1 | 2,3 | 4,5 | 6,7 are the
// int16 pairs xv.x .. xv.w; weights 0-3 are the bytes of q0, 4-7 of q1 (dp2a lo: bytes 0-1,
// hi: bytes 2-3).
__device__ __forceinline__ int dot8_q16_q8(uint4 xv, int q0, int q1, int acc) {
    acc = __dp2a_lo((int)xv.x, q0, acc);
    acc = __dp2a_hi((int)xv.y, q0, acc);
    acc = __dp2a_lo((int)xv.z, q1, acc);
    return __dp2a_hi((int)xv.w, q1, acc);
}

// acc + d_w * xs * sum(w_i * x_i) over the lane's 8 weights of the pair at pw (17 words);
// xv: the 8 int16 x values (pairs .x .. .w), xs: their block's scale.
__device__ __forceinline__ float q8_pair_dot(const uint32_t* pw, const Q8PairLane& l, uint4 xv, float xs, float acc) {
    const uint32_t w0 = pw[2 * l.t], w1 = pw[2 * l.t + 1], w2 = pw[2 * l.t + 2];
    const uint32_t dw = pw[l.in_a ? 0 : 8];
    const int q0 = (int)__byte_perm(w0, w1, l.realign);
    const int q1 = (int)__byte_perm(w1, w2, l.realign);
    const float d = __half2float(__ushort_as_half((unsigned short)(dw >> l.scale_shift)));
    const int isum = dot8_q16_q8(xv, q0, q1, 0);
    return fmaf(d * xs, (float)isum, acc);
}

}  // namespace spillway
