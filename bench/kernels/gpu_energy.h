#pragma once
// The GPU's energy counter and SM clock through NVML, loaded at run time (libnvidia-ml.so.1 comes
// with the driver; the toolkit here ships no NVML header or stub), for the benchmarks' energy
// columns. Why: the 14B prefill runs at the card's power cap (perf-notes, session 50), so a
// kernel's speed there follows its energy per flop, which a row should show beside its time.
// Every reading is optional: no driver library, no counter (older GPUs) or any NVML error gives
// nullopt, and the benchmark prints "-".
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <optional>

namespace spillway {

class GpuEnergy {
public:
    // The NVML device of CUDA device `cuda_device` (matched by PCI bus id).
    explicit GpuEnergy(int cuda_device) {
        lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib_ == nullptr) return;
        const auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
        const auto by_bus = reinterpret_cast<int (*)(const char*, Device*)>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
        energy_ = reinterpret_cast<int (*)(Device, unsigned long long*)>(dlsym(lib_, "nvmlDeviceGetTotalEnergyConsumption"));
        clock_ = reinterpret_cast<int (*)(Device, int, unsigned int*)>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
        char bus[32] = {};
        if (init == nullptr || by_bus == nullptr || init() != 0 ||
            cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess || by_bus(bus, &device_) != 0)
            device_ = nullptr;
    }
    GpuEnergy(const GpuEnergy&) = delete;
    GpuEnergy& operator=(const GpuEnergy&) = delete;
    ~GpuEnergy() {
        if (lib_ != nullptr) dlclose(lib_);  // (nvmlShutdown skipped: the process ends soon after)
    }

    // Energy since the driver loaded, in joules (the counter counts millijoules).
    std::optional<double> joules() const {
        unsigned long long mj = 0;
        if (device_ == nullptr || energy_ == nullptr || energy_(device_, &mj) != 0) return std::nullopt;
        return mj * 1e-3;
    }
    // The SM clock now, in MHz.
    std::optional<unsigned> sm_clock_mhz() const {
        unsigned mhz = 0;
        constexpr int kClockSm = 1;  // NVML_CLOCK_SM
        if (device_ == nullptr || clock_ == nullptr || clock_(device_, kClockSm, &mhz) != 0) return std::nullopt;
        return mhz;
    }

private:
    using Device = void*;  // nvmlDevice_t
    void* lib_ = nullptr;
    Device device_ = nullptr;
    int (*energy_)(Device, unsigned long long*) = nullptr;
    int (*clock_)(Device, int, unsigned int*) = nullptr;
};

}  // namespace spillway
