#include "spec_decode/adaptive_speculator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/logging.h"
#include "core/phase_profile.h"

namespace specula {

namespace {

AdaptiveDepthConfig depth_config(const AdaptiveSpeculatorConfig& c, const Proposer* proposer) {
  AdaptiveDepthConfig a;
  a.num_speculative_tokens = c.num_speculative_tokens;
  a.adaptive = c.adaptive;
  if (proposer) a.feed_steps = proposer->steps_to_recover();
  return a;
}

}  // namespace

AdaptiveSpeculator::AdaptiveSpeculator(std::unique_ptr<Proposer> proposer, const AdaptiveSpeculatorConfig& config,
                                       std::unique_ptr<StepCostModel> cost, Clock clock)
    : proposer_(std::move(proposer)), config_(config),
      depth_(depth_config(config, proposer_.get()),
             cost ? std::move(cost)
                  : std::make_unique<OnlineCostModel>(config.num_speculative_tokens + 1,
                                                      proposer_ ? proposer_->relative_step_cost() : 0.2, 0.2,
                                                      proposer_ ? proposer_->draft_fixed_cost() : 0.5)),
      clock_(clock ? std::move(clock) : Clock([] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      })) {
  SPECULA_CHECK(proposer_ != nullptr, "speculator: no proposer");
}

AdaptiveSpeculator::~AdaptiveSpeculator() {
  // At exit with SPECULA_PROFILE=1 (to stderr) or SPECULA_LOGGING_LEVEL=DEBUG (to the log, which
  // leaves the steps unsynchronised and so times them as they run).
  const bool debug = spdlog::default_logger_raw()->should_log(spdlog::level::debug);
  if (!(phase_profile::enabled() || debug) || !config_.adaptive) return;
  const int k = config_.num_speculative_tokens;
  std::string text = "== SPECULA_PROFILE: adaptive depth (microseconds; tok/s of one request at each depth)\n";
  text += fmt::format("acceptance per position: {:.3f}\n", fmt::join(depth_.acceptance(), ", "));
  for (int b : {1, 4, 8, 16, 64, 256}) {
    StepCostModel& c = depth_.cost();
    std::vector<std::string> target, draft, period, rate;
    for (int r = 1; r <= k + 1; ++r) target.push_back(fmt::format("{:.0f}", 1e6 * c.target_seconds(b, r)));
    for (int d = 1; d <= k; ++d) draft.push_back(fmt::format("{:.0f}", 1e6 * c.draft_seconds(b, d)));
    for (int d = 0; d <= k; ++d) {
      const std::optional<double> p = c.period_seconds(b, d);
      period.push_back(p ? fmt::format("{:.0f}", 1e6 * *p) : "-");
    }
    for (int d = 0; d <= k; ++d) rate.push_back(fmt::format("{:.0f}", depth_.tokens_per_second(b, d)));
    text += fmt::format(
        "batch {:>3}: target rows 1..{} [{}]  draft depth 1..{} [{}]  host {:.0f}  period depth 0..{} [{}]  tok/s depth "
        "0..{} [{}]  -> depth {}\n",
        b, k + 1, fmt::join(target, " "), k, fmt::join(draft, " "), 1e6 * c.host_seconds(b), k, fmt::join(period, " "), k,
        fmt::join(rate, " "), depth_.current(b));
  }
  if (debug)
    LOG_DEBUG("{}", text);
  else
    std::fputs(text.c_str(), stderr);
}

void AdaptiveSpeculator::record_verification(std::string_view req_id, int num_drafts, int num_accepted) {
  // Under load a probe turns speculation on for every request, most of them shed while at depth 0,
  // and their first verifications took the estimate from 0.74 to 0.20 in one step at 256 requests
  // (H200, EAGLE-3), after which the depth stayed near 0 where pinned k = 3 is 1.4x: such drafts
  // count for the stretch the probe started, not for the estimate (AdaptiveDepth).
  const bool recovering = proposer_->recovering(req_id);
  LOG_DEBUG("adaptive depth: verified {} drafts, accepted {}{}", num_drafts, num_accepted,
            recovering ? " (cache recovering: stretch only)" : "");
  depth_.record_verification(num_drafts, num_accepted, recovering);
}

