// The MTP proposer inside the real engine (specula-tiny-moe, CPU), held to a from-scratch
// recomputation: a recording wrapper around the registered `mtp` proposer keeps every proposal
// (the request's tokens, its drafts and the q each was sampled from), and each must equal what the
// MTP layer computes when the target and the MTP layer are run over the whole sequence anew
// (tests/unit/model/deepseek_mtp_reference.h). That holds only if the incremental MTP cache is
// right after chunked prefill, accepted and rejected drafts, steps without drafts (the wrapper
// forces depth 0 on every other step), preemption and prefix-cache hits, with draft steps run at
// a padded batch size or not; padded, short catch-ups also run the CUDA graphs' layout (r rows
// per request, rows past a piece's end writing nothing) eagerly; all-greedy batches chain their
// drafts on the device (draft_chain.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "sampling/sampling_math.h"
#include "model/deepseek_mtp.h"
#include "model/weight_source.h"
#include "unit/app/forwarding_proposer.h"
#include "unit/app/mtp_test_util.h"
#include "spec_decode/mtp_proposer.h"
#include "spec_decode/proposer_registry.h"
#include "unit/model/deepseek_mtp_reference.h"

namespace specula {
namespace {

struct Proposal {
  std::string req_id;
  std::vector<int32_t> tokens;
  int num_prompt_tokens = 0;
  SamplingParams params;  // a copy: the request's own is gone once it finishes
  uint64_t seed = 0;
  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> q;  // per draft; empty for greedy requests
  int inherited = 0;                  // positions taken from shared blocks
};

class RecordingProposer : public testing::ForwardingProposer {
 public:
  RecordingProposer(std::unique_ptr<Proposer> inner, std::vector<Proposal>* out, int64_t* uniform_catch_ups,
                    int64_t* chains)
      : ForwardingProposer(std::move(inner)), mtp_(dynamic_cast<MtpProposer*>(&this->inner())), out_(out),
        uniform_catch_ups_(uniform_catch_ups), chains_(chains) {
    EXPECT_NE(mtp_, nullptr);
  }

  void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override {
    ProposeBatch b = batch;
    if (++calls_ % 2 == 0) b.depth = 0;  // a step without drafts must still be consumed
    inner().propose(b, drafts);
    *uniform_catch_ups_ = mtp_->num_uniform_catch_ups();
    *chains_ = mtp_->num_greedy_chains();
    for (size_t i = 0; i < b.requests.size(); ++i) {
      const ProposerRequest& r = b.requests[i];
      // After every step the MTP cache covers exactly the positions the target's does.
      EXPECT_EQ(mtp_->num_computed(r.req_id), r.num_target_computed) << r.req_id;
      if (b.depth == 0) EXPECT_TRUE(drafts[i].empty());
      if (drafts[i].empty()) continue;
      Proposal p{std::string(r.req_id), {r.tokens.begin(), r.tokens.end()}, r.num_prompt_tokens, *r.params, r.seed,
                 drafts[i], {}, mtp_->num_inherited(r.req_id)};
      if (!r.params->greedy()) {
        const Tensor& q = *draft_probs();
        const int64_t v = q.size(1), row = draft_probs_row(r.req_id);
        for (size_t j = 0; j < drafts[i].size(); ++j) {
          const float* src = q.data_as<float>() + (row + static_cast<int64_t>(j)) * v;
          p.q.emplace_back(src, src + v);
        }
      }
      out_->push_back(std::move(p));
    }
  }

