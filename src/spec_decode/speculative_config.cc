#include "spec_decode/speculative_config.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <vector>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/edit_distance.h"
#include "core/error.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

constexpr std::array<std::string_view, 9> kKeys = {
    "method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "prompt_lookup_min",
    "prompt_lookup_max", "max_model_len", "adaptive", "draft_sampling"};

// Names vLLM accepts for each method, and the canonical one.
struct MethodName {
  std::string_view name;
  std::string_view canonical;
};
constexpr std::array<MethodName, 7> kMethods = {{{"draft_model", "draft_model"},
                                                 {"ngram", "ngram"},
                                                 {"[ngram]", "ngram"},
                                                 {"mtp", "mtp"},
                                                 {"deepseek_mtp", "mtp"},
                                                 {"eagle", "eagle"},
                                                 {"eagle3", "eagle3"}}};

// k beyond this is never useful (acceptance decays geometrically with depth) and would only grow
// the per-request buffers and the verification query length.
constexpr int kMaxSpeculativeTokens = 16;

bool is_ngram_alias(std::string_view s) { return s == "ngram" || s == "[ngram]"; }

int int_value(const nlohmann::json& v, std::string_view key) {
  SPECULA_CHECK(v.is_number_integer(), "--speculative-config: \"{}\" must be an integer, got {}", key, v.dump());
  const int64_t x = v.get<int64_t>();
  SPECULA_CHECK(x >= INT32_MIN && x <= INT32_MAX, "--speculative-config: \"{}\" = {} is out of range", key, x);
  return static_cast<int>(x);
}

std::string string_value(const nlohmann::json& v, std::string_view key) {
  SPECULA_CHECK(v.is_string(), "--speculative-config: \"{}\" must be a string, got {}", key, v.dump());
  return v.get<std::string>();
}

}  // namespace

