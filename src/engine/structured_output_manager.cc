#include "engine/structured_output_manager.h"

#include <fmt/format.h>

#include "core/error.h"
#include "structured_output/choice_grammar.h"
#include "structured_output/ebnf_parser.h"
#include "structured_output/json_schema_to_grammar.h"
#include "structured_output/regex_to_grammar.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

// Compiled grammars kept for reuse; requests hold theirs, so dropping the cache frees nothing
// in use.
constexpr size_t kMaxCachedGrammars = 64;

using Kind = StructuredOutputsParams::Kind;

std::string cache_key(const StructuredOutputsParams& p) {
  std::string key = fmt::format("{}:{}:", static_cast<int>(p.kind), p.any_whitespace ? 1 : 0);
  key += p.spec;
  for (const std::string& c : p.choices) {
    key += '\0';
    key += c;
  }
  return key;
}

Grammar build_grammar(const StructuredOutputsParams& p) {
  JsonGrammarOptions json_options;
  json_options.any_whitespace = p.any_whitespace;
  switch (p.kind) {
    case Kind::kJson:  // parsed keeping the key order: properties come out in the schema's order
      return json_schema_text_to_grammar(p.spec, json_options);
    case Kind::kJsonObject:
      return any_json_grammar(json_options);
    case Kind::kRegex:
      return regex_to_grammar(p.spec);
    case Kind::kChoice:
      return choice_grammar(p.choices);
    case Kind::kGrammar:
      return parse_ebnf(p.spec);
  }
  throw Error("unknown structured output kind");
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kJson: return "json schema";
    case Kind::kJsonObject: return "json_object";
    case Kind::kRegex: return "regex";
    case Kind::kChoice: return "choice";
    case Kind::kGrammar: return "grammar";
  }
  return "structured output";
}

}  // namespace

StructuredOutputManager::StructuredOutputManager(const Tokenizer& tokenizer, int64_t vocab_size)
    : tokenizer_(tokenizer), vocab_size_(vocab_size) {}

std::shared_ptr<CompiledGrammar> StructuredOutputManager::compile(const StructuredOutputsParams& params) {
  const std::string key = cache_key(params);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  std::shared_ptr<const TokenVocabulary> vocabulary;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!vocabulary_) vocabulary_ = std::make_shared<TokenVocabulary>(tokenizer_, vocab_size_);
    vocabulary = vocabulary_;
  }
  std::shared_ptr<CompiledGrammar> compiled;
  try {
    compiled = std::make_shared<CompiledGrammar>(build_grammar(params), std::move(vocabulary));
    // The first token's mask now, on the validating thread: a grammar that outgrows the
    // automaton's bounds from the start is a 400 here, not a request failed after admission.
    (void)compiled->token_mask(compiled->automaton().initial());
  } catch (const Error& e) {
    throw Error(fmt::format("Invalid structured output ({}): {}", kind_name(params.kind), e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;  // compiled meanwhile
  if (cache_.size() >= kMaxCachedGrammars) cache_.clear();
  cache_.emplace(key, compiled);
  return compiled;
}

std::unique_ptr<GrammarMatcher> StructuredOutputManager::make_matcher(const StructuredOutputsParams& params,
                                                                      std::vector<int32_t> end_token_ids) {
  return std::make_unique<GrammarMatcher>(compile(params), std::move(end_token_ids));
}

}  // namespace specula