void AdaptiveSpeculator::record_target_step(int num_seqs, int rows, double seconds) {
  LOG_DEBUG("adaptive depth: target step of {} x {} rows {:.1f} us", num_seqs, rows, 1e6 * seconds);
  depth_.cost().record_target(num_seqs, rows, seconds);
}

void AdaptiveSpeculator::measure_host(const ProposeBatch& batch, int num_decoding, bool decode_step, double now) {
  if (decode_step && last_entry_ >= 0.0 && num_decoding == last_num_decoding_) {
    const double host = now - last_entry_ - last_proposer_seconds_ - batch.target_seconds;
    depth_.cost().record_host(num_decoding, std::max(0.0, host));
  }
  last_entry_ = decode_step ? now : -1.0;
  last_num_decoding_ = num_decoding;
  last_proposer_seconds_ = 0.0;
}

void AdaptiveSpeculator::measure_period(int way, bool decode_only, int num_seqs, double now) {
  if (period_decode_only_ && decode_only && num_seqs == period_seqs_ && period_from_ >= 0.0)
    depth_.record_step_seconds(num_seqs, now - period_from_);
  period_decode_only_ = decode_only;
  if (way >= 0 && way == period_way_ && num_seqs == period_seqs_) {
    if (++period_run_ >= 2) depth_.cost().record_period(num_seqs, way / 2, now - period_from_);
  } else {
    period_run_ = 0;
  }
  period_way_ = way;
  period_seqs_ = num_seqs;
  period_from_ = now;
}

bool AdaptiveSpeculator::idle(int depth, int num_decoding) const {
  // SPECULA_FEED_IDLE_PROPOSER=0 never feeds a depth-0 step (probes then see a stale cache): for
  // measuring what feeding costs (docs/PERFORMANCE.md, "What feeding the head costs").
  static const bool feed = [] {
    const char* v = std::getenv("SPECULA_FEED_IDLE_PROPOSER");
    return !(v && v[0] == '0');
  }();
  return depth == 0 && num_decoding > 0 && !depth_.plain_probe() &&
         !(feed && proposer_->needs_every_step() && depth_.feeds_proposer(num_decoding));
}

bool AdaptiveSpeculator::skip_step(int num_decoding, bool with_prompts) {
  if (!config_.adaptive || num_decoding <= 0) return false;
  chosen_depth_ = depth_.choose(num_decoding);
  if (!idle(chosen_depth_, num_decoding)) return false;
  chosen_depth_ = -1;
  // An idle step runs as a plain one (deferred under async scheduling): its period is depth 0's.
  measure_period(with_prompts ? -1 : 0, !with_prompts, num_decoding, clock_());
  // No propose() this step, so the next one cannot tell this step's host work apart.
  last_entry_ = -1.0;
  LOG_DEBUG("adaptive depth: {} decoding, depth 0, step skipped", num_decoding);
  return true;
}

