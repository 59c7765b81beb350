#pragma once
// TMA tensor maps (sm_90), encoded on the host through the driver's cuTensorMapEncodeTiled,
// found at run time (cudaGetDriverEntryPointByVersion) so that nothing links libcuda.
// Internal to engine/cuda.
#include <cuda.h>

#include <cstdint>

namespace spillway {

// True when the driver gives us its tensor-map encoder (CUDA 12.0+).
bool tensor_map_encoder_available();

// A 2-D map over a row-major tensor of `rows` rows of `cols` elements, `row_bytes` apart
// (a multiple of 16; `base` 16-byte aligned), read in boxes of box_cols x box_rows with the
// given swizzle; elements outside the tensor arrive as zeros. Fails (spillway::fail, naming
// `who`) when the driver refuses the map.
CUtensorMap tensor_map_2d(const void* base, CUtensorMapDataType type, uint64_t cols, uint64_t rows,
                          uint64_t row_bytes, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle,
                          const char* who);

}  // namespace spillway
