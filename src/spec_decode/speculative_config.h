// --speculative-config: the JSON object vLLM takes, parsed once into a typed struct.
//
//   {"method": "draft_model", "model": "models/specula-tiny-draft", "num_speculative_tokens": 3}
//   {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
//
// Strict: an unknown key is an error naming the nearest valid key (edit distance), and a
// combination that cannot work is an error saying why. Keys may be written with '-' instead of '_'
// ("max-model-len"), as vLLM's own examples do. Checks that need the models (vocabulary, lengths)
// are in validate_draft_model, run once the draft is loaded.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace specula {

class Tokenizer;
struct ModelConfig;

struct SpeculativeConfig {
  // Canonical method name: "draft_model", "ngram", "mtp" (also spelled "deepseek_mtp"), "eagle",
  // "eagle3". Which of them can run is the proposer registry's business (proposer_registry.h).
  std::string method;
  std::string model;                    // the draft checkpoint folder (draft_model)
  int num_speculative_tokens = 0;       // k, the most drafts per step; 0 = not given (MTP may default it)
  int draft_tensor_parallel_size = 1;   // draft_model: 1 (the first GPU) or the target's; others: 1
  int prompt_lookup_min = 0;            // ngram: shortest n-gram to match (vLLM default 5)
  int prompt_lookup_max = 0;            // ngram: longest n-gram to match (vLLM default 5)
  int max_model_len = 0;                // the draft's; 0 = min(draft's max_position_embeddings, target's)
  bool adaptive = true;                 // choose 0..k drafts per step from acceptance and load (false: always k)
  // How a model-running proposer draws the drafts of a request that samples: "sampled" (from the
  // request's own distribution q, verified against it: the higher acceptance) or "argmax" (vLLM's:
  // the proposer's most likely token, verified as a deterministic draft, chained on the device
  // without a host round trip per draft). Greedy requests always draft the argmax.
  std::string draft_sampling = "sampled";

  bool uses_draft_model() const { return method == "draft_model"; }
};

// Parses and validates the JSON text. Throws specula::Error naming the key at fault.
SpeculativeConfig parse_speculative_config(std::string_view json);

// After the draft is loaded: same vocabulary (vocab_size of both configs, and the tokenizers'
// token strings id by id), sensible lengths. Returns the draft's effective max_model_len: no
// position at or past it is ever drafted.
int validate_draft_model(const SpeculativeConfig& spec, const ModelConfig& target, const Tokenizer& target_tokenizer,
                         const ModelConfig& draft, const Tokenizer& draft_tokenizer, int target_max_model_len);

// Completes the config once the target's config.json is read, before any weight loads: method
// mtp is checked against the target (check_mtp_target) and its num_speculative_tokens defaults to
// the target's number of MTP layers, as vLLM's does.
void resolve_speculative_config(SpeculativeConfig& spec, const ModelConfig& target, std::string_view target_model);

// Method mtp drafts with the target checkpoint's own MTP layers: the target must be a DeepSeek
// model with num_nextn_predict_layers > 0, and "model", if given, must name the target itself.
void check_mtp_target(const SpeculativeConfig& spec, const ModelConfig& target, std::string_view target_model);


}  // namespace specula
