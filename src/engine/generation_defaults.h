// Request defaults from a checkpoint's generation_config.json, as vLLM applies them
// (--generation-config auto): temperature, top_p, top_k, min_p, repetition_penalty and
// max_new_tokens (as max_tokens) replace SamplingParams' built-in defaults; a request's own
// values override them.
#pragma once

#include "sampling/sampling_params.h"
#include "model/config.h"

namespace specula {

SamplingParams default_sampling_params(const GenerationConfig& generation_config);

}  // namespace specula
