#pragma once
// Greedy sampling on the GPU: the index of the largest logit, the first on ties; NaN counts as
// -inf (it never wins); all NaN / -inf gives 0. One launch of many blocks, the last block to
// finish reducing the blocks' candidates in block order (so the result does not depend on
// which block ends last).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/cuda_check.h"

namespace spillway {

// Per-block candidates and the arrival count of one argmax launch at a time. The count is
// zero between launches (the last block rearms it); make_argmax_scratch zeroes it.
struct ArgmaxScratch {
    DeviceBuffer<float> values;
    DeviceBuffer<int32_t> indices;
    DeviceBuffer<uint32_t> arrivals;
};
ArgmaxScratch make_argmax_scratch();

// out[0] := argmax of logits[0 .. n). n >= 1. Launches on `stream`; scratch serves one launch
// at a time (launches on one stream, or a graph's nodes in order).
void argmax_cuda(const float* logits, uint32_t n, int32_t* out, const ArgmaxScratch& scratch, cudaStream_t stream);

}  // namespace spillway
