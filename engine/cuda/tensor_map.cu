#include "engine/cuda/tensor_map.cuh"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "common/error.h"

namespace spillway {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    return encode;
}

}  // namespace

bool tensor_map_encoder_available() { return tensor_map_encoder() != nullptr; }

CUtensorMap tensor_map_2d(const void* base, CUtensorMapDataType type, uint64_t cols, uint64_t rows,
                          uint64_t row_bytes, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle,
                          const char* who) {
    if (!tensor_map_encoder_available()) fail(std::string(who) + ": no tensor-map encoder in this driver");
    CUtensorMap map;
    const cuuint64_t dims[2] = {cols, rows > 0 ? rows : 1};
    const cuuint64_t strides[1] = {row_bytes};
    const cuuint32_t box[2] = {box_cols, box_rows};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = tensor_map_encoder()(&map, type, 2, const_cast<void*>(base), dims, strides, box,
                                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        fail(std::string(who) + ": cuTensorMapEncodeTiled failed with CUresult " + std::to_string((int)r));
    return map;
}

}  // namespace spillway
