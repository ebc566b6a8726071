// The Sampler (sampling/sampler.h) on the backend's device: logits stay on the device; only the
// sampled tokens (and the logprobs a request asks for) come back, in one copy per step.
//
// The engine side of backend/token_sampler.h: it turns SamplingRows into the device's row
// settings, drawing each row's uniform from the same counter-based (seed, position) stream the
// CPU sampler uses, so a seeded request samples the same tokens on either device (up to
// floating-point ties). Logprob requests the device does not cover (top N above its maximum,
// or -1 = the whole vocabulary) read that one row back and use the host's compute_logprobs.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/token_sampler.h"
#include "sampling/sampler.h"

namespace specula {

// A device sampler for up to max_rows rows per call of vocab-wide logits, or nullptr when the
// backend samples only on the host (the CPU backend).
std::unique_ptr<Sampler> make_device_sampler(Backend& backend, int max_rows, int64_t vocab);

// A row's settings as the device takes them: its sampling parameters, id lists and the uniform of
// its (seed, position) draw on `stream` (0 for non-greedy rows; greedy rows draw nothing). The
// caller adds what is particular to its use (logprobs, draft verification, q output).
TokenSamplingRow device_row_settings(const SamplingRow& r, uint32_t stream = 0);

// The device sampler when the backend has one, else the CPU sampler.
std::unique_ptr<Sampler> make_sampler(Backend& backend, int max_rows, int64_t vocab);

}  // namespace specula
