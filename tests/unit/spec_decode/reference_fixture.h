// The prompts and greedy continuations of a transformers reference fixture
// (tests/fixtures/**/reference.safetensors: I32 tensors prompt_i and greedy_i, and where the
// generator wrote them F32 greedy_margin_i, each step's top-two margin over its largest |logit|).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::testing {

struct GreedyReference {
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::vector<std::vector<float>> greedy_margins;  // empty where the fixture has none
  nlohmann::json metadata;
};

// A near-tie for a bf16 engine: a top-two margin under 1% of the step's largest |logit|. The GPU's
// bf16 logits of the embedded models deviate from transformers' fp32 by about that much
// (tests/unit/backend/cuda/cuda_model_test.cc measures it), so there it may take the runner-up;
// fp32 engines (the CPU) must not (near_tie 0).
inline constexpr double kBf16NearTie = 0.01;

// `got` is reference continuation `i`, token for token, except that it may leave it at a step
// whose reference margin is below `near_tie` (both continuations are then right, and differ from
// there on, so nothing after it is compared).
inline ::testing::AssertionResult greedy_matches(const std::vector<int32_t>& got, const GreedyReference& ref, size_t i,
                                                 double near_tie) {
  const std::vector<int32_t>& want = ref.greedy.at(i);
  for (size_t step = 0; step < want.size(); ++step) {
    if (step >= got.size()) {
      return ::testing::AssertionFailure() << got.size() << " tokens where the reference has " << want.size();
    }
    if (got[step] == want[step]) continue;
    const double margin = i < ref.greedy_margins.size() ? ref.greedy_margins[i].at(step) : 1.0;
    if (margin < near_tie) {
      return ::testing::AssertionSuccess() << "left the reference at near-tie step " << step << " (margin " << margin
                                           << ")";
    }
    return ::testing::AssertionFailure() << "token " << step << " is " << got[step] << " where the reference has "
                                         << want[step] << " (reference margin " << margin << " of the logit scale)";
  }
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " tokens where the reference has " << want.size();
  }
  return ::testing::AssertionSuccess();
}

// Tensor `name` of a safetensors file whose header (JSON `h`, `header_len` bytes) was read.
template <typename T>
std::vector<T> read_fixture_tensor(std::ifstream& in, const nlohmann::json& h, uint64_t header_len,
                                   const std::string& name) {
  const auto& t = h[name];
  const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
  std::vector<T> v((end - begin) / sizeof(T));
  in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(end - begin));
  return v;
}

inline GreedyReference read_greedy_reference(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  GreedyReference r;
  if (h.contains("__metadata__")) r.metadata = h["__metadata__"];
  for (int i = 0; h.contains("prompt_" + std::to_string(i)); ++i) {
    const std::string n = std::to_string(i);
    r.prompts.push_back(read_fixture_tensor<int32_t>(in, h, header_len, "prompt_" + n));
    r.greedy.push_back(read_fixture_tensor<int32_t>(in, h, header_len, "greedy_" + n));
    if (h.contains("greedy_margin_" + n)) {
      r.greedy_margins.push_back(read_fixture_tensor<float>(in, h, header_len, "greedy_margin_" + n));
    }
  }
  return r;
}

}  // namespace specula::testing
