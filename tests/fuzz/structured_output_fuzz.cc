// libFuzzer target: a structured-output constraint as a user sends it, compiled and run.
//
// The first byte picks the front end (JSON Schema text, regex, EBNF, a choice list); the input up
// to the first NUL byte after it is the constraint, the rest is text the model might write. A
// constraint that compiles is run: the automaton over that text byte by byte, and the token masks
// over specula-tiny's vocabulary at the start and where the text stops (what the engine does per
// token). specula::Error is the expected refusal of a bad constraint (GrammarLimitError, of one
// that outgrows the automaton's bounds, may also come while running it; the matcher takes it in
// itself); crashes, sanitizer reports, hangs and other exceptions are bugs.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_util.h"
#include "structured_output/choice_grammar.h"
#include "structured_output/compiled_grammar.h"
#include "structured_output/ebnf_parser.h"
#include "structured_output/grammar_matcher.h"
#include "structured_output/json_schema_to_grammar.h"
#include "structured_output/regex_to_grammar.h"
#include "structured_output/token_vocabulary.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace specula;

const std::shared_ptr<const TokenVocabulary>& vocabulary() {
  static const std::shared_ptr<const TokenVocabulary> v = [] {
    auto tokenizer = Tokenizer::from_dir(testing::models_dir() / "specula-tiny");
    return std::make_shared<const TokenVocabulary>(*tokenizer, tokenizer->vocab_size());
  }();
  return v;
}

Grammar compile(uint8_t front_end, std::string_view text) {
  switch (front_end % 4) {
    case 0: return json_schema_text_to_grammar(text);
    case 1: return regex_to_grammar(text);
    case 2: return parse_ebnf(text);
    default: {  // a choice list, one choice a line
      std::vector<std::string> choices;
      size_t start = 0;
      while (start <= text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string_view::npos) end = text.size();
        choices.emplace_back(text.substr(start, end - start));
        start = end + 1;
      }
      return choice_grammar(choices);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vocabulary();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string input = fuzz::as_string(data + 1, size - 1);
  const size_t split = input.find('\0');
  const std::string_view constraint = std::string_view(input).substr(0, split);
  const std::string_view output =
      split == std::string::npos ? std::string_view() : std::string_view(input).substr(split + 1);
  std::shared_ptr<CompiledGrammar> compiled;
  try {
    compiled = std::make_shared<CompiledGrammar>(compile(data[0], constraint), vocabulary());
  } catch (const Error&) {
    return 0;
  }
  GrammarAutomaton& automaton = compiled->automaton();
  GrammarAutomaton::StateId state = automaton.initial();
  try {
    (void)compiled->token_mask(state);
    for (char c : output) {
      const GrammarAutomaton::StateId next = automaton.advance(state, static_cast<uint8_t>(c));
      if (next == GrammarAutomaton::kDead) break;
      state = next;
    }
    (void)automaton.accepting(state);
    (void)automaton.next_bytes(state);
    (void)compiled->token_mask(state);
  } catch (const GrammarLimitError&) {
    // Refused mid-way; the matcher below must carry on regardless.
  }

  // The matcher as the engine drives it: take the first allowed token a few times, roll back.
  GrammarMatcher matcher(compiled, {0});
  std::vector<uint32_t> mask(static_cast<size_t>(matcher.mask_words()));
  int accepted = 0;
  for (int step = 0; step < 8; ++step) {
    matcher.fill_next_token_mask(mask);
    int32_t token = -1;
    for (size_t w = 0; w < mask.size() && token < 0; ++w) {
      if (mask[w] != 0) token = static_cast<int32_t>(w * 32 + __builtin_ctz(mask[w]));
    }
    if (token < 0 || !matcher.accept_token(token)) break;
    ++accepted;
  }
  matcher.rollback(accepted);
  return 0;
}
