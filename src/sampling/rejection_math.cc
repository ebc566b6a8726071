#include "sampling/rejection_math.h"

#include <algorithm>

#include "core/error.h"
#include "sampling/sampling_math.h"

namespace specula {

PositionVerdict verify_stochastic(std::span<const float> p, std::span<const float> q, int32_t x, double u_accept,
                                  double u_residual, std::span<float> residual) {
  SPECULA_ASSERT(p.size() == q.size() && residual.size() == p.size());
  SPECULA_CHECK(x >= 0 && static_cast<size_t>(x) < p.size(), "verification: draft token {} outside the vocab of {}",
                x, p.size());
  const double px = p[x], qx = q[x];
  // u < p/q, written without the division. q(x) = 0 cannot happen for a token drawn from q; a
  // token the target cannot produce (p(x) = 0) is always rejected.
  if (qx > 0.0 && u_accept * qx < px) return {true, x};
  double mass = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const float r = std::max(0.0f, p[i] - q[i]);
    residual[i] = r;
    mass += r;
  }
  // No residual mass means p <= q everywhere, i.e. p == q, where every draft is accepted; only
  // rounding gets here. p itself is then the right distribution.
  if (!(mass > 0.0)) return {false, sample_from_probs(p, u_residual)};
  return {false, sample_from_probs(residual, u_residual)};
}

PositionVerdict verify_deterministic(std::span<const float> p, int32_t x, double u, bool greedy) {
  const int32_t y = greedy ? argmax(p) : sample_from_probs(p, u);
  return {y == x, y};
}

}  // namespace specula
