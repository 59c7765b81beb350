#pragma once
// Mean and sample standard deviation of repeated measurements (bench -r N).
#include <cmath>
#include <vector>

namespace spillway {

struct SampleStats {
    double mean = 0;
    double sd = 0;  // sample standard deviation (n - 1); 0 for fewer than two samples
};

inline SampleStats sample_stats(const std::vector<double>& v) {
    SampleStats s;
    if (v.empty()) return s;
    for (double x : v) s.mean += x;
    s.mean /= (double)v.size();
    if (v.size() < 2) return s;
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / (double)(v.size() - 1));
    return s;
}

}  // namespace spillway
