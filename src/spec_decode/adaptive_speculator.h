// The engine's Speculator (engine/speculator.h) as spec_decode builds it: a proposer, the
// adaptive depth and its cost model. Each step the model runner reports verification results
// (record_verification) and the target's step time (record_target_step); propose() picks the
// step's depth and runs the proposer, timing it for the cost model.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/speculator.h"
#include "spec_decode/adaptive_depth.h"
#include "spec_decode/proposer.h"
#include "spec_decode/step_cost_model.h"

namespace specula {

struct AdaptiveSpeculatorConfig {
  int num_speculative_tokens = 1;  // the most drafts per request per step
  bool adaptive = true;            // false: always num_speculative_tokens
  std::string description;         // the start-up log's "method ... (model)"
};

class AdaptiveSpeculator final : public Speculator {
 public:
  // Seconds on a monotonic clock; how a proposer call is timed for the cost model.
  using Clock = std::function<double()>;

  // cost: the cost model (an OnlineCostModel seeded with the proposer's relative cost when null).
  // clock: std::chrono::steady_clock when null (a test feeds exact durations instead).
  AdaptiveSpeculator(std::unique_ptr<Proposer> proposer, const AdaptiveSpeculatorConfig& config,
                     std::unique_ptr<StepCostModel> cost = nullptr, Clock clock = nullptr);
  // With SPECULA_PROFILE=1, prints what the adaptive depth learned (step costs, acceptance, the
  // depth it would choose) for a few batch sizes to stderr.
  ~AdaptiveSpeculator() override;

  Proposer& proposer() { return *proposer_; }
  AdaptiveDepth& depth() { return depth_; }

  int num_speculative_tokens() const override { return config_.num_speculative_tokens; }
  bool adaptive() const override { return config_.adaptive; }
  std::string describe() const override;

  KVCacheSpec kv_cache_spec() const override { return proposer_->kv_cache_spec(); }
  void allocate_kv_cache(int num_blocks, int block_size) override { proposer_->allocate_kv_cache(num_blocks, block_size); }
  size_t capture_graphs(const std::vector<int>& batch_sizes) override { return proposer_->capture_graphs(batch_sizes); }

  void drop_request(std::string_view req_id) override { proposer_->drop_request(req_id); }
  const Tensor* draft_probs() const override { return proposer_->draft_probs(); }
  int draft_probs_row(std::string_view req_id) const override { return proposer_->draft_probs_row(req_id); }

  void record_verification(std::string_view req_id, int num_drafts, int num_accepted) override;
  void record_target_step(int num_seqs, int rows, double seconds) override;
  bool skip_step(int num_decoding, bool with_prompts) override;
  int propose(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override;
  // Drafts left on the device are the proposer's. Their cost counts the launch and the time the
  // collection waited: work the device finished while the host staged the next step cost that
  // step nothing.
  bool leaves_drafts_on_device() const override { return proposer_->leaves_drafts_on_device(); }
  const DraftsOnDevice* drafts_on_device() const override { return proposer_->drafts_on_device(); }
  std::vector<std::vector<int32_t>> finish_drafts() override;
  // Launches ahead where the proposer can and the step's depth drafts for every request (no probe);
  // after a plain step (ahead k = 0) where skip_step() chose depth 0 to feed the proposer.
  int propose_ahead(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override;
  void settle_ahead(std::span<const int> accepted) override;

  static constexpr int kProbeRequests = 4;  // requests that draft in a probe from depth 0

 private:
  // Whether a request is among those a probe from depth 0 drafts for: the first kProbeRequests
  // such requests of the batch, which the stretch before the probe feeds under load.
  static bool probes(const ProposerRequest& r) { return r.sampled && r.max_drafts > 0; }
  // The host's share of a step (StepCostModel::host_seconds): the time from one propose() to the
  // next, less this step's target time and the previous step's proposer time, measured between
  // consecutive decode steps of the same batch size (a prompt's step, or an idle engine waiting
  // for requests, is not a step's host work).
  void measure_host(const ProposeBatch& batch, int num_decoding, bool decode_step, double now);
  // Whether a request decodes this step: it sampled past its prompt. A request's first step samples
  // too, at the end of its prompt, and it comes after the engine waited for the request.
  static bool decodes(const ProposerRequest& r) { return r.sampled && r.first_position >= r.num_prompt_tokens; }
  // Depth 0 with nothing for the proposer to see: no draft, no probe, no feeding.
  bool idle(int depth, int num_decoding) const;
  // A step's period (StepCostModel::record_period): the time from one step's entry (skip_step()
  // for an idle step, propose() for one at depth > 0) to the next's, learned where three steps in
  // a row ran the same way (`way`: depth and entry; -1 for a step that teaches no period: a probe,
  // a fed depth-0 step, prompt chunks) over the same requests, so that it is the steady period.
  // The wall time of every step that decoded only, up to a next step that decoded only too, goes
  // to the adaptive depth, whatever its way (AdaptiveDepth::record_step_seconds). Not up to a
  // prompt's step: at one request that time held the wait for the next request (~45 ms where a
  // step took 0.37), and a stretch of 32 steps that spanned it was judged lost (MTP, H200).
  void measure_period(int way, bool decode_only, int num_seqs, double now);

  std::unique_ptr<Proposer> proposer_;
  AdaptiveSpeculatorConfig config_;
  AdaptiveDepth depth_;
  Clock clock_;
  double last_entry_ = -1.0;            // clock at the previous propose(), -1 if it was not a decode step
  int last_num_decoding_ = 0;
  double last_proposer_seconds_ = 0.0;  // the proposer's time in the previous propose()
  int chosen_depth_ = -1;               // chosen by skip_step() for the coming propose(), else -1
  double period_from_ = -1.0;           // clock at the previous step's entry
  int period_way_ = -1;                 // how the previous step ran (measure_period)
  int period_seqs_ = 0;
  int period_run_ = 0;                  // steps before it that ran that way, in a row
  bool period_decode_only_ = false;     // the previous step had no prompt chunk
  // A proposal that left its drafts on the device and that the cost model learns from once they
  // are collected: its drafting requests, most drafts and launch seconds.
  struct UncollectedDraftCost {
    int drafting = 0, most = 0;
    double launch_seconds = 0.0;
    // A launch-ahead's drafts run on the device from the verification's end, which settle_ahead()
    // marks: they cost from then to their collection (their launch overlapped the verification).
    bool ahead = false;
    double settled_at = -1.0;
  };
  std::optional<UncollectedDraftCost> uncollected_cost_;
};

}  // namespace specula
