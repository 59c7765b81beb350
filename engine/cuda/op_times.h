// Where a prefill forward's GPU time goes, op group by op group (a lab tool).
//
// SPILLWAY_OP_TIMES=1: forward_cuda records an event after each op group of a chunk (T > 1;
// decode steps, which run as graphs, are not timed), waits for the chunk at its end, sums the
// intervals per label and prints the totals to stderr when the process exits. The events and
// the per-chunk wait cost a little; the shares are what it is for. SPILLWAY_OP_TIMES=2 also
// waits for the stream at every mark: each op timed alone, without its neighbours running
// beside it (the side stream's dequantization, the tail of the previous kernel). Off: every
// call is a branch on a cached flag.
#pragma once

#include <cuda_runtime.h>

namespace spillway {

bool op_times_enabled();
// Start of a timed forward on this stream (records the first event).
void op_times_begin(cudaStream_t stream);
// The GPU time since the previous mark (or begin) is charged to `label` (a string literal).
void op_times_mark(const char* label, cudaStream_t stream);
// End of the forward: waits for the stream and adds the intervals to the totals.
void op_times_end(cudaStream_t stream);
// A forward that failed part-way: drops its marks (later work on the stream is not timed).
void op_times_cancel(cudaStream_t stream);

}  // namespace spillway
