#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/error.h"
#include "common/log.h"
#include "probe/host_probe.h"
#include "probe/probe_cache.h"

using namespace spillway;

namespace {

struct TempDir {
    std::filesystem::path path;
    TempDir() {
        path = std::filesystem::temp_directory_path() /
               ("spillway-probe-test-" + std::to_string(std::random_device{}()));
        std::filesystem::create_directories(path);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

ProbeValues random_values(std::mt19937& rng) {
    std::uniform_real_distribution<double> u(0.5, 5000.0);
    ProbeValues v;
    v.gpu_name = "Test GPU " + std::to_string(rng() % 1000);
    v.vram_total_mib = u(rng) + 10000;
    v.vram_free_mib = *v.vram_total_mib - 100;
    v.vram_bw_gbps = u(rng);
    v.pcie_h2d_gbps = u(rng) / 50;
    v.host_ram_gbps = u(rng) / 100;
    v.c_engage_ms = u(rng) / 1000;
    v.attn_ms_per_cell[KvType::q8_0] = u(rng) * 1e-7;
    return v;
}

void write_file(const std::filesystem::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
}

}  // namespace

TEST(ProbeCache, RoundTripsEveryFieldPerKey) {
    TempDir dir;
    std::mt19937 rng(std::random_device{}());
    std::string path = (dir.path / "sub" / "probes.json").string();
    ProbeCacheKey a{"GPU-aaaa", "580.1", "hk128-hv128-g5"}, b{"GPU-bbbb", "580.1", "hk128-hv128-g5"};
    ProbeValues va = random_values(rng), vb = random_values(rng);
    store_cached_probe(path, a, va);
    store_cached_probe(path, b, vb);
    auto got = load_cached_probe(path, a);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->gpu_name, va.gpu_name);
    EXPECT_DOUBLE_EQ(*got->vram_bw_gbps, *va.vram_bw_gbps);
    EXPECT_DOUBLE_EQ(*got->pcie_h2d_gbps, *va.pcie_h2d_gbps);
    EXPECT_DOUBLE_EQ(*got->host_ram_gbps, *va.host_ram_gbps);
    EXPECT_DOUBLE_EQ(*got->c_engage_ms, *va.c_engage_ms);
    EXPECT_DOUBLE_EQ(got->attn_ms_per_cell.at(KvType::q8_0), va.attn_ms_per_cell.at(KvType::q8_0));
    EXPECT_DOUBLE_EQ(*load_cached_probe(path, b)->vram_bw_gbps, *vb.vram_bw_gbps);
    // Another driver or another attention shape is a miss: it must be measured again.
    EXPECT_FALSE(load_cached_probe(path, {"GPU-aaaa", "581.0", "hk128-hv128-g5"}).has_value());
    EXPECT_FALSE(load_cached_probe(path, {"GPU-aaaa", "580.1", "hk64-hv64-g1"}).has_value());
}

TEST(ProbeCache, CorruptOrStaleFilesAreMissesNotErrors) {
    TempDir dir;
    std::mt19937 rng(std::random_device{}());
    auto path = dir.path / "probes.json";
    ProbeCacheKey key{"GPU-x", "1", "hk128-hv128-g4"};
    ScopedLogCapture capture;
    EXPECT_FALSE(load_cached_probe(path.string(), key).has_value());  // no file
    for (const char* text : {"", "{", "[1,2]", "{\"entries\": 3}", "\x89PNG garbage",
                             "{\"entries\": {\"GPU-x|1|hk128-hv128-g4\": {\"version\": 1}}}",
                             "{\"entries\": {\"GPU-x|1|hk128-hv128-g4\": {\"version\": 1, \"measured_at\": 1e30, \"values\": {}}}}"}) {
        write_file(path, text);
        EXPECT_FALSE(load_cached_probe(path.string(), key).has_value()) << text;
    }
    // A corrupt file is replaced by a good one on the next store.
    write_file(path, "{ not json");
    ProbeValues v = random_values(rng);
    store_cached_probe(path.string(), key, v);
    ASSERT_TRUE(load_cached_probe(path.string(), key).has_value());
    // Negative bandwidth inside an entry is rejected by the profile validator: a miss.
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    auto at = text.find("\"pcie_h2d_gbps\": ");
    ASSERT_NE(at, std::string::npos);
    text.insert(at + 17, "-");
    write_file(path, text);
    EXPECT_FALSE(load_cached_probe(path.string(), key).has_value());
    // Stale by age.
    store_cached_probe(path.string(), key, v);
    EXPECT_FALSE(load_cached_probe(path.string(), key, -1.0).has_value());
    EXPECT_GT(capture.count(LogLevel::info), 3);
}

TEST(ProbeCache, UnwritableLocationIsAClearError) {
    ProbeValues v;
    v.gpu_name = "x";
    try {
        store_cached_probe("/proc/spillway-cannot-write/probes.json", {"a", "b", "c"}, v);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("probe cache"), std::string::npos);
    }
}

TEST(ProbeCache, PathFollowsEnvironment) {
    setenv("SPILLWAY_CACHE_DIR", "/tmp/sw-cache-test", 1);
    EXPECT_EQ(probe_cache_path(), "/tmp/sw-cache-test/probes.json");
    unsetenv("SPILLWAY_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
    EXPECT_EQ(probe_cache_path(), "/tmp/xdg/spillway/probes.json");
    unsetenv("XDG_CACHE_HOME");
}

TEST(HostProbe, MeasuresAPlausibleCopyRate) {
    auto start = std::chrono::steady_clock::now();
    HostRamBandwidth bw = measure_host_ram_bandwidth(size_t(64) << 20, 2);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Real DRAM copies run at 0.5-100 GB/s; the dead-store bug the spec describes gave 2e7.
    EXPECT_GT(bw.single_thread_gbps, 0.2);
    EXPECT_LT(bw.single_thread_gbps, 200.0);
    EXPECT_GT(bw.multi_thread_gbps, 0.2);
    EXPECT_LT(bw.multi_thread_gbps, 1000.0);
    EXPECT_LT(seconds, 10.0);
    EXPECT_THROW(measure_host_ram_bandwidth(100, 1), Error);
}
