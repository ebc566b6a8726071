#include <cmath>

#include "core/error.h"
#include "sampling/sampling_params.h"

namespace specula {

void SamplingParams::validate() const {
  SPECULA_CHECK(n >= 1, "n must be at least 1, got {}", n);
  SPECULA_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "temperature must be non-negative, got {}",
                temperature);
  SPECULA_CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got {}", top_p);
  SPECULA_CHECK(top_k >= -1, "top_k must be -1 or 0 (disable), or at least 1, got {}", top_k);
  SPECULA_CHECK(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got {}", min_p);
  SPECULA_CHECK(presence_penalty >= -2.0f && presence_penalty <= 2.0f, "presence_penalty must be in [-2, 2], got {}",
                presence_penalty);
  SPECULA_CHECK(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
                "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    SPECULA_CHECK(logit_bias[i].first >= 0 && std::isfinite(logit_bias[i].second),
                  "logit_bias: token {} with bias {}", logit_bias[i].first, logit_bias[i].second);
    SPECULA_CHECK(i == 0 || logit_bias[i - 1].first < logit_bias[i].first, "logit_bias: ids must be sorted and unique");
  }
  SPECULA_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
                "repetition_penalty must be greater than zero, got {}", repetition_penalty);
  if (max_tokens) SPECULA_CHECK(*max_tokens >= 1, "max_tokens must be at least 1, got {}", *max_tokens);
  SPECULA_CHECK(min_tokens >= 0, "min_tokens must be greater than or equal to 0, got {}", min_tokens);
  if (max_tokens)
    SPECULA_CHECK(min_tokens <= *max_tokens, "min_tokens must be less than or equal to max_tokens={}, got {}",
                  *max_tokens, min_tokens);
  // -1: the whole vocabulary (vLLM). The user-facing maximum (--max-logprobs) is the server's.
  if (logprobs) SPECULA_CHECK(*logprobs >= -1, "logprobs must be non-negative or -1, got {}", *logprobs);
  if (prompt_logprobs)
    SPECULA_CHECK(*prompt_logprobs >= -1, "prompt_logprobs must be non-negative or -1, got {}", *prompt_logprobs);
  for (const std::string& s : stop) SPECULA_CHECK(!s.empty(), "stop cannot contain an empty string");
  for (int32_t t : stop_token_ids) SPECULA_CHECK(t >= 0, "stop_token_ids must be non-negative, got {}", t);
  if (structured_outputs && structured_outputs->kind == StructuredOutputsParams::Kind::kChoice)
    SPECULA_CHECK(!structured_outputs->choices.empty(), "structured_outputs: choice must list at least one string");
}

}  // namespace specula
