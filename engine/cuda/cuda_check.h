#pragma once
// The one checked-call helper of the CUDA engine, and plain RAII owners for device and
// pinned host memory. Every CUDA runtime / cuBLAS call and every kernel launch goes
// through SPILLWAY_CUDA_CHECK so a failure names the file, line and call that failed.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "common/error.h"

namespace spillway {

[[noreturn]] inline void cuda_fail(const char* what, const char* detail, const char* file, int line) {
    fail(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " + detail);
}

inline void cuda_check(cudaError_t status, const char* what, const char* file, int line) {
    if (status != cudaSuccess) cuda_fail(what, cudaGetErrorString(status), file, line);
}

inline void cuda_check(cublasStatus_t status, const char* what, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) cuda_fail(what, cublasGetStatusString(status), file, line);
}

// Launchers call SPILLWAY_CUDA_CHECK(cudaGetLastError()) right after each launch.
#define SPILLWAY_CUDA_CHECK(call) ::spillway::cuda_check((call), #call, __FILE__, __LINE__)

// Owns `count` elements of device memory (uninitialised). Move-only.
template <typename T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t count) : count_(count) {
        if (count > 0) SPILLWAY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
    }
    DeviceBuffer(DeviceBuffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
        if (this != &other) {
            release();
            data_ = std::exchange(other.data_, nullptr);
            count_ = std::exchange(other.count_, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { release(); }

    T* data() const { return data_; }
    size_t size() const { return count_; }
    size_t bytes() const { return count_ * sizeof(T); }

private:
    void release() {
        if (data_ != nullptr) cudaFree(data_);  // never throws from a destructor
        data_ = nullptr;
        count_ = 0;
    }
    T* data_ = nullptr;
    size_t count_ = 0;
};

// Owns `bytes` of page-locked host memory, the only kind the copy engine streams at full
// PCIe speed (pageable memory is 5-8x slower, see DESIGN.md). Move-only.
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
        if (bytes > 0) SPILLWAY_CUDA_CHECK(cudaMallocHost(&data_, bytes));
    }
    PinnedBuffer(PinnedBuffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
    PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
        if (this != &other) {
            release();
            data_ = std::exchange(other.data_, nullptr);
            bytes_ = std::exchange(other.bytes_, 0);
        }
        return *this;
    }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    ~PinnedBuffer() { release(); }

    void* data() const { return data_; }
    size_t bytes() const { return bytes_; }

private:
    void release() {
        if (data_ != nullptr) cudaFreeHost(data_);
        data_ = nullptr;
        bytes_ = 0;
    }
    void* data_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace spillway
