// The per-position math of lossless speculative verification, on host fp32 distributions. p is
// the target's FINAL distribution at a drafted position and q the draft's (both from
// logits_to_probs with the request's own settings), x the draft token drawn from q.
//
// Stochastic drafts (Leviathan et al. / Chen et al.): accept x with probability min(1, p(x)/q(x));
// on rejection draw from normalise(max(0, p - q)). The output is then distributed exactly as p.
//
// Deterministic drafts (q one-hot at x: ngram, and every greedy row): the same rule accepts x with
// probability p(x) and otherwise draws from p without x. Drawing y from p with the position's own
// sampling draw and accepting x iff y == x realises exactly that (P(accept) = p(x); a rejection
// yields y ~ p conditioned on y != x) AND returns the very token a run without speculation
// samples there, so greedy and seeded outputs do not change with speculation at all.
#pragma once

#include <cstdint>
#include <span>

namespace specula {

// Streams of the counter-based draws (uniform_draw(seed, position, stream)) at one position.
// Stream 0 is the plain sampling draw (sampling_math.h).
inline constexpr uint32_t kSpecAcceptStream = 1;    // the min(1, p/q) test
inline constexpr uint32_t kSpecResidualStream = 2;  // the draw from the residual
inline constexpr uint32_t kSpecDraftStream = 3;     // the proposer's draw of x from q

struct PositionVerdict {
  bool accepted = false;
  int32_t token = 0;  // x when accepted, else the replacement
};

// Stochastic draft. `residual` is scratch of p's size. u_accept, u_residual in [0, 1).
PositionVerdict verify_stochastic(std::span<const float> p, std::span<const float> q, int32_t x, double u_accept,
                                  double u_residual, std::span<float> residual);

// Deterministic draft: y = the token plain sampling draws from p with u (the argmax for a
// one-hot p); accepted iff y == x.
PositionVerdict verify_deterministic(std::span<const float> p, int32_t x, double u, bool greedy);

}  // namespace specula
