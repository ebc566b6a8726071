// The DraftSampler (draft_sampler.h) on the backend's device, through its TokenSampler
// (backend/token_sampler.h): the draft logits never leave the device, the kernel that computes a
// row's final distribution writes q straight into the q store, and only the draft tokens come
// back (one copy and one synchronisation per call, ~max_rows rows at a time).
//
// Same result as the CPU draft sampler (cpu_draft_sampler.cc): greedy rows draft the argmax of
// the processed logits and keep no q; the others draw x ~ q with the request's position-keyed
// draw on kSpecDraftStream, q = logits_to_probs of the request's settings (up to float rounding;
// the token can differ only when the draw falls within ~1e-7 of a token boundary).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "sampling/draft_sampler.h"

namespace specula {

// nullptr when the backend samples only on the host (the CPU). max_rows: the rows of one device
// launch (more rows per call run in several); vocab: the draft logits' width.
std::unique_ptr<DraftSampler> make_device_draft_sampler(Backend& backend, int max_rows, int64_t vocab);

// The device draft sampler on an accelerator backend, else the CPU one.
std::unique_ptr<DraftSampler> make_draft_sampler(Backend& backend, int max_rows, int64_t vocab);

}  // namespace specula