int AdaptiveSpeculator::propose(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) {
  int num_decoding = 0;
  bool decode_only = !batch.requests.empty();
  for (const ProposerRequest& r : batch.requests) {
    num_decoding += r.sampled ? 1 : 0;
    decode_only = decode_only && decodes(r);
  }
  const double entry = clock_();
  if (config_.adaptive) measure_host(batch, num_decoding, decode_only, entry);
  // Only decoding requests can draft; a step of prompt chunks alone takes the best depth for its
  // batch (no probe), so that the draft mirrors the chunks where speculation will run and stays
  // idle where it will not.
  batch.depth = chosen_depth_ >= 0   ? chosen_depth_
                : num_decoding > 0 ? depth_.choose(num_decoding)
                                   : depth_.current(static_cast<int>(batch.requests.size()));
  chosen_depth_ = -1;
  // The period of speculative steps in a row that every request decodes in at the step's depth,
  // none a probe's (a launch-ahead's entry comes earlier in its step than a plain propose()'s:
  // another way). Not a request's last steps, where max_tokens leaves fewer drafts: with the
  // first step of the next request (its prompt sampled) they made a period of the wait between
  // the two (MTP at one request on the H200: depth 4 priced at 31.5 ms, then depth ~1 all run).
  bool full_depth = true;
  for (const ProposerRequest& r : batch.requests) full_depth = full_depth && r.max_drafts >= batch.depth;
  const bool steady_way =
      batch.depth > 0 && decode_only && full_depth && !depth_.draft_probe() && !depth_.deep_probe();
  if (config_.adaptive)
    measure_period(steady_way ? 2 * batch.depth + (batch.ahead ? 1 : 0) : -1, decode_only, num_decoding, entry);
  // Load shedding: a decode step that the adaptive depth runs without speculation (depth 0: the
  // batch is large enough that drafts cost more than they gain) does not call the proposer at
  // all, so that speculation then costs nothing. The draft model catches up when it drafts again;
  // the MTP layer skips the catch-up forward it would otherwise run every step (at 64 concurrent
  // requests on the H100 that forward took specula-tiny-moe from 106k to 62k tokens/s): the
  // positions skipped count as inherited, their cache entries stale (mtp_proposer.h), which can
  // lower acceptance and never change the output. A plain step that only re-measures the target
  // while speculation pays (a probe) is still given to the proposer. So are the depth-0 steps of
  // a proposer that needs every step (MTP, EAGLE) while the adaptive depth measures whether
  // speculation pays (AdaptiveDepth::feeds_proposer): a cache gone stale in the depth-0 stretch
  // made every probe fail, so that speculation never came back (on the H100, specula-tiny-moe at
  // concurrency 1 stayed at depth 0 where k = 1 pinned gains 18 %; eagle3 at 64 requests at 0.77x
  // of pinned k = 3). Only the requests that the probe will have draft are fed, so such a step
  // costs one catch-up forward of a few requests (for all 64 it cost 40 % of throughput); and once
  // a probe with a warm cache found acceptance too low, only the steps the proposer needs to
  // recover before each probe are fed (Proposer::steps_to_recover; fed every step, MTP at
  // temperature 1 ran at 0.6x of no speculation).
  if (idle(batch.depth, num_decoding)) {
    LOG_DEBUG("adaptive depth: {} decoding, depth 0, proposer not called", num_decoding);
    drafts.assign(batch.requests.size(), {});
    return 0;
  }
  // A probe from depth 0 drafts for a few requests only: it is there to measure acceptance, and
  // under load the draft's catch-up of every request (all the tokens since it last drafted)
  // would cost more than the whole probe is worth (on the H100 at 64 requests, 7-11 % of
  // throughput). The others verify nothing this step and, under load, are shed from it as from
  // the depth-0 steps that feed the proposer before it.
  const bool draft_probe = depth_.draft_probe();
  if (draft_probe || (batch.depth == 0 && !depth_.plain_probe())) {
    int kept = 0;
    for (ProposerRequest& r : batch.requests) {
      if (probes(r) && ++kept <= kProbeRequests) continue;
      if (draft_probe) r.max_drafts = 0;
      r.shed = num_decoding > kProbeRequests;
    }
  }
  // Steady state: every request verified drafts this step, so it drafted in the previous one and
  // catches up at most 1 + k tokens. Only such steps teach the cost model a draft step's cost: the
  // first drafting step of a request also runs its prompt (or the tokens of a depth-0 stretch)
  // through the draft, and recording that once made the H100's cost model think drafts cost more
  // than target steps, so that the depth stuck at 0.
  bool steady = true;
  for (const ProposerRequest& r : batch.requests) steady = steady && r.sampled && r.verified_drafts;
  const double t0 = clock_();
  proposer_->propose(batch, drafts);
  const double seconds = clock_() - t0;
  last_proposer_seconds_ = seconds;
  int drafting = 0, most = 0;
  for (const std::vector<int32_t>& d : drafts) {
    drafting += d.empty() ? 0 : 1;
    most = std::max(most, static_cast<int>(d.size()));
  }
  // The proposer's cost at this depth: its time, steady catch-up included, but not from a step
  // whose catch-up also ran more than the steady 1 + k positions a request (a prompt, a depth-0
  // stretch): that is not what a draft step costs, and a draft cost learned too high keeps
  // speculation off where no steady step corrects it.
  const int64_t steady_catch_up = static_cast<int64_t>(batch.requests.size()) * (config_.num_speculative_tokens + 1);
  const bool recorded = drafting > 0 && steady && proposer_->last_catch_up_tokens() <= steady_catch_up;
  if (recorded && proposer_->drafts_on_device()) {
    uncollected_cost_ = UncollectedDraftCost{drafting, most, seconds};
  } else if (recorded) {
    depth_.cost().record_draft(drafting, most, seconds);
  }
  if (spdlog::default_logger_raw()->should_log(spdlog::level::debug)) {  // acceptance() copies
    // What the choice weighed at this batch size, by depth 0..k: the modelled target and draft
    // times, the step's price (its measured period, else the parts with the host's time) and the
    // tokens per second against plain decoding.
    const int n = std::max(1, num_decoding);
    StepCostModel& cost = depth_.cost();
    std::vector<std::string> model;
    for (int d = 0; d <= config_.num_speculative_tokens; ++d)
      model.push_back(fmt::format("{}:{:.0f}+{:.0f}={:.0f}{}us/{:.2f}", d, 1e6 * cost.target_seconds(n, 1 + d),
                                  1e6 * cost.draft_seconds(n, d), 1e6 * depth_.step_seconds(n, d),
                                  cost.period_seconds(n, d) ? "p" : "",
                                  depth_.tokens_per_second(n, d) / std::max(1e-12, depth_.tokens_per_second(n, 0))));
    LOG_DEBUG("adaptive depth: {} decoding, depth {}{}{}, drafted {} x {}, proposer {:.1f} us{}, acceptance {:.2f}; "
              "host {:.0f} us, depth:target+draft=price(p: period)/gain {}",
              num_decoding, batch.depth, batch.ahead ? " ahead" : "", depth_.plain_probe() ? " (plain probe)" : depth_.draft_probe() ? " (draft probe)" : depth_.deep_probe() ? " (deep probe)" : "",
              drafting, most, 1e6 * seconds, recorded ? " (recorded)" : "", fmt::join(depth_.acceptance(), " "),
              1e6 * cost.host_seconds(n), fmt::join(model, " "));
  }
  return batch.depth;
}