SpeculativeConfig parse_speculative_config(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--speculative-config is not valid JSON ({}): {}", e.what(), text));
  }
  SPECULA_CHECK(j.is_object(), "--speculative-config must be a JSON object such as "
                               "'{{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}', got {}",
                j.dump());

  SpeculativeConfig c;
  bool have_k = false, have_min = false, have_max = false, have_len = false;
  std::string method;
  for (const auto& [raw_key, value] : j.items()) {
    std::string key = raw_key;
    std::replace(key.begin(), key.end(), '-', '_');
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end()) {
      throw Error(fmt::format("--speculative-config: unknown key \"{}\"; did you mean \"{}\"? (valid keys: {})", raw_key,
                              nearest_key(key, kKeys), fmt::join(kKeys, ", ")));
    }
    if (value.is_null()) continue;  // vLLM's None: not given
    if (key == "method") {
      method = string_value(value, key);
    } else if (key == "model") {
      c.model = string_value(value, key);
    } else if (key == "num_speculative_tokens") {
      c.num_speculative_tokens = int_value(value, key);
      have_k = true;
    } else if (key == "draft_tensor_parallel_size") {
      c.draft_tensor_parallel_size = int_value(value, key);
    } else if (key == "prompt_lookup_min") {
      c.prompt_lookup_min = int_value(value, key);
      have_min = true;
    } else if (key == "prompt_lookup_max") {
      c.prompt_lookup_max = int_value(value, key);
      have_max = true;
    } else if (key == "max_model_len") {
      c.max_model_len = int_value(value, key);
      have_len = true;
    } else if (key == "draft_sampling") {
      c.draft_sampling = string_value(value, key);
      SPECULA_CHECK(c.draft_sampling == "argmax" || c.draft_sampling == "sampled",
                    "--speculative-config: \"draft_sampling\" must be \"argmax\" or \"sampled\", got \"{}\"",
                    c.draft_sampling);
    } else if (key == "adaptive") {
      SPECULA_CHECK(value.is_boolean(), "--speculative-config: \"adaptive\" must be true or false, got {}", value.dump());
      c.adaptive = value.get<bool>();
    }
  }

  // The method: given, or inferred as vLLM does (model "ngram" names the method; any other model
  // is a draft model).
  if (method.empty()) {
    SPECULA_CHECK(!c.model.empty(), "--speculative-config: \"method\" is required (one of draft_model, ngram, mtp, "
                                    "deepseek_mtp, eagle, eagle3)");
    // vLLM infers EAGLE heads from their names too (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B).
    std::string lower = c.model;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
    method = is_ngram_alias(c.model)                      ? "ngram"
             : lower.find("eagle3") != std::string::npos  ? "eagle3"
             : lower.find("eagle-") != std::string::npos  ? "eagle"
                                                          : "draft_model";
  }
  auto m = std::find_if(kMethods.begin(), kMethods.end(), [&](const MethodName& n) { return n.name == method; });
  if (m == kMethods.end()) {
    std::vector<std::string_view> names;
    for (const MethodName& n : kMethods) names.push_back(n.name);
    throw Error(fmt::format("--speculative-config: unknown method \"{}\"; did you mean \"{}\"? (methods: {})", method,
                            nearest_key(method, names), fmt::join(names, ", ")));
  }
  c.method = std::string(m->canonical);

  SPECULA_CHECK(c.draft_tensor_parallel_size >= 1, "--speculative-config: draft_tensor_parallel_size={} must be at "
                "least 1", c.draft_tensor_parallel_size);
  SPECULA_CHECK(c.draft_tensor_parallel_size == 1 || c.method == "draft_model",
                "--speculative-config: draft_tensor_parallel_size={} is for method draft_model only: a {} proposer runs "
                "on the first GPU (draft_tensor_parallel_size must be 1)",
                c.draft_tensor_parallel_size, c.method);
  if (have_k) {
    SPECULA_CHECK(c.num_speculative_tokens >= 1, "--speculative-config: num_speculative_tokens={} must be at least 1",
                  c.num_speculative_tokens);
    SPECULA_CHECK(c.num_speculative_tokens <= kMaxSpeculativeTokens,
                  "--speculative-config: num_speculative_tokens={} is more than the {} supported", c.num_speculative_tokens,
                  kMaxSpeculativeTokens);
  } else {
    SPECULA_CHECK(c.method == "mtp", "--speculative-config: method {} needs \"num_speculative_tokens\" (the number of "
                                     "draft tokens per step, e.g. 3)",
                  c.method);
  }
  if (have_len)
    SPECULA_CHECK(c.max_model_len >= 2, "--speculative-config: max_model_len={} must be at least 2", c.max_model_len);

  if (c.method == "ngram") {
    SPECULA_CHECK(c.model.empty() || is_ngram_alias(c.model),
                  "--speculative-config: method ngram takes no \"model\" (got \"{}\"): prompt lookup drafts from the "
                  "request's own tokens; use method draft_model to run a draft checkpoint",
                  c.model);
    c.model.clear();
    // vLLM's defaults: both 5 when neither is given, else the one given for both.
    if (!have_min && !have_max) {
      c.prompt_lookup_min = c.prompt_lookup_max = 5;
    } else if (!have_min) {
      c.prompt_lookup_min = c.prompt_lookup_max;
    } else if (!have_max) {
      c.prompt_lookup_max = c.prompt_lookup_min;
    }
    SPECULA_CHECK(c.prompt_lookup_min >= 1, "--speculative-config: prompt_lookup_min={} must be > 0", c.prompt_lookup_min);
    SPECULA_CHECK(c.prompt_lookup_max >= 1, "--speculative-config: prompt_lookup_max={} must be > 0", c.prompt_lookup_max);
    SPECULA_CHECK(c.prompt_lookup_min <= c.prompt_lookup_max,
                  "--speculative-config: prompt_lookup_min={} must be <= prompt_lookup_max={}", c.prompt_lookup_min,
                  c.prompt_lookup_max);
  } else {
    SPECULA_CHECK(!have_min && !have_max,
                  "--speculative-config: prompt_lookup_min/prompt_lookup_max apply to method ngram only, not {}",
                  c.method);
  }
  if (c.method == "eagle" || c.method == "eagle3") {
    SPECULA_CHECK(!c.model.empty(), "--speculative-config: method {} needs \"model\": the folder of an {} head trained "
                  "for the target (config.json + model.safetensors)", c.method, c.method == "eagle3" ? "EAGLE-3" : "EAGLE");
  }
  if (c.method == "draft_model") {
    SPECULA_CHECK(!c.model.empty(),
                  "--speculative-config: method draft_model needs \"model\": the draft checkpoint folder (a smaller "
                  "model with the target's tokenizer)");
    SPECULA_CHECK(!is_ngram_alias(c.model), "--speculative-config: model \"{}\" names the ngram method, not a draft "
                                            "checkpoint; use \"method\": \"ngram\"",
                  c.model);
  }
  return c;
}

