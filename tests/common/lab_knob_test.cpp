// Lab knobs restore a measured-slower behaviour for an A/B; a value they do not know must stop
// the run instead of silently measuring the default.
#include "engine/cuda/lab_knob.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace spillway {
namespace {

constexpr const char* kName = "SPILLWAY_TEST_LAB_KNOB";

TEST(LabKnob, UnsetEmptyAndDefaultAreOffValueIsOn) {
    ::unsetenv(kName);
    EXPECT_FALSE(lab_knob(kName, "0", "1"));
    ::setenv(kName, "", 1);
    EXPECT_FALSE(lab_knob(kName, "0", "1"));
    ::setenv(kName, "1", 1);
    EXPECT_FALSE(lab_knob(kName, "0", "1"));
    ::setenv(kName, "0", 1);
    EXPECT_TRUE(lab_knob(kName, "0", "1"));
    ::unsetenv(kName);
}

TEST(LabKnob, UnknownValueNamesTheKnobAndBothValues) {
    ::setenv(kName, "off", 1);
    try {
        lab_knob(kName, "separate", "fused");
        FAIL() << "an unknown value was accepted";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(kName), std::string::npos) << m;
        EXPECT_NE(m.find("'separate'"), std::string::npos) << m;
        EXPECT_NE(m.find("'fused'"), std::string::npos) << m;
        EXPECT_NE(m.find("'off'"), std::string::npos) << m;
    }
    ::unsetenv(kName);
}

TEST(LabKnob, ChoiceIsTheValuesIndexOrMinusOneWhenUnset) {
    ::unsetenv(kName);
    EXPECT_EQ(lab_knob_choice(kName, {"scalar", "vec", "coalesced"}), -1);
    ::setenv(kName, "", 1);
    EXPECT_EQ(lab_knob_choice(kName, {"scalar", "vec", "coalesced"}), -1);
    ::setenv(kName, "scalar", 1);
    EXPECT_EQ(lab_knob_choice(kName, {"scalar", "vec", "coalesced"}), 0);
    ::setenv(kName, "coalesced", 1);
    EXPECT_EQ(lab_knob_choice(kName, {"scalar", "vec", "coalesced"}), 2);
    ::setenv(kName, "Vec", 1);
    try {
        lab_knob_choice(kName, {"scalar", "vec", "coalesced"});
        FAIL() << "an unknown value was accepted";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(kName), std::string::npos) << m;
        EXPECT_NE(m.find("'scalar', 'vec', 'coalesced'"), std::string::npos) << m;
        EXPECT_NE(m.find("'Vec'"), std::string::npos) << m;
    }
    ::unsetenv(kName);
}

}  // namespace
}  // namespace spillway