int AdaptiveSpeculator::propose_ahead(ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) {
  // A plain step's (k = 0): only the catch-up of a depth-0 step that feeds the proposer before a
  // probe. Not a plain probe's: its entry, earlier in its step than the speculative steps' around
  // it, would shift the wall times a stretch is judged by (on the H200 adaptive MTP at one request
  // then ran at depth 2.1-2.2 in three of seven runs, 1.0 in one, where 3.8-4.8 is usual).
  if (batch.ahead && batch.ahead->k == 0) {
    if (chosen_depth_ != 0 || depth_.plain_probe() || !proposer_->can_propose_ahead(batch)) return -1;
    return propose(batch, drafts);
  }
  // A probe's verifications are in this step and weigh differently (AdaptiveDepth::
  // record_verification): its next depth is chosen after them, in the usual order.
  if (!proposer_->can_propose_ahead(batch) || depth_.draft_probe() || depth_.deep_probe()) return -1;
  // Otherwise before them, once: when nothing is launched, propose() keeps the depth.
  if (chosen_depth_ < 0) chosen_depth_ = depth_.choose(static_cast<int>(batch.requests.size()));
  if (chosen_depth_ <= 0 || depth_.draft_probe() || depth_.plain_probe()) return -1;
  const int depth = propose(batch, drafts);
  if (uncollected_cost_) uncollected_cost_->ahead = true;
  return depth;
}

void AdaptiveSpeculator::settle_ahead(std::span<const int> accepted) {
  proposer_->settle_ahead(accepted);
  if (uncollected_cost_ && uncollected_cost_->ahead) uncollected_cost_->settled_at = clock_();
}

std::vector<std::vector<int32_t>> AdaptiveSpeculator::finish_drafts() {
  const double t0 = clock_();
  std::vector<std::vector<int32_t>> drafts = proposer_->finish_drafts();
  const double waited = clock_() - t0;
  last_proposer_seconds_ += waited;
  if (uncollected_cost_) {
    const UncollectedDraftCost c = *uncollected_cost_;
    uncollected_cost_.reset();
    if (!c.ahead) {
      depth_.cost().record_draft(c.drafting, c.most, c.launch_seconds + waited);
    } else if (c.settled_at >= 0.0) {
      depth_.cost().record_draft(c.drafting, c.most, clock_() - c.settled_at);
    }
  }
  return drafts;
}

std::string AdaptiveSpeculator::describe() const {
  return fmt::format("{}, num_speculative_tokens={}, adaptive depth {}", config_.description,
                     config_.num_speculative_tokens, config_.adaptive ? "on" : "off");
}

}  // namespace specula
