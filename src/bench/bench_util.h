// Helpers shared by the benchmark programs of src/bench.
#pragma once

#include <algorithm>
#include <vector>

namespace specinfer::bench {

// The median of `v` (the mean of the two middle values for an even count); v must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace specinfer::bench
