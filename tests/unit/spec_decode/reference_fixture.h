// The prompts and greedy continuations of a transformers reference fixture
// (tests/fixtures/**/reference.safetensors: I32 tensors prompt_i and greedy_i).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::testing {

struct GreedyReference {
  std::vector<std::vector<int32_t>> prompts, greedy;
  nlohmann::json metadata;
};

inline GreedyReference read_greedy_reference(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  auto tensor = [&](const std::string& name) {
    const auto& t = h[name];
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    std::vector<int32_t> v((end - begin) / 4);
    in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(end - begin));
    return v;
  };
  GreedyReference r;
  if (h.contains("__metadata__")) r.metadata = h["__metadata__"];
  for (int i = 0; h.contains("prompt_" + std::to_string(i)); ++i) {
    r.prompts.push_back(tensor("prompt_" + std::to_string(i)));
    r.greedy.push_back(tensor("greedy_" + std::to_string(i)));
  }
  return r;
}

}  // namespace specula::testing
