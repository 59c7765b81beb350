// Lab knobs restore a measured-slower behaviour for an A/B; a value they do not know must stop
// the run instead of silently measuring the default.
#include "engine/cuda/lab_knob.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string>

namespace spillway {
namespace {

constexpr const char* kName = "SPILLWAY_TEST_LAB_KNOB";

// read() must fail with a message holding every one of `parts`.
void expect_error_naming(const std::function<void()>& read, std::initializer_list<std::string> parts) {
    try {
        read();
        FAIL() << "an unknown value was accepted";
    } catch (const Error& e) {
        const std::string m = e.what();
        for (const std::string& part : parts) EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
    }
}

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
    expect_error_naming([] { lab_knob(kName, "separate", "fused"); }, {kName, "'separate'", "'fused'", "'off'"});
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
    expect_error_naming([] { lab_knob_choice(kName, {"scalar", "vec", "coalesced"}); },
                        {kName, "'scalar', 'vec', 'coalesced'", "'Vec'"});
    ::unsetenv(kName);
}

}  // namespace
}  // namespace spillway
