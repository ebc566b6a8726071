// Greedy continuations through a started LLMEngine: one request per prompt, all queued at once,
// each ignoring eos for `tokens` tokens; the tokens each stream delivered, in prompt order.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/llm_engine.h"

namespace specula::testing {

inline std::vector<std::vector<int32_t>> greedy_streams(LLMEngine& engine,
                                                        const std::vector<std::vector<int32_t>>& prompts, int tokens,
                                                        std::chrono::seconds timeout = std::chrono::seconds(60)) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = tokens;
    p.ignore_eos = true;
    streams.push_back(engine.add_request(NewRequest{"g" + std::to_string(i), prompts[i], p}));
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOutput o;
    while (streams[i]->pop(&o, timeout)) {
      EXPECT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices) out[i].insert(out[i].end(), d.token_ids.begin(), d.token_ids.end());
      if (o.finished) break;
    }
  }
  return out;
}

}  // namespace specula::testing
