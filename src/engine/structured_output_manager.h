// vLLM's StructuredOutputManager: turns a request's StructuredOutputsParams into a compiled
// grammar (JSON Schema, json_object, regex, choice, EBNF), cached by constraint so that repeated
// schemas (every call of one tool) compile once and share their token-mask cache, and makes each
// sequence its GrammarMatcher.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sampling/sampling_params.h"
#include "structured_output/grammar_matcher.h"

namespace specula {

class Tokenizer;

class StructuredOutputManager {
 public:
  // vocab_size: the model's logits width (masks have one bit per logit).
  StructuredOutputManager(const Tokenizer& tokenizer, int64_t vocab_size);

  // Thread-safe (the HTTP threads validate through it). Throws specula::Error naming what is
  // wrong with the schema, pattern or grammar: the server's 400.
  std::shared_ptr<CompiledGrammar> compile(const StructuredOutputsParams& params);
  // A sequence's matcher; end_token_ids end it where the grammar accepts (eos, stop tokens).
  std::unique_ptr<GrammarMatcher> make_matcher(const StructuredOutputsParams& params,
                                               std::vector<int32_t> end_token_ids);

 private:
  const Tokenizer& tokenizer_;
  int64_t vocab_size_;
  std::mutex mu_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;  // built on first use (a 150k vocabulary: ~0.1 s)
  std::unordered_map<std::string, std::shared_ptr<CompiledGrammar>> cache_;
};

}  // namespace specula
