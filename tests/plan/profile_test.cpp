#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "probe/profile.h"

using namespace spillway;

namespace {

const char* kGood = R"({"name": "x", "gpu_name": "GPU", "vram_total_mib": 24576, "vram_bw_gbps": 936,
  "pcie_h2d_gbps": 6.7, "host_ram_gbps": 11.5, "c_engage_ms": 0.8, "attn_ms_per_cell": {"f16": 6.2e-4},
  "source": {"pcie_h2d_gbps": "measured"}})";

std::string with(const std::string& key, const std::string& value) {
    std::string s = kGood;
    size_t at = s.find("\"" + key + "\"");
    if (at == std::string::npos) return s.substr(0, s.size() - 1) + ", \"" + key + "\": " + value + "}";
    size_t colon = s.find(':', at), end = s.find_first_of(",}", colon);
    return s.substr(0, colon + 1) + " " + value + s.substr(end);
}

std::string without(const std::string& key) {
    std::string s = kGood;
    size_t at = s.find("\"" + key + "\"");
    size_t end = s.find(',', at);
    return s.substr(0, at) + s.substr(end + 1);
}

std::string error_of(const std::string& text) {
    try {
        parse_probe_profile(text, "test.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(Profile, ParsesEveryField) {
    ProbeValues v = parse_probe_profile(kGood, "test.json");
    EXPECT_EQ(v.gpu_name, "GPU");
    EXPECT_EQ(*v.vram_total_mib, 24576);
    EXPECT_FALSE(v.vram_free_mib);
    EXPECT_EQ(*v.vram_bw_gbps, 936);
    EXPECT_EQ(*v.pcie_h2d_gbps, 6.7);
    EXPECT_EQ(*v.host_ram_gbps, 11.5);
    EXPECT_EQ(*v.c_engage_ms, 0.8);
    EXPECT_EQ(v.attn_ms_per_cell.at(KvType::f16), 6.2e-4);
    EXPECT_EQ(v.origin, "profile test.json");
    EXPECT_EQ(parse_probe_profile(with("c_engage_ms", "0"), "t").c_engage_ms, 0.0);  // zero allowed
}

struct BadProfile {
    const char* name;
    std::string text;
    const char* expected;
};

class InvalidProfiles : public ::testing::TestWithParam<BadProfile> {};

TEST_P(InvalidProfiles, NameTheField) {
    std::string err = error_of(GetParam().text);
    EXPECT_NE(err.find(GetParam().expected), std::string::npos) << err;
    EXPECT_NE(err.find("test.json"), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(
    Profile, InvalidProfiles,
    ::testing::Values(
        BadProfile{"missing_pcie", without("pcie_h2d_gbps"), "missing field \"pcie_h2d_gbps\""},
        BadProfile{"missing_c_engage", without("c_engage_ms"), "missing field \"c_engage_ms\""},
        BadProfile{"missing_gpu_name", without("gpu_name"), "missing field \"gpu_name\""},
        BadProfile{"negative_ram", with("host_ram_gbps", "-11.5"), "field \"host_ram_gbps\" must not be negative"},
        BadProfile{"negative_c_engage", with("c_engage_ms", "-0.1"), "field \"c_engage_ms\" must not be negative"},
        BadProfile{"zero_vram_bw", with("vram_bw_gbps", "0"), "field \"vram_bw_gbps\" must be greater than 0"},
        BadProfile{"nan_string", with("vram_bw_gbps", "\"NaN\""), "field \"vram_bw_gbps\" must be a number, got string"},
        BadProfile{"overflow", with("pcie_h2d_gbps", "1e999"), "number overflow parsing '1e999'"},
        BadProfile{"null", with("vram_total_mib", "null"), "field \"vram_total_mib\" must be a number, got null"},
        BadProfile{"free_above_total", with("vram_free_mib", "30000"), "\"vram_free_mib\" exceeds \"vram_total_mib\""},
        BadProfile{"typo", with("pcie_gbps", "6.7"), "unknown field \"pcie_gbps\""},
        BadProfile{"attn_tier", without("attn_ms_per_cell").substr(0, without("attn_ms_per_cell").rfind('}')) +
                                   ", \"attn_ms_per_cell\": {\"q5_0\": 1e-4}}",
                   "attn_ms_per_cell.q5_0"},
        BadProfile{"not_json", "{\"gpu_name\": ", "not valid JSON"},
        BadProfile{"not_object", "[1, 2]", "must be a JSON object"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Profile, ReportsEveryDefectAtOnce) {
    std::string both = error_of(R"({"gpu_name": "G", "vram_total_mib": -1, "vram_bw_gbps": 1, "host_ram_gbps": 1,
                                    "c_engage_ms": 1})");
    EXPECT_NE(both.find("\"vram_total_mib\" must not be negative"), std::string::npos) << both;
    EXPECT_NE(both.find("missing field \"pcie_h2d_gbps\""), std::string::npos) << both;
}

TEST(Profile, ShippedProfilesLoadAndDocumentEveryNumber) {
    struct Shipped {
        const char* file;
        double pcie, host_ram, c_engage, vram_bw;
    };
    for (Shipped s : {Shipped{"rtx3090-pcie4-ddr4.json", 6.7, 11.5, 0.80, 936},
                      Shipped{"rtx6000ada-pcie5-ddr5.json", 51.2, 9.3, 0.82, 960},
                      Shipped{"h200-sxm.json", 55, 10, 0.82, 4337}}) {
        std::string path = std::string(SPILLWAY_SOURCE_DIR) + "/profiles/" + s.file;
        ProbeValues v = load_probe_profile(path);
        EXPECT_EQ(*v.pcie_h2d_gbps, s.pcie) << s.file;
        EXPECT_EQ(*v.host_ram_gbps, s.host_ram) << s.file;
        EXPECT_EQ(*v.c_engage_ms, s.c_engage) << s.file;
        EXPECT_EQ(*v.vram_bw_gbps, s.vram_bw) << s.file;
        EXPECT_FALSE(v.gpu_name.empty());
    }
    EXPECT_THROW(load_probe_profile("/nonexistent/profile.json"), Error);
}

TEST(Profile, OverridesWinAndAreRecorded) {
    ProbeValues v = parse_probe_profile(kGood, "test.json");
    ProbeOverrides o;
    o.pcie_h2d_gbps = 25.0;
    o.c_engage_ms = 1.5;
    apply_probe_overrides(v, o);
    EXPECT_EQ(*v.pcie_h2d_gbps, 25.0);
    EXPECT_EQ(*v.c_engage_ms, 1.5);
    EXPECT_EQ(*v.host_ram_gbps, 11.5);
    ASSERT_EQ(v.overridden.size(), 2u);
    EXPECT_NE(v.overridden[0].find("--pcie-gbps"), std::string::npos);
}
