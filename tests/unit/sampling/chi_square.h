// Pearson's chi-square goodness-of-fit test for the lossless-sampling tests: observed counts of
// each outcome against exact probabilities, with rare outcomes (expected count < 5) pooled into
// one cell as the test's approximation requires.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace specula::testing {

// Regularised upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a): the series of P for
// x < a + 1, else the continued fraction of Q (Lentz), both to double precision.
inline double gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefix = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && std::fabs(term) > std::fabs(sum) * 1e-16; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

struct ChiSquareResult {
  double statistic = 0.0;
  int dof = 0;
  double p_value = 1.0;
  int cells = 0;
};

// observed[i] outcomes with probability probs[i] (which sum to 1 up to rounding; outcomes outside
// the listed ones must have been counted into some cell by the caller).
inline ChiSquareResult chi_square_test(const std::vector<int64_t>& observed, const std::vector<double>& probs) {
  const double n = static_cast<double>(std::accumulate(observed.begin(), observed.end(), int64_t{0}));
  std::vector<double> exp_counts, obs_counts;
  double rare_e = 0.0, rare_o = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double e = probs[i] * n;
    if (e < 5.0) {
      rare_e += e;
      rare_o += static_cast<double>(observed[i]);
    } else {
      exp_counts.push_back(e);
      obs_counts.push_back(static_cast<double>(observed[i]));
    }
  }
  if (rare_e >= 5.0 || (rare_e > 0.0 && exp_counts.empty())) {
    exp_counts.push_back(rare_e);
    obs_counts.push_back(rare_o);
  } else if (rare_e > 0.0 || rare_o > 0.0) {  // too few to stand alone: join the smallest cell
    const size_t j = static_cast<size_t>(std::min_element(exp_counts.begin(), exp_counts.end()) - exp_counts.begin());
    exp_counts[j] += rare_e;
    obs_counts[j] += rare_o;
  }
  ChiSquareResult r;
  r.cells = static_cast<int>(exp_counts.size());
  for (size_t i = 0; i < exp_counts.size(); ++i) {
    const double diff = obs_counts[i] - exp_counts[i];
    r.statistic += diff * diff / exp_counts[i];
  }
  r.dof = std::max(1, r.cells - 1);
  r.p_value = gamma_q(r.dof / 2.0, r.statistic / 2.0);
  return r;
}

}  // namespace specula::testing
