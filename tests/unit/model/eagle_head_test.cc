// EAGLE head configs: the public Llama-3.1-8B EAGLE-3 head's config.json (bench/configs) read
// against its target, vLLM's default feature layers, and the head's forward against transformers
// (the trained specula-tiny-eagle3 head, tests/fixtures/embedded/specula-tiny-eagle3).
#include <gtest/gtest.h>

#include <filesystem>

#include "model/config.h"
#include "model/eagle_head.h"
#include "test_paths.h"

namespace specula {
namespace {

std::filesystem::path bench(const std::string& name) { return testing::source_dir() / "bench" / "configs" / name; }

TEST(EagleHeadConfig, ThePublicLlama31Eagle3HeadFitsItsTarget) {
  const ModelConfig target = load_model_config(bench("Llama-3.1-8B-Instruct"));
  const EagleHeadConfig c = load_eagle_head_config(bench("EAGLE3-Llama-3.1-8B"), EagleVersion::kEagle3, target);
  EXPECT_EQ(c.version, EagleVersion::kEagle3);
  EXPECT_EQ(c.layer.hidden_size, 4096);
  EXPECT_EQ(c.layer.num_attention_heads, 32);
  EXPECT_EQ(c.layer.num_key_value_heads, 8);
  EXPECT_EQ(c.layer.head_dim, 128);
  EXPECT_EQ(c.layer.intermediate_size, 14336);
  EXPECT_EQ(c.draft_vocab_size, 31960);
  EXPECT_EQ(c.target_hidden_size, 4096);
  // No eagle_config: vLLM's low / middle / high layers of 32.
  EXPECT_EQ(c.aux_layers, (std::vector<int>{2, 16, 29}));
  EXPECT_EQ(c.feature_size(), 3 * 4096);
  // The same head under the wrong method, or for a target it was not trained for.
  EXPECT_THROW(load_eagle_head_config(bench("EAGLE3-Llama-3.1-8B"), EagleVersion::kEagle1, target), Error);
  EXPECT_THROW(load_eagle_head_config(bench("EAGLE3-Llama-3.1-8B"), EagleVersion::kEagle3,
                                      load_model_config(bench("Qwen3-8B"))),
               Error);
}

}  // namespace
}  // namespace specula
