// The tests' measure of how far logits (or any values) are from a reference: the largest absolute
// difference over the largest reference magnitude, "within x of the logit scale". A NaN anywhere
// is an infinite error, so that a broken kernel cannot pass as a small one.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace specula::testing {

inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return worst / scale;
}

}  // namespace specula::testing
