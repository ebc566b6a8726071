// Token-mask cost of structured outputs on real vocabularies, one core: each grammar is fed the
// tokens of valid outputs (tokenized by the real tokenizer, as a model would write them) and the
// mask for every next token is timed. Prints one JSON line per (vocabulary, grammar): the
// median and p99 per token over all outputs, the first output's alone (cold mask cache) and the
// cache hit rate. A plain loop rather than Google Benchmark: the figure wanted is the per-token
// distribution along real paths, not a mean over repeated identical calls.
//   bench_grammar_masks TOKENIZER_DIR [TOKENIZER_DIR...]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "structured_output/grammar_matcher.h"
#include "structured_output/json_schema_to_grammar.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

const char* kToolSchema = R"({"type": "object", "properties": {
  "location": {"type": "string", "maxLength": 40},
  "unit": {"enum": ["celsius", "fahrenheit"]},
  "days": {"type": "integer", "minimum": 1, "maximum": 14},
  "include_hourly": {"type": "boolean"},
  "fields": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4}},
  "required": ["location", "unit", "days", "include_hourly", "fields"]})";

std::vector<std::string> tool_outputs(int n) {
  const char* places[] = {"Paris, France", "San Francisco, CA", "東京", "Zürich", "Lima", "New Delhi, India"};
  const char* fields[] = {"temperature", "wind", "humidity", "uv_index", "precip"};
  std::mt19937 rng(1);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    nlohmann::ordered_json v;
    v["location"] = places[rng() % 6];
    v["unit"] = rng() % 2 ? "celsius" : "fahrenheit";
    v["days"] = 1 + static_cast<int>(rng() % 14);
    v["include_hourly"] = rng() % 2 == 0;
    v["fields"] = nlohmann::json::array();
    for (unsigned k = 0; k < rng() % 5; ++k) v["fields"].push_back(fields[rng() % 5]);
    out.push_back(i % 2 ? v.dump() : v.dump(2));
  }
  return out;
}

std::vector<std::string> object_outputs(int n) {
  std::mt19937 rng(2);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    nlohmann::ordered_json v;
    v["id"] = static_cast<int>(rng() % 100000);
    v["title"] = fmt::format("Report {} on the quarterly numbers", i);
    v["score"] = (rng() % 1000) / 7.0;
    v["tags"] = {"alpha", "beta", nullptr, true};
    v["author"] = {{"name", "Ada Lovelace"}, {"email", "ada@example.com"}, {"age", 36}};
    v["items"] = nlohmann::json::array();
    for (unsigned k = 0; k < 1 + rng() % 3; ++k) v["items"].push_back({{"sku", fmt::format("X-{}", k)}, {"qty", k}});
    out.push_back(i % 2 ? v.dump() : v.dump(2));
  }
  return out;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void run(const std::string& vocab_name, const Tokenizer& tok, std::shared_ptr<const TokenVocabulary> vocab,
         const std::string& grammar_name, Grammar grammar, const std::vector<std::string>& outputs) {
  auto compiled = std::make_shared<CompiledGrammar>(std::move(grammar), vocab);
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  std::vector<double> all_us, cold_us;
  const std::vector<int32_t> eos = {tok.eos_token_id().value_or(0)};
  for (size_t o = 0; o < outputs.size(); ++o) {
    GrammarMatcher m(compiled, eos);
    std::vector<int32_t> ids = tok.encode(outputs[o], false);
    ids.push_back(eos[0]);
    for (int32_t id : ids) {
      const auto t0 = std::chrono::steady_clock::now();
      m.fill_next_token_mask(mask);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      all_us.push_back(us);
      if (o == 0) cold_us.push_back(us);
      if (!(mask[static_cast<size_t>(id) >> 5] >> (id & 31) & 1) || !m.accept_token(id)) {
        fmt::print(stderr, "{} / {}: token {} of output {} not allowed: {}\n", vocab_name, grammar_name, id, o,
                   outputs[o]);
        std::exit(1);
      }
    }
  }
  const auto& st = compiled->cache_stats();
  nlohmann::ordered_json line;
  line["vocabulary"] = vocab_name;
  line["vocab_size"] = vocab->size();
  line["grammar"] = grammar_name;
  line["outputs"] = outputs.size();
  line["masks"] = all_us.size();
  line["median_us"] = percentile(all_us, 0.5);
  line["p99_us"] = percentile(all_us, 0.99);
  line["max_us"] = percentile(all_us, 1.0);
  line["cold_median_us"] = percentile(cold_us, 0.5);
  line["cold_p99_us"] = percentile(cold_us, 0.99);
  line["cache_hit_rate"] = static_cast<double>(st.hits) / static_cast<double>(std::max<int64_t>(1, st.hits + st.misses));
  line["automaton_states"] = compiled->automaton().num_states();
  fmt::print("{}\n", line.dump());
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) {
  using namespace specula;
  if (argc < 2) {
    fmt::print(stderr, "usage: {} TOKENIZER_DIR [TOKENIZER_DIR...]\n", argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    auto tok = Tokenizer::from_dir(argv[i]);
    const std::string name = std::string(argv[i]).substr(std::string(argv[i]).find_last_of('/') + 1);
    const auto t0 = std::chrono::steady_clock::now();
    auto vocab = std::make_shared<const TokenVocabulary>(*tok, tok->vocab_size());
    fmt::print(stderr, "{}: vocabulary indexed in {:.1f} ms\n", name,
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    run(name, *tok, vocab, "tool_schema_5_properties", json_schema_text_to_grammar(kToolSchema), tool_outputs(40));
    run(name, *tok, vocab, "json_object", any_json_grammar(), object_outputs(40));
  }
  return 0;
}
