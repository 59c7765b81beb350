#pragma once
// The GPU's energy counter and SM clock through NVML, loaded at run time (libnvidia-ml.so.1 comes
// with the driver; the toolkit here ships no NVML header or stub), for the benchmarks' energy
// columns. Why: the 14B prefill runs at the card's power cap (perf-notes, session 50), so a
// kernel's speed there follows its energy per flop, which a row should show beside its time.
// Every reading is optional: no driver library, no counter (older GPUs) or any NVML error gives
// nullopt, and the benchmark prints "-".
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

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
    friend class EnergyWindow;
    using Device = void*;  // nvmlDevice_t
    void* lib_ = nullptr;
    Device device_ = nullptr;
    int (*energy_)(Device, unsigned long long*) = nullptr;
    int (*clock_)(Device, int, unsigned int*) = nullptr;
};

// Mean power and SM clock while a workload runs, from a thread that polls the counter. Why not
// two readings around the runs: the counter moves in steps tens of ms apart (session 51, H100: a
// 0.2 s window read 537-2376 W beside a 700 W cap), so the window here is measured between two
// of its steps, both inside the busy time, and the first `settle` of it is skipped (clocks and
// power ramp up).
class EnergyWindow {
public:
    explicit EnergyWindow(const GpuEnergy& energy, std::chrono::milliseconds settle = std::chrono::milliseconds(100))
        : energy_(energy), settle_(settle) {
        if (!energy_.joules()) return;
        start_ = Clock::now();
        poller_ = std::thread([this] { poll(); });
    }
    EnergyWindow(const EnergyWindow&) = delete;
    EnergyWindow& operator=(const EnergyWindow&) = delete;
    ~EnergyWindow() { stop(); }

    // Call when the workload has finished (synchronised). Nullopt without the counter or with
    // fewer than two steps of it after the settle time.
    struct Reading {
        double watts = 0;
        double seconds = 0;                 // between the two counter steps used
        std::optional<unsigned> sm_mhz;     // mean of the clock samples in that span
    };
    std::optional<Reading> finish() {
        stop();
        const auto from = start_ + settle_;
        const Step* first = nullptr;
        const Step* last = nullptr;
        for (const Step& s : steps_) {
            if (s.at < from) continue;
            if (first == nullptr) first = &s;
            last = &s;
        }
        if (first == nullptr || last == first) return std::nullopt;
        Reading r;
        r.seconds = std::chrono::duration<double>(last->at - first->at).count();
        if (r.seconds <= 0 || last->joules <= first->joules) return std::nullopt;
        r.watts = (last->joules - first->joules) / r.seconds;
        double sum = 0;
        int n = 0;
        for (const ClockSample& c : clocks_)
            if (c.at >= first->at && c.at <= last->at) sum += c.mhz, ++n;
        if (n > 0) r.sm_mhz = (unsigned)(sum / n + 0.5);
        return r;
    }

private:
    using Clock = std::chrono::steady_clock;
    struct Step {
        Clock::time_point at;
        double joules;
    };
    struct ClockSample {
        Clock::time_point at;
        unsigned mhz;
    };
    void poll() {
        double prev = -1;
        auto next_clock = Clock::now();
        while (!done_.load(std::memory_order_relaxed)) {
            const auto now = Clock::now();
            if (const std::optional<double> j = energy_.joules(); j && *j != prev) {
                steps_.push_back({now, *j});
                prev = *j;
            }
            if (now >= next_clock) {
                if (const std::optional<unsigned> mhz = energy_.sm_clock_mhz()) clocks_.push_back({now, *mhz});
                next_clock = now + std::chrono::milliseconds(5);
            }
            std::this_thread::sleep_for(std::chrono::microseconds(500));
        }
    }
    void stop() {
        done_.store(true, std::memory_order_relaxed);
        if (poller_.joinable()) poller_.join();
    }
    const GpuEnergy& energy_;
    std::chrono::milliseconds settle_;
    Clock::time_point start_;
    std::atomic<bool> done_{false};
    std::thread poller_;
    std::vector<Step> steps_;
    std::vector<ClockSample> clocks_;
};

}  // namespace spillway
