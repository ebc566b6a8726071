#include "cli/bench_serve_dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace specula::cli {
namespace {

using json = nlohmann::json;

// Lower-case words common in English and in code: most are one or two tokens in any BPE
// vocabulary, and each is preceded by a space so that a prompt's count is the sum of its words'.
constexpr const char* kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on", "be", "at", "by", "this",
    "from", "or", "an", "are", "not", "if", "else", "return", "def", "class", "import", "self", "value",
    "list", "data", "file", "name", "type", "time", "number", "string", "result", "index", "error", "function",
    "object", "model", "token", "server", "request", "response", "client", "system", "process", "thread",
    "memory", "cache", "block", "batch", "queue", "order", "point", "state", "world", "water", "house", "people",
    "light", "river", "city", "music", "story", "green", "small", "large", "early", "later", "first", "second",
    "simple", "general", "common", "public", "private", "local", "global", "input", "output", "length", "count",
    "table", "field", "query", "option", "method", "update", "create", "delete", "remove", "insert", "append",
    "while", "break", "true", "false", "none", "print", "range", "open", "close", "read", "write", "start", "stop"};

int uniform_len(std::mt19937_64& rng, int len, double ratio) {
  const int lo = std::max(1, static_cast<int>(std::floor(len * (1.0 - ratio))));
  const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1.0 + ratio))));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

std::vector<BenchRequest> random_dataset(const DatasetArgs& a, RemoteTokenizer& tok) {
  std::mt19937_64 rng(a.seed);
  // Token count of each " word" (one when the server cannot tell).
  std::vector<std::string> words(std::begin(kWords), std::end(kWords));
  std::vector<int> counts(words.size(), 1);
  int special = 0;  // tokens the tokenizer adds to any prompt (a BOS)
  if (tok.available()) {
    for (size_t i = 0; i < words.size(); ++i) {
      auto ids = tok.encode(" " + words[i], false);
      counts[i] = ids ? std::max<int>(1, static_cast<int>(ids->size())) : 1;
    }
    if (auto ids = tok.encode("", true)) special = static_cast<int>(ids->size());
  }
  std::vector<BenchRequest> out;
  for (int i = 0; i < a.num_prompts; ++i) {
    BenchRequest r;
    const int target = uniform_len(rng, a.input_len, a.range_ratio);
    r.output_len = uniform_len(rng, a.output_len, a.range_ratio);
    r.ignore_eos = true;
    int remaining = std::max(1, target - special);
    std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
    while (remaining > 0) {
      size_t w = pick(rng);
      if (counts[w] > remaining) {  // finish with a word that fits (draw among those)
        std::vector<size_t> fit;
        for (size_t k = 0; k < words.size(); ++k) if (counts[k] <= remaining) fit.push_back(k);
        if (fit.empty()) break;
        w = fit[std::uniform_int_distribution<size_t>(0, fit.size() - 1)(rng)];
      }
      r.prompt += " " + words[w];
      remaining -= counts[w];
    }
    r.prompt_len = target;
    if (tok.available()) {
      if (auto ids = tok.encode(r.prompt, true)) r.prompt_len = static_cast<int>(ids->size());
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<BenchRequest> jsonl_dataset(const DatasetArgs& a, RemoteTokenizer& tok) {
  SPECULA_CHECK(!a.path.empty(), "--dataset-name {} needs --dataset-path FILE.jsonl", a.name);
  std::ifstream in(a.path);
  SPECULA_CHECK(in.good(), "--dataset-path {}: cannot read the file", a.path);
  std::vector<BenchRequest> rows;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw Error(fmt::format("{}:{}: not JSON ({})", a.path, lineno, e.what()));
    }
    SPECULA_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
                  "{}:{}: expected an object with a string \"prompt\"", a.path, lineno);
    BenchRequest r;
    r.prompt = j["prompt"].get<std::string>();
    r.output_len = a.custom_output_len;
    if (j.contains("output_len")) {
      SPECULA_CHECK(j["output_len"].is_number_integer() && j["output_len"].get<int>() > 0,
                    "{}:{}: \"output_len\" must be a positive integer", a.path, lineno);
      r.output_len = j["output_len"].get<int>();
    }
    r.ignore_eos = a.ignore_eos;
    rows.push_back(std::move(r));
  }
  SPECULA_CHECK(!rows.empty(), "--dataset-path {}: no prompts in the file", a.path);
  std::vector<BenchRequest> out;
  for (int i = 0; i < a.num_prompts; ++i) out.push_back(rows[static_cast<size_t>(i) % rows.size()]);
  for (BenchRequest& r : out) {
    std::optional<std::vector<int32_t>> ids;
    if (tok.available()) ids = tok.encode(r.prompt, true);
    if (ids) {
      r.prompt_len = static_cast<int>(ids->size());
    } else {  // words as tokens
      std::istringstream words(r.prompt);
      std::string w;
      while (words >> w) ++r.prompt_len;
    }
  }
  return out;
}