int validate_draft_model(const SpeculativeConfig& spec, const ModelConfig& target, const Tokenizer& target_tokenizer,
                         const ModelConfig& draft, const Tokenizer& draft_tokenizer, int target_max_model_len) {
  SPECULA_CHECK(draft.vocab_size == target.vocab_size,
                "--speculative-config: the draft model {} has vocab_size {} but the target has {}: draft and target "
                "must share one vocabulary",
                spec.model, draft.vocab_size, target.vocab_size);
  // Same size is not the same vocabulary: every id must name the same token.
  SPECULA_CHECK(draft_tokenizer.vocab_size() == target_tokenizer.vocab_size(),
                "--speculative-config: the draft's tokenizer ({}) has {} tokens but the target's has {}: draft and "
                "target must share one tokenizer",
                spec.model, draft_tokenizer.vocab_size(), target_tokenizer.vocab_size());
  for (int32_t id = 0; id < static_cast<int32_t>(target_tokenizer.vocab_size()); ++id) {
    SPECULA_CHECK(draft_tokenizer.id_to_token(id) == target_tokenizer.id_to_token(id) &&
                      draft_tokenizer.is_special(id) == target_tokenizer.is_special(id),
                  "--speculative-config: the draft's tokenizer ({}) differs from the target's at token id {} (\"{}\" vs "
                  "\"{}\"): draft and target must share one tokenizer",
                  spec.model, id, draft_tokenizer.id_to_token(id), target_tokenizer.id_to_token(id));
  }
  const int draft_limit = static_cast<int>(draft.max_position_embeddings);
  int len = std::min(target_max_model_len, draft_limit > 0 ? draft_limit : target_max_model_len);
  if (spec.max_model_len > 0) {
    SPECULA_CHECK(draft_limit <= 0 || spec.max_model_len <= draft_limit,
                  "--speculative-config: max_model_len={} is greater than the draft model's max_position_embeddings "
                  "({} in {}/config.json)",
                  spec.max_model_len, draft_limit, spec.model);
    len = std::min(len, spec.max_model_len);
  }
  return len;
}

void check_mtp_target(const SpeculativeConfig& spec, const ModelConfig& target, std::string_view target_model) {
  const std::string arch = architecture_name(target.arch);
  SPECULA_CHECK(target.num_nextn_predict_layers > 0,
                "--speculative-config: method {} drafts with the target's own multi-token-prediction (MTP) layers, "
                "but {} ({}) has none: num_nextn_predict_layers is 0 in its config.json (use method draft_model or "
                "ngram with this model)",
                spec.method, target_model, arch);
  SPECULA_CHECK(target.is_deepseek(),
                "--speculative-config: method {} supports the MTP layers of DeepSeek-V3-style checkpoints only; {} is {}",
                spec.method, target_model, arch);
  if (!spec.model.empty()) {
    namespace fs = std::filesystem;
    std::error_code ec1, ec2;
    const bool same = fs::weakly_canonical(spec.model, ec1) == fs::weakly_canonical(fs::path(target_model), ec2);
    SPECULA_CHECK(same && !ec1 && !ec2,
                  "--speculative-config: method {} takes its layers from the target checkpoint; \"model\" must be "
                  "left out or name the target ({}), got \"{}\"",
                  spec.method, target_model, spec.model);
  }
}

void resolve_speculative_config(SpeculativeConfig& spec, const ModelConfig& target, std::string_view target_model) {
  if (spec.method != "mtp") return;
  check_mtp_target(spec, target, target_model);
  if (spec.num_speculative_tokens == 0)
    spec.num_speculative_tokens = static_cast<int>(std::min<int64_t>(target.num_nextn_predict_layers, kMaxSpeculativeTokens));
}

}  // namespace specula
