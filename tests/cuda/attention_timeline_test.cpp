// The engine attention timeline's summary (lab, attention_timeline.h) on hand-made
// stamps: plain host code, so it runs without a GPU too.
#include "engine/cuda/attention_timeline.h"

#include <gtest/gtest.h>

namespace spillway {
namespace {

constexpr size_t kSlots = 10;

// Two layers, 4 query heads on 2 KV heads, 2 splits: 16 warps and 4 merge blocks per layer.
std::vector<uint64_t> two_layers(size_t stride) {
    std::vector<uint64_t> t(stride * 2, 0);
    for (int l = 0; l < 2; ++l) {
        const uint64_t base = 20000 * (uint64_t)l;
        uint64_t* y = t.data() + l * stride;
        for (size_t w = 0; w < 16; ++w) {
            uint64_t* tw = y + w * kSlots;
            tw[0] = base + 1000, tw[1] = base + 2000, tw[2] = base + 3000, tw[3] = base + 4000;
            tw[4] = base + 10000, tw[5] = base + 10500, tw[8] = base + 10600;
            tw[6] = base + 11000 + (w == 15 ? 2000 : 0);
            tw[7] = 2;  // steps (a count)
            tw[9] = w;  // SM
        }
        for (size_t b = 0; b < 4; ++b) {
            uint64_t* tb = y + (16 + b) * kSlots;
            tb[0] = base + 12000, tb[1] = base + 13500, tb[3] = base + 14000, tb[4] = base + 14700;
            tb[2] = base + 15000;
        }
    }
    return t;
}

TEST(AttentionEngineTimeline, SummarisesPhasesAcrossLayers) {
    const size_t stride = attention_timeline_slots(4, 2, 2);
    ASSERT_EQ(stride, (16u + 4u) * kSlots);
    const std::string line = attention_engine_timeline_summary(two_layers(stride), stride, 2, 4, 2, 2);
    EXPECT_NE(line.find("2 splits, mean of 2 layers"), std::string::npos) << line;
    EXPECT_NE(line.find("span 14.00 (13.00 after the first wait)"), std::string::npos) << line;
    EXPECT_NE(line.find("before the wait 1.00, q 1.00, first cells 1.00, loop 6.00"), std::string::npos) << line;
    // 500, 100 and (15 x 400 + 2400) / 16 ns
    EXPECT_NE(line.find("loop 6.00, block barrier 0.50, block merge 0.10, partial stores 0.53"), std::string::npos)
        << line;
    EXPECT_NE(line.find("entry 0.00, before the wait"), std::string::npos) << line;
    EXPECT_NE(line.find("tail 1.88"), std::string::npos) << line;  // 13000 - 11125 ns
    EXPECT_NE(line.find("merge after the last warp 1.50"), std::string::npos) << line;
    EXPECT_NE(line.find("outside the attention 6.00"), std::string::npos) << line;  // 21000 - 15000
}

TEST(AttentionEngineTimeline, ReadsOneLaunch) {
    const size_t stride = attention_timeline_slots(4, 2, 2);
    const std::vector<uint64_t> t = two_layers(stride);
    AttentionTimelineLaunch y;
    ASSERT_TRUE(attention_timeline_launch(t.data() + stride, 16, 4, y));  // the second layer
    EXPECT_EQ(y.start, 21000u);
    EXPECT_EQ(y.released, 22000u);
    EXPECT_EQ(y.last_done, 33000u);
    EXPECT_EQ(y.end, 35000u);
    EXPECT_DOUBLE_EQ(y.pre_wait, 1000.0);
    EXPECT_DOUBLE_EQ(y.q, 1000.0);
    EXPECT_DOUBLE_EQ(y.first, 1000.0);
    EXPECT_DOUBLE_EQ(y.loop, 6000.0);
    EXPECT_DOUBLE_EQ(y.steps, 2.0);
    EXPECT_DOUBLE_EQ(y.barrier, 500.0);
    EXPECT_DOUBLE_EQ(y.epilogue, 100.0);
    EXPECT_DOUBLE_EQ(y.stores, 400.0 + 2000.0 / 16);  // the late warp's 2 us in the mean
    EXPECT_DOUBLE_EQ(y.tail, 2000.0 - 2000.0 / 16);
    EXPECT_DOUBLE_EQ(y.merge_start, 11000.0);
    EXPECT_DOUBLE_EQ(y.merge_wait, 500.0);
    EXPECT_DOUBLE_EQ(y.merge_run, 1500.0);
    EXPECT_DOUBLE_EQ(y.merge_loads, 500.0);
    EXPECT_DOUBLE_EQ(y.merge_sums, 700.0);
    EXPECT_DOUBLE_EQ(y.merge_out, 300.0);
    EXPECT_FALSE(attention_timeline_launch(std::vector<uint64_t>(stride, 0).data(), 16, 4, y));
}

TEST(AttentionEngineTimeline, WarpsThatStampedNothingAreLeftOut) {
    const size_t stride = attention_timeline_slots(4, 2, 2);
    std::vector<uint64_t> t = two_layers(stride);
    // An empty split (whole waves): its block's 4 warps stamp nothing; the rest is unchanged.
    for (int l = 0; l < 2; ++l)
        for (size_t w = 4; w < 8; ++w)
            for (size_t k = 0; k < kSlots; ++k) t[l * stride + w * kSlots + k] = 0;
    const std::string line = attention_engine_timeline_summary(t, stride, 2, 4, 2, 2);
    EXPECT_NE(line.find("loop 6.00"), std::string::npos) << line;
    // 12 live warps: the mean finish is 11000 + 2000 / 12 ns, the tail 13000 minus it.
    EXPECT_NE(line.find("tail 1.83"), std::string::npos) << line;
}

TEST(AttentionEngineTimeline, NoStampsNoSummary) {
    const size_t stride = attention_timeline_slots(4, 2, 2);
    EXPECT_EQ(attention_engine_timeline_summary(std::vector<uint64_t>(stride * 2, 0), stride, 2, 4, 2, 2), "");
    // A buffer too small for the split count: no summary rather than a read past it.
    EXPECT_EQ(attention_engine_timeline_summary(std::vector<uint64_t>(stride, 0), stride, 2, 4, 2, 2), "");
    EXPECT_EQ(attention_engine_timeline_summary(two_layers(stride), stride, 2, 4, 2, 8), "");
}

}  // namespace
}  // namespace spillway