std::vector<BenchRequest> text_dataset(const DatasetArgs& a, RemoteTokenizer& tok) {
  SPECULA_CHECK(!a.path.empty(), "--dataset-name text needs --dataset-path FILE");
  std::ifstream in(a.path, std::ios::binary);
  SPECULA_CHECK(in.good(), "--dataset-path {}: cannot read the file", a.path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  constexpr size_t kMaxBytes = 1 << 20;
  if (text.size() > kMaxBytes) text.resize(kMaxBytes);
  std::mt19937_64 rng(a.seed);
  std::vector<BenchRequest> out;
  std::optional<std::vector<int32_t>> ids;
  if (tok.available()) ids = tok.encode(text, false);
  std::vector<std::string> words;
  if (!ids) {
    std::istringstream ws(text);
    for (std::string w; ws >> w;) words.push_back(w);
  }
  const size_t total = ids ? ids->size() : words.size();
  for (int i = 0; i < a.num_prompts; ++i) {
    BenchRequest r;
    const int len = uniform_len(rng, a.input_len, a.range_ratio);
    r.output_len = uniform_len(rng, a.output_len, a.range_ratio);
    r.ignore_eos = true;
    SPECULA_CHECK(total >= static_cast<size_t>(len), "--dataset-path {}: {} {} in the file, a prompt needs {}",
                  a.path, total, ids ? "tokens" : "words", len);
    const size_t start = std::uniform_int_distribution<size_t>(0, total - static_cast<size_t>(len))(rng);
    if (ids) {
      std::vector<int32_t> window(ids->begin() + static_cast<std::ptrdiff_t>(start),
                                  ids->begin() + static_cast<std::ptrdiff_t>(start) + len);
      auto decoded = tok.decode(window);
      SPECULA_CHECK(decoded.has_value(), "the server answers /tokenize but not /detokenize");
      r.prompt = *decoded;
      auto again = tok.encode(r.prompt, true);
      r.prompt_len = again ? static_cast<int>(again->size()) : len;
    } else {
      for (int k = 0; k < len; ++k) r.prompt += (k ? " " : "") + words[start + static_cast<size_t>(k)];
      r.prompt_len = len;
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

RemoteTokenizer::RemoteTokenizer(HttpClient& client, std::string model) : client_(client), model_(std::move(model)) {
  const json body = {{"model", model_}, {"prompt", "probe"}, {"add_special_tokens", false}};
  HttpResult r = client_.post_json("/tokenize", body.dump());
  available_ = r.ok();
  if (!available_) probe_error_ = r.describe();
}

std::optional<std::vector<int32_t>> RemoteTokenizer::encode(const std::string& text, bool add_special_tokens) {
  if (!available_) return std::nullopt;
  const json body = {{"model", model_}, {"prompt", text}, {"add_special_tokens", add_special_tokens}};
  HttpResult r = client_.post_json("/tokenize", body.dump());
  if (!r.ok()) return std::nullopt;
  try {
    return json::parse(r.body).at("tokens").get<std::vector<int32_t>>();
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

std::optional<std::string> RemoteTokenizer::decode(const std::vector<int32_t>& ids) {
  if (!available_) return std::nullopt;
  const json body = {{"model", model_}, {"tokens", ids}};
  HttpResult r = client_.post_json("/detokenize", body.dump());
  if (!r.ok()) return std::nullopt;
  try {
    return json::parse(r.body).at("prompt").get<std::string>();
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

std::vector<BenchRequest> build_dataset(const DatasetArgs& args, RemoteTokenizer& tokenizer) {
  if (args.name == "random") return random_dataset(args, tokenizer);
  if (args.name == "jsonl" || args.name == "custom") return jsonl_dataset(args, tokenizer);
  if (args.name == "text") return text_dataset(args, tokenizer);
  throw Error(fmt::format("--dataset-name {}: expected random, jsonl (or custom) or text", args.name));
}

}  // namespace specula::cli
