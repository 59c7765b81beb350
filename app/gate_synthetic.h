#pragma once
// `spillway gate --cells --synthetic PRESET`: the spec's four cells on a model shape with
// random weights built on the GPU (the 14B shape needs no file). Random weights retrieve
// nothing, so only the speed columns exist: decode tok/s of each cell at depth
// ctx - steps - 1, measured by the CUDA bench with the planner's window.
#include "app/args.h"

namespace spillway {

int gate_cells_synthetic(const ArgParser& args, bool json);

}  // namespace spillway
