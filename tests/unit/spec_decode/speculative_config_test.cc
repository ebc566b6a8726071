// --speculative-config parsing: vLLM's keys and defaults, strict errors that say what is wrong.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/edit_distance.h"
#include "core/error.h"
#include "model/config.h"
#include "spec_decode/proposer_registry.h"
#include "spec_decode/speculative_config.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/engine/engine_fakes.h"

namespace specula {
namespace {

// The error message of parsing `json` ("" when it parses).
std::string error_of(const std::string& json) {
  try {
    parse_speculative_config(json);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpeculativeConfig, DraftModel) {
  SpeculativeConfig c = parse_speculative_config(
      R"({"method": "draft_model", "model": "models/specula-tiny-draft", "num_speculative_tokens": 3})");
  EXPECT_EQ(c.method, "draft_model");
  EXPECT_EQ(c.model, "models/specula-tiny-draft");
  EXPECT_EQ(c.num_speculative_tokens, 3);
  EXPECT_EQ(c.draft_tensor_parallel_size, 1);
  EXPECT_TRUE(c.adaptive);
  EXPECT_EQ(c.max_model_len, 0);
  // vLLM infers draft_model from a model with no method; "-" spellings of keys are accepted.
  c = parse_speculative_config(R"({"model": "d", "num-speculative-tokens": 2, "max-model-len": 300, "adaptive": false})");
  EXPECT_EQ(c.method, "draft_model");
  EXPECT_EQ(c.num_speculative_tokens, 2);
  EXPECT_EQ(c.max_model_len, 300);
  EXPECT_FALSE(c.adaptive);
}

TEST(SpeculativeConfig, NgramDefaultsAsVllm) {
  SpeculativeConfig c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4})");
  EXPECT_EQ(c.method, "ngram");
  EXPECT_EQ(c.prompt_lookup_min, 5);
  EXPECT_EQ(c.prompt_lookup_max, 5);
  c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})");
  EXPECT_EQ(c.prompt_lookup_min, 3);
  EXPECT_EQ(c.prompt_lookup_max, 3);
  c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2})");
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_EQ(c.prompt_lookup_max, 2);
  // "[ngram]" as model (vLLM's older spelling) names the method.
  c = parse_speculative_config(R"({"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 4})");
  EXPECT_EQ(c.method, "ngram");
  EXPECT_TRUE(c.model.empty());
  EXPECT_EQ(c.prompt_lookup_min, 1);
  EXPECT_EQ(c.prompt_lookup_max, 4);
}

TEST(SpeculativeConfig, UnknownKeyNamesTheNearestValidKey) {
  const std::string e = error_of(R"({"method": "ngram", "num_speculative_tokeens": 4})");
  EXPECT_NE(e.find("unknown key \"num_speculative_tokeens\""), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean \"num_speculative_tokens\"?"), std::string::npos) << e;
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_mx": 3})")
                .find("did you mean \"prompt_lookup_max\"?"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"methd": "ngram"})").find("did you mean \"method\"?"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngramm", "num_speculative_tokens": 1})").find("did you mean \"ngram\"?"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "draft_modle", "model": "x", "num_speculative_tokens": 1})")
                .find("did you mean \"draft_model\"?"),
            std::string::npos);
}

TEST(SpeculativeConfig, IncompatibleCombinationsSayWhy) {
  struct Case {
    const char* json;
    const char* says;
  };
  const Case cases[] = {
      {R"({"method": "draft_model", "num_speculative_tokens": 3})", "needs \"model\""},
      {R"({"method": "ngram", "model": "models/specula-tiny-draft", "num_speculative_tokens": 3})",
       "method ngram takes no \"model\""},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "num_speculative_tokens=0 must be at least 1"},
      {R"({"method": "ngram", "num_speculative_tokens": -2})", "must be at least 1"},
      {R"({"method": "ngram"})", "needs \"num_speculative_tokens\""},
      {R"({"method": "ngram", "num_speculative_tokens": 99})", "more than the 16 supported"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2})",
       "prompt_lookup_min=4 must be <= prompt_lookup_max=2"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0, "prompt_lookup_max": 2})",
       "prompt_lookup_min=0 must be > 0"},
      {R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 2, "prompt_lookup_min": 2})",
       "apply to method ngram only"},
      {R"({"method": "eagle3", "model": "d", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2})",
       "is for method draft_model only"},
      {R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 0})",
       "draft_tensor_parallel_size=0 must be at least 1"},
      {R"({"method": "draft_model", "model": "ngram", "num_speculative_tokens": 2})", "names the ngram method"},
      {R"({"num_speculative_tokens": 2})", "\"method\" is required"},
      {R"({"method": "ngram", "num_speculative_tokens": "3"})", "\"num_speculative_tokens\" must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 2.5})", "must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "adaptive": "yes"})", "\"adaptive\" must be true or false"},
      {R"({"method": 3, "num_speculative_tokens": 2})", "\"method\" must be a string"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "max_model_len": 1})", "max_model_len=1 must be at least 2"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "draft_sampling": "topk"})",
       "\"draft_sampling\" must be \"argmax\" or \"sampled\""},
      {R"(["ngram"])", "must be a JSON object"},
      {R"({"method": "ngram",)", "not valid JSON"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of(c.json);
    EXPECT_NE(e.find(c.says), std::string::npos) << c.json << " -> '" << e << "'";
    EXPECT_NE(e.find("--speculative-config"), std::string::npos) << e;
  }
}

