// The tensor-parallel engine tests' workload (CPU and CUDA): both reference prompts of the
// embedded target twice at once (the copies hit the prefix cache), greedy, against transformers'
// continuations (up to a near-tie on GPUs); with speculation, drafts must be proposed (and
// accepted, unless the head is random).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "app/create_engine.h"
#include "engine/llm_engine.h"
#include "mtp_test_util.h"
#include "test_paths.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula::testing {

// `drafts_accepted`: with speculation, some drafts must be accepted (false for a random head, whose
// drafts must still be proposed and verified).
inline void expect_tiny_greedy_reference(const EngineConfig& config, const std::string& what,
                                         bool drafts_accepted = true) {
  const GreedyReference ref =
      read_greedy_reference(fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors");
  auto engine = create_engine(config);
  engine->start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int copy = 0; copy < 2; ++copy)
    for (size_t i = 0; i < ref.prompts.size(); ++i)
      streams.push_back(engine->add_request(NewRequest{"r" + std::to_string(copy) + std::to_string(i), ref.prompts[i],
                                                       greedy_params(static_cast<int>(ref.greedy[i].size()))}));
  // fp32 on the CPU: token for token; bf16 on GPUs may take a near-tie's runner-up.
  const double near_tie = config.device == "cuda" ? kBf16NearTie : 0.0;
  for (size_t k = 0; k < streams.size(); ++k)
    EXPECT_TRUE(greedy_matches(collect_tokens(*streams[k]), ref, k % ref.prompts.size(), near_tie))
        << what << " request " << k;
  const EngineMetrics m = settled(*engine);
  if (!config.speculative_config.empty()) {
    EXPECT_GT(m.spec_num_draft_tokens, 0) << what;
    if (drafts_accepted) EXPECT_GT(m.spec_num_accepted_tokens, 0) << what;
  }
  EXPECT_GT(m.prefix_cache_hits, 0) << what;
  engine->shutdown();
}

}  // namespace specula::testing