 private:
  MtpProposer* mtp_;
  std::vector<Proposal>* out_;
  int64_t* uniform_catch_ups_;
  int64_t* chains_;
  int calls_ = 0;
};

// make_mtp_proposer, but with draft steps and short catch-ups padded to a multiple of 4 requests
// (CUDA-graph sizes).
std::unique_ptr<Proposer> make_padded_mtp_proposer(const ProposerContext& ctx) {
  auto weights = open_safetensors_checkpoint(ctx.engine.target_model);
  auto mtp = std::make_unique<DeepseekMtp>(ctx.engine.target_config, *weights, ctx.engine.backend, ModelOptions{}, &ctx.engine.target, false);
  MtpProposerConfig c;
  c.num_speculative_tokens = ctx.spec.num_speculative_tokens;
  c.max_num_seqs = ctx.engine.max_num_seqs;
  c.max_num_batched_tokens = ctx.engine.max_num_batched_tokens;
  c.max_model_len = ctx.engine.max_model_len;
  const int most = ctx.engine.max_num_seqs;
  c.pad_batch = [most](int n) { return std::min(most, (n + 3) / 4 * 4); };
  return std::make_unique<MtpProposer>(std::move(mtp), ctx.engine.backend, make_cpu_draft_sampler(ctx.engine.backend), c);
}

// Registers the recording wrapper as `mtp` for the test's lifetime.
struct RecordingRegistration {
  RecordingRegistration(std::vector<Proposal>* out, bool padded, int64_t* uniform_catch_ups, int64_t* chains) {
    register_proposer("mtp", [out, padded, uniform_catch_ups, chains](const ProposerContext& ctx) {
      return std::make_unique<RecordingProposer>(padded ? make_padded_mtp_proposer(ctx) : make_mtp_proposer(ctx), out,
                                                 uniform_catch_ups, chains);
    });
  }
  ~RecordingRegistration() { register_proposer("mtp", make_mtp_proposer); }
};

TEST(MtpProposer, EveryProposalEqualsTheMtpLayerRecomputedFromScratch) {
  ASSERT_TRUE(testing::have_moe()) << "committed specula-tiny-moe or its reference missing";
  const testing::GreedyReference ref = testing::read_greedy_reference(testing::moe_reference_file());
  // Greedy and sampled requests (q kept), prompts repeated (prefix-cache hits), a cache small
  // enough to preempt, chunked prefill beside verifications.
  // A last run has greedy requests only: every drafting step chains its drafts on the device.
  struct Run {
    int k;
    bool padded, all_greedy;
  };
  std::vector<Proposal> proposals;
  for (const Run run : {Run{1, false, false}, Run{3, false, false}, Run{3, true, false}, Run{3, true, true}}) {
    const int k = run.k;
    const bool padded = run.padded;
    SCOPED_TRACE("k=" + std::to_string(k) + (padded ? ", draft steps padded" : "") +
                 (run.all_greedy ? ", greedy only" : ""));
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    for (int i = 0; i < 6; ++i) {
      prompts.push_back(ref.prompts[i % 2]);
      SamplingParams p = testing::greedy_params(24 + 4 * i);
      if (i % 3 != 0 && !run.all_greedy) {
        p.temperature = 1.0f;
        p.top_k = 20;
        p.seed = 100 + i;
      }
      params.push_back(p);
    }
    proposals.clear();
    int64_t preemptions = 0, hits = 0, uniform_catch_ups = 0, chains = 0;
    {
      RecordingRegistration rec(&proposals, padded, &uniform_catch_ups, &chains);
      EngineConfig ec = testing::moe_engine_config(testing::mtp_spec(k));
      ec.num_gpu_blocks_override = 9;
      ec.max_model_len = 128;
      ec.max_num_seqs = padded ? 5 : 4;  // padded: steps of 1..4 rows run at 4, of 5 at 5
      auto engine = create_engine(ec);
      engine->start();
      testing::run_all(*engine, prompts, params, "q");
      const EngineMetrics m = testing::settled(*engine);
      preemptions = m.num_preemptions;
      hits = m.prefix_cache_hits;
      engine->shutdown();
    }
    EXPECT_GT(preemptions, 0);
    EXPECT_GT(hits, 0);
    if (padded) EXPECT_GT(uniform_catch_ups, 10) << "no catch-up ran the graphs' padded layout";
    else EXPECT_EQ(uniform_catch_ups, 0);
    ASSERT_GT(proposals.size(), 30u);

    auto backend = make_cpu_backend(2);
    const ModelConfig config = load_model_config(testing::moe_dir());
    auto weights = open_safetensors_checkpoint(testing::moe_dir());
    auto target = create_model(config, *weights, *backend);
    DeepseekMtp mtp(config, *weights, *backend, ModelOptions{}, target.get(), false);
    testing::MtpReference oracle(*target, mtp, *backend);
    int sampled = 0, chained = 0, inherited = 0;
    double worst_q = 0, worst_greedy = 0;
    for (const Proposal& p : proposals) {
      std::vector<int32_t> context = p.tokens;
      const auto logits = oracle.draft_logits(p.tokens, std::vector<int32_t>(p.drafts.begin(), p.drafts.end() - 1));
      ASSERT_EQ(logits.size(), p.drafts.size());
      chained += p.drafts.size() > 1 ? 1 : 0;
      inherited += p.inherited > 0 ? 1 : 0;
      for (size_t j = 0; j < p.drafts.size(); ++j) {
        std::vector<float> want = logits[j];
        if (p.params.greedy()) {  // the draft is the argmax (no near ties to worry about)
          const float best = *std::max_element(want.begin(), want.end());
          worst_greedy = std::max(worst_greedy, static_cast<double>(best - want[p.drafts[j]]));
        } else {
          SamplingRow row;
          row.params = &p.params;
          row.seed = p.seed;
          row.position = static_cast<int64_t>(context.size());
          row.prompt_token_ids = std::span<const int32_t>(context.data(), static_cast<size_t>(p.num_prompt_tokens));
          row.output_token_ids = std::span<const int32_t>(context.data() + p.num_prompt_tokens,
                                                          context.size() - static_cast<size_t>(p.num_prompt_tokens));
          logits_to_probs(want, row);
          for (size_t v = 0; v < want.size(); ++v)
            worst_q = std::max(worst_q, std::fabs(static_cast<double>(want[v]) - p.q[j][v]));
          EXPECT_GT(want[p.drafts[j]], 0.0f) << p.req_id << ": a draft the recomputed q gives no mass";
          ++sampled;
        }
        context.push_back(p.drafts[j]);
      }
    }
    EXPECT_LE(worst_q, 1e-5);
    EXPECT_LE(worst_greedy, 1e-4);
    if (run.all_greedy) {
      EXPECT_EQ(sampled, 0);
      EXPECT_GT(chains, 10) << "greedy drafts were not chained";
    } else {
      EXPECT_GT(sampled, 10);
    }
    if (k > 1) EXPECT_GT(chained, 10);
    EXPECT_GT(inherited, 0) << "no proposal after a prefix-cache hit";
  }
}

}  // namespace
}  // namespace specula