TEST(SpeculativeConfig, EagleMethodsNeedAHeadAndAreInferredFromItsName) {
  for (const char* m : {"eagle", "eagle3"}) {
    const SpeculativeConfig c = parse_speculative_config(std::string(R"({"method": ")") + m +
                                                         R"(", "model": "heads/x", "num_speculative_tokens": 1})");
    EXPECT_EQ(c.method, m);
    EXPECT_TRUE(has_proposer(c.method)) << m;
    try {
      parse_speculative_config(std::string(R"({"method": ")") + m + R"(", "num_speculative_tokens": 1})");
      ADD_FAILURE() << m << " without a model should not parse";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs \"model\""), std::string::npos) << e.what();
    }
  }
  // As vLLM: the method follows from the head's name when left out.
  EXPECT_EQ(parse_speculative_config(R"({"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3})").method,
            "eagle3");
  EXPECT_EQ(parse_speculative_config(R"({"model": "yuhuili/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 3})").method,
            "eagle");
  // MTP may leave k to its checkpoint (num_nextn_predict_layers), as vLLM does.
  EXPECT_EQ(parse_speculative_config(R"({"method": "mtp"})").num_speculative_tokens, 0);
  EXPECT_TRUE(has_proposer("draft_model"));
  EXPECT_TRUE(has_proposer("ngram"));
  EXPECT_TRUE(has_proposer("mtp"));  // mtp_proposer.h; deepseek_mtp parses to it
  EXPECT_EQ(parse_speculative_config(R"({"method": "deepseek_mtp"})").method, "mtp");
}

TEST(SpeculativeConfig, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("num_speculative_tokeens", "num_speculative_tokens"), 1u);
}

// A tokenizer equal to FakeTokenizer except for one token string.
class RenamedTokenTokenizer : public testing::FakeTokenizer {
 public:
  std::string id_to_token(int32_t id) const override { return id == 40 ? "renamed" : FakeTokenizer::id_to_token(id); }
};

TEST(SpeculativeConfig, DraftMustShareTheVocabulary) {
  const SpeculativeConfig spec = parse_speculative_config(R"({"model": "draft", "num_speculative_tokens": 2})");
  ModelConfig target, draft;
  target.vocab_size = draft.vocab_size = 64;
  target.max_position_embeddings = 4096;
  draft.max_position_embeddings = 512;
  testing::FakeTokenizer tok, same;
  EXPECT_EQ(validate_draft_model(spec, target, tok, draft, same, 1024), 512);  // the draft's limit
  EXPECT_EQ(validate_draft_model(spec, target, tok, draft, same, 256), 256);   // the target's

  ModelConfig bigger = draft;
  bigger.vocab_size = 65;
  try {
    validate_draft_model(spec, target, tok, bigger, same, 256);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 65 but the target has 64"), std::string::npos) << e.what();
  }
  testing::FakeTokenizer longer(70);
  EXPECT_THROW(validate_draft_model(spec, target, tok, draft, longer, 256), Error);
  RenamedTokenTokenizer renamed;
  try {
    validate_draft_model(spec, target, tok, draft, renamed, 256);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differs from the target's at token id 40"), std::string::npos) << e.what();
  }
  const SpeculativeConfig too_long =
      parse_speculative_config(R"({"model": "draft", "num_speculative_tokens": 2, "max_model_len": 1000})");
  EXPECT_THROW(validate_draft_model(too_long, target, tok, draft, same, 1024), Error);
  const SpeculativeConfig shorter =
      parse_speculative_config(R"({"model": "draft", "num_speculative_tokens": 2, "max_model_len": 100})");
  EXPECT_EQ(validate_draft_model(shorter, target, tok, draft, same, 1024), 100);
}

TEST(SpeculativeConfig, EmbeddedPairSharesItsVocabularyAndAFixtureModelDoesNot) {
  namespace fs = std::filesystem;
  const fs::path tiny = testing::models_dir() / "specula-tiny", draft = testing::models_dir() / "specula-tiny-draft";
  ASSERT_TRUE(fs::exists(tiny / "config.json") && fs::exists(draft / "config.json")) << "committed embedded models missing";
  const SpeculativeConfig spec =
      parse_speculative_config(R"({"model": ")" + draft.string() + R"(", "num_speculative_tokens": 3})");
  const ModelConfig tc = load_model_config(tiny), dc = load_model_config(draft);
  auto tt = Tokenizer::from_dir(tiny), dt = Tokenizer::from_dir(draft);
  EXPECT_EQ(validate_draft_model(spec, tc, *tt, dc, *dt, 512), 512);
  const ModelConfig other = load_model_config(testing::fixtures_dir() / "models" / "qwen3_qknorm_headdim");
  EXPECT_THROW(validate_draft_model(spec, tc, *tt, other, *dt, 512), Error);
}

}  // namespace
}  // namespace specula
