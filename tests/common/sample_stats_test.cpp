#include "common/sample_stats.h"

#include <gtest/gtest.h>

namespace spillway {
namespace {

TEST(SampleStats, MeanAndSampleSd) {
    const SampleStats s = sample_stats({2, 4, 4, 4, 5, 5, 7, 9});
    EXPECT_DOUBLE_EQ(s.mean, 5.0);
    EXPECT_NEAR(s.sd, std::sqrt(32.0 / 7.0), 1e-12);  // n - 1 in the denominator, not n
}

TEST(SampleStats, OneOrNoSampleHasNoSpread) {
    EXPECT_DOUBLE_EQ(sample_stats({176.5}).mean, 176.5);
    EXPECT_DOUBLE_EQ(sample_stats({176.5}).sd, 0.0);
    EXPECT_DOUBLE_EQ(sample_stats({}).mean, 0.0);
}

}  // namespace
}  // namespace spillway
