// Each function below mirrors one of transformers' rope init functions, operation by operation in
// float32 where transformers works on float32 tensors, and in double where it works on Python
// floats. Two torch details matter for bit-level agreement:
//   * `scalar / tensor` is `tensor.reciprocal() * scalar` (Tensor.__rtruediv__);
//   * a Python float meeting a float32 tensor is first rounded to float32.
#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace specula {
namespace {

// base ** (arange(0, dim, 2).float() / dim), element i: float32 exponent, float32 power.
float position_frequency(double base, int64_t i, int64_t dim) {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
  return static_cast<float>(std::pow(static_cast<double>(static_cast<float>(base)), static_cast<double>(exponent)));
}

// inv_freq = 1.0 / base ** (2i / dim): the original RoPE.
std::vector<float> default_inv_freq(double base, int64_t dim) {
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) inv[i] = 1.0f / position_frequency(base, i, dim);
  return inv;
}

// Llama 3.1: frequencies with wavelength above original_max / low_freq_factor are divided by
// factor, those below original_max / high_freq_factor are kept, and the band between is a smooth
// interpolation of the two.
std::vector<float> llama3_inv_freq(const RopeConfig& rope, int64_t dim, int64_t original_max) {
  std::vector<float> inv = default_inv_freq(rope.theta, dim);
  const double old_context = static_cast<double>(original_max);
  const float low_freq_wavelen = static_cast<float>(old_context / rope.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context / rope.high_freq_factor);
  const float factor = static_cast<float>(rope.factor);
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  const float low_f = static_cast<float>(rope.low_freq_factor);
  const float band = static_cast<float>(rope.high_freq_factor - rope.low_freq_factor);
  const float old_f = static_cast<float>(old_context);
  for (float& f : inv) {
    const float wavelen = (1.0f / f) * two_pi;
    const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    const float smooth = ((1.0f / wavelen) * old_f - low_f) / band;
    const float smoothed = ((1.0f - smooth) * scaled) / factor + smooth * scaled;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : scaled;
  }
  return inv;
}

// YaRN's magnitude correction: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1).
double yarn_get_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// YaRN (arXiv 2309.00071): dims that rotate fewer than beta_slow times over the original context
// are interpolated (inv_freq / factor), those rotating more than beta_fast times are kept
// (extrapolated), with a linear ramp over the dims between.
RopeFrequencies yarn_frequencies(const RopeConfig& rope, int64_t dim, int64_t original_max) {
  RopeFrequencies out;
  const double factor = rope.factor, base = rope.theta;
  if (rope.attention_factor) {
    out.attention_scaling = *rope.attention_factor;
  } else if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    out.attention_scaling = yarn_get_mscale(factor, rope.mscale) / yarn_get_mscale(factor, rope.mscale_all_dim);
  } else {
    out.attention_scaling = yarn_get_mscale(factor, 1.0);
  }
  // The dimension whose frequency makes num_rotations turns over the original context.
  auto correction_dim = [&](double num_rotations) {
    return (static_cast<double>(dim) * std::log(static_cast<double>(original_max) / (num_rotations * 2 * std::numbers::pi))) /
           (2 * std::log(base));
  };
  double low = std::max(std::floor(correction_dim(rope.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(rope.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  const float ramp_low = static_cast<float>(low), ramp_width = static_cast<float>(high - low);
  const float factor_f = static_cast<float>(factor);

  out.inv_freq.resize(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos_freq = position_frequency(base, i, dim);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor_f * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - ramp_low) / ramp_width, 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    out.inv_freq[i] = interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  return out;
}

}  // namespace

RopeFrequencies rope_frequencies(const RopeConfig& rope, int64_t rotary_dim, int64_t max_position_embeddings) {
  SPECULA_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rope: rotary dimension must be even and positive, got {}",
                rotary_dim);
  // transformers defaults original_max_position_embeddings to max_position_embeddings.
  const int64_t original_max =
      rope.original_max_position_embeddings > 0 ? rope.original_max_position_embeddings : max_position_embeddings;
  RopeFrequencies out;
  switch (rope.type) {
    case RopeConfig::Type::kDefault:
    case RopeConfig::Type::kDynamic:  // dynamic NTK only changes inv_freq past max_position_embeddings
      out.inv_freq = default_inv_freq(rope.theta, rotary_dim);
      break;
    case RopeConfig::Type::kLinear: {
      // Position interpolation: dividing inv_freq by factor equals dividing positions by it.
      out.inv_freq = default_inv_freq(rope.theta, rotary_dim);
      const float factor = static_cast<float>(rope.factor);
      for (float& f : out.inv_freq) f /= factor;
      break;
    }
    case RopeConfig::Type::kLlama3:
      SPECULA_CHECK(original_max > 0, "rope: llama3 scaling needs original_max_position_embeddings");
      out.inv_freq = llama3_inv_freq(rope, rotary_dim, original_max);
      break;
    case RopeConfig::Type::kYarn:
      SPECULA_CHECK(original_max > 0, "rope: yarn scaling needs original_max_position_embeddings");
      out = yarn_frequencies(rope, rotary_dim, original_max);
      break;
  }
  return out;
}

std::vector<float> rope_cos_sin_table(const RopeFrequencies& freqs, int64_t max_positions) {
  const int64_t half = static_cast<int64_t>(freqs.inv_freq.size()), width = 2 * half;
  const float scaling = static_cast<float>(freqs.attention_scaling);
  std::vector<float> table(static_cast<size_t>(max_positions * width));
  for (int64_t p = 0; p < max_positions; ++p) {
    float* row = table.data() + p * width;
    for (int64_t i = 0; i < half; ++i) {
      // transformers: freqs = inv_freq @ position (one fp32 product), emb.cos() * scaling.
      const float angle = freqs.inv_freq[i] * static_cast<float>(p);
      row[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scaling;
      row[half + i] = static_cast<float>(std::sin(static_cast<double>(angle))) * scaling;
    }
  }
  return table;
}

}  // namespace specula
