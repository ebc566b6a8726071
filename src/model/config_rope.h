// RoPE settings from config.json in both spellings found in real checkpoints: the older
// `rope_theta` + `rope_scaling` ({"type"|"rope_type": ..., factor, ...}, may be null) and
// transformers 5's `rope_parameters` ({"rope_type", "rope_theta", ...}). Internal to config.cc.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/config_json.h"

namespace specula {

// `max_position_embeddings` is the fallback for original_max_position_embeddings (yarn, dynamic),
// as transformers uses it.
RopeConfig parse_rope_config(const JsonKeys& config, int64_t max_position_embeddings);

// The name config.json uses for a rope type ("default", "linear", "llama3", "yarn", "dynamic").
const char* rope_type_name(RopeConfig::Type t);

}  // namespace specula
