#include "model/config_rope.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace specula {
namespace {

// transformers' RotaryEmbeddingConfigMixin.default_theta: used when neither the rope dict nor the
// top level names a theta.
constexpr double kDefaultTheta = 10000.0;

struct TypeName {
  const char* name;
  RopeConfig::Type type;
};
constexpr TypeName kTypes[] = {{"default", RopeConfig::Type::kDefault},
                               {"linear", RopeConfig::Type::kLinear},
                               {"llama3", RopeConfig::Type::kLlama3},
                               {"yarn", RopeConfig::Type::kYarn},
                               {"dynamic", RopeConfig::Type::kDynamic}};

// YaRN's magnitude correction (transformers' get_mscale): 0.1 * m * ln(s) + 1, or 1 when s <= 1.
double yarn_get_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

}  // namespace

const char* rope_type_name(RopeConfig::Type t) {
  for (const auto& e : kTypes)
    if (e.type == t) return e.name;
  return "?";
}

RopeConfig parse_rope_config(const JsonKeys& config, int64_t max_position_embeddings) {
  RopeConfig rope;

  // transformers: `rope_parameters = rope_scaling or rope_parameters`, i.e. a non-empty
  // rope_scaling wins; null or {} falls through to rope_parameters.
  std::optional<JsonKeys> dict;
  if (auto scaling = config.get_object("rope_scaling"); scaling && !scaling->json().empty()) {
    dict = scaling;
  } else if (auto params = config.get_object("rope_parameters"); params && !params->json().empty()) {
    dict = params;
  }
  // transformers 5 may nest the parameters by layer type ({"full_attention": {...}}); the models
  // here use full attention in every layer.
  if (dict && !dict->has("rope_type") && !dict->has("type") && !dict->has("rope_theta") &&
      dict->has_value("full_attention")) {
    dict = dict->get_object("full_attention");
  }

  // Theta: the dict's own rope_theta, else the top-level key, else the default.
  if (auto t = dict ? dict->get_number("rope_theta") : std::nullopt) {
    rope.theta = *t;
  } else if (auto top = config.get_number("rope_theta")) {
    rope.theta = *top;
  } else {
    rope.theta = kDefaultTheta;
  }
  if (!(rope.theta > 0.0)) {
    if (dict && dict->has_value("rope_theta")) dict->fail("rope_theta", fmt::format("must be positive, got {}", rope.theta));
    config.fail("rope_theta", fmt::format("must be positive, got {}", rope.theta));
  }

  // partial_rotary_factor lives in the dict (transformers 5) or at the top level (older configs).
  std::optional<double> partial = dict ? dict->get_number("partial_rotary_factor") : std::nullopt;
  const JsonKeys* partial_owner = dict ? &*dict : nullptr;
  if (!partial) {
    partial = config.get_number("partial_rotary_factor");
    partial_owner = &config;
  }
  if (partial) {
    if (!(*partial > 0.0 && *partial <= 1.0))
      partial_owner->fail("partial_rotary_factor", fmt::format("must be in (0, 1], got {}", *partial));
    rope.partial_rotary_factor = *partial;
  }

  if (!dict) return rope;  // plain RoPE

  // Older configs spell the type "type", transformers >= 4.43 "rope_type".
  std::string type_key = dict->has_value("rope_type") ? "rope_type" : "type";
  std::string type_name = dict->get_string(type_key).value_or("default");
  bool known = false;
  for (const auto& e : kTypes) {
    if (type_name == e.name) {
      rope.type = e.type;
      known = true;
    }
  }
  if (!known) {
    dict->fail(type_key, fmt::format("unsupported rope type '{}' (supported: default, linear, llama3, yarn, dynamic)",
                                     type_name));
  }

  auto positive_factor = [&]() {
    double f = dict->require_number("factor");
    if (!(f > 0.0)) dict->fail("factor", fmt::format("must be positive, got {}", f));
    return f;
  };
  auto original_max = [&](bool required) -> int64_t {
    std::optional<int64_t> v = required ? std::optional<int64_t>(dict->require_int("original_max_position_embeddings"))
                                        : dict->get_int("original_max_position_embeddings");
    int64_t out = v.value_or(max_position_embeddings);
    if (out <= 0) dict->fail("original_max_position_embeddings", fmt::format("must be positive, got {}", out));
    return out;
  };

  switch (rope.type) {
    case RopeConfig::Type::kDefault:
      break;
    case RopeConfig::Type::kLinear:
      rope.factor = positive_factor();
      break;
    case RopeConfig::Type::kDynamic:
      rope.factor = positive_factor();
      rope.original_max_position_embeddings = original_max(false);
      break;
    case RopeConfig::Type::kLlama3:
      // transformers' llama3 validation requires all four keys.
      rope.factor = positive_factor();
      rope.low_freq_factor = dict->require_number("low_freq_factor");
      rope.high_freq_factor = dict->require_number("high_freq_factor");
      if (!(rope.high_freq_factor > rope.low_freq_factor)) {
        dict->fail("high_freq_factor", fmt::format("must exceed low_freq_factor ({}), got {}", rope.low_freq_factor,
                                                   rope.high_freq_factor));
      }
      rope.original_max_position_embeddings = original_max(true);
      break;
    case RopeConfig::Type::kYarn: {
      rope.factor = positive_factor();
      rope.original_max_position_embeddings = original_max(false);
      // transformers reads these with `get(...) or default`, so 0 also means the default.
      if (auto v = dict->get_number("beta_fast"); v && *v != 0.0) rope.beta_fast = *v;
      if (auto v = dict->get_number("beta_slow"); v && *v != 0.0) rope.beta_slow = *v;
      auto mscale = dict->get_number("mscale");
      auto mscale_all_dim = dict->get_number("mscale_all_dim");
      if (mscale) rope.mscale = *mscale;
      if (mscale_all_dim) rope.mscale_all_dim = *mscale_all_dim;
      rope.attention_factor = dict->get_number("attention_factor");
      // transformers 5's `truncate: false` (gpt-oss) keeps the correction range unrounded; RopeConfig
      // has no field for it, so refuse rather than silently rounding.
      if (dict->get_bool("truncate").value_or(true) == false)
        dict->fail("truncate", "only true (the default) is supported");
      // transformers uses mscale / mscale_all_dim only when both are given and non-zero, else
      // get_mscale(factor). RopeConfig's default mscale of 1.0 would turn "mscale absent,
      // mscale_all_dim given" into the ratio; pin the transformers value instead.
      if (!rope.attention_factor && !mscale && mscale_all_dim && *mscale_all_dim != 0.0) {
        rope.attention_factor = yarn_get_mscale(rope.factor, 1.0);
      }
      break;
    }
  }
  return rope;
}

}  // namespace specula
