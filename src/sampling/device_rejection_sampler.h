// The RejectionSampler (rejection_sampler.h) on the backend's device: target logits and the
// draft distributions q never leave it; only the verdicts (and requested logprobs) come back, in
// one copy per step. Every row of every request is decided in one launch of the device
// TokenSampler (backend/token_sampler.h), the host then keeps each request's accepted prefix:
//  - deterministic drafts (no q, or greedy rows): row j samples y_j exactly as plain sampling
//    does (rejection_math.h: accept x_j iff y_j == x_j, else emit y_j);
//  - stochastic drafts: row j accepts x_j with min(1, p/q) or draws the replacement from
//    max(0, p - q), with the request's kSpecAcceptStream / kSpecResidualStream draws;
//  - the bonus row samples as plain sampling does.
// Same draws as the CPU sampler, so the same tokens up to floating-point ties.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "sampling/rejection_sampler.h"

namespace specula {

// nullptr when the backend has no device sampler (the CPU); max_rows bounds the rows (drafts + 1
// per request) of one verify() call.
std::unique_ptr<RejectionSampler> make_device_rejection_sampler(Backend& backend, int max_rows, int64_t vocab);

}  // namespace specula
