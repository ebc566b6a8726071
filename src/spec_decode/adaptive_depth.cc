#include "spec_decode/adaptive_depth.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/logging.h"

namespace specula {

AdaptiveDepth::AdaptiveDepth(const AdaptiveDepthConfig& config, std::unique_ptr<StepCostModel> cost)
    : config_(config), cost_(std::move(cost)) {
  SPECULA_CHECK(config.num_speculative_tokens >= 1, "adaptive depth: k must be at least 1, got {}", config.num_speculative_tokens);
  SPECULA_CHECK(cost_ != nullptr, "adaptive depth: no cost model");
  SPECULA_CHECK(config.probe_weight > 0.0 && config.probe_weight <= 1.0, "adaptive depth: probe_weight must be in (0, 1], got {}",
                config.probe_weight);
  accept_.assign(static_cast<size_t>(config.num_speculative_tokens), config.prior_acceptance);
  observed_.assign(static_cast<size_t>(config.num_speculative_tokens), 0);
  probe_observed_.assign(static_cast<size_t>(config.num_speculative_tokens), 0);
  probe_every_.assign(static_cast<size_t>(OnlineCostModel::bucket_of(1 << 30)) + 1, config.probe_interval);
  since_probe_.assign(probe_every_.size(), 0);
  probes_while_on_.assign(probe_every_.size(), 0);
  vetoed_.assign(probe_every_.size(), 0);
}

void AdaptiveDepth::record_verification(int num_drafts, int num_accepted, bool recovering) {
  num_drafts = std::min(num_drafts, config_.num_speculative_tokens);
  num_accepted = std::clamp(num_accepted, 0, num_drafts);
  if (stretch_.bucket >= 0 && stretch_.steps > 0) {
    stretch_.tokens += 1.0 + num_accepted;
    ++stretch_.verifications;
  }
  if (recovering) return;
  // Positions 1..accepted were accepted; position accepted+1 (if drafted) was rejected; later
  // positions were never reached, so say nothing about their conditional acceptance.
  for (int i = 0; i < num_drafts && i <= num_accepted; ++i) {
    const double x = i < num_accepted ? 1.0 : 0.0;
    // Until a position has been seen, it starts from the position before it (acceptance decays
    // with depth, but the previous position is a better guess than the fixed prior).
    if (observed_[i] == 0 && i > 0) accept_[i] = accept_[i - 1];
    double w = std::max(config_.acceptance_weight, 1.0 / static_cast<double>(observed_[i] + 2));
    // A probe from depth 0 is running, or the previous step probed past the depth chosen: its
    // verifications weigh about their mean.
    if (probe_bucket_ >= 0 || (deep_probe_from_ >= 0 && i >= deep_probe_from_))
      w = std::max(w, 1.0 / (1.0 / config_.probe_weight + probe_observed_[i]++));
    accept_[i] += w * (x - accept_[i]);
    observed_[i] += 1;
  }
}

void AdaptiveDepth::record_step_seconds(int num_seqs, double seconds) {
  // choose() has counted the step that starts now: the one that ended is the stretch's when it
  // was its first or later.
  if (stretch_.bucket < 0 || stretch_.steps < 2 || OnlineCostModel::bucket_of(std::max(1, num_seqs)) != stretch_.bucket)
    return;
  stretch_.seconds += seconds;
  ++stretch_.timed_steps;
}

std::vector<double> AdaptiveDepth::acceptance() const {
  std::vector<double> a = accept_;
  for (size_t i = 1; i < a.size(); ++i)
    if (observed_[i] == 0) a[i] = a[i - 1];
  return a;
}

double AdaptiveDepth::expected_tokens(int depth) const {
  // acceptance() without its copy: this runs for every depth of every step.
  double e = 1.0, run = 1.0, a = 0.0;
  for (int i = 0; i < depth && i < static_cast<int>(accept_.size()); ++i) {
    if (i == 0 || observed_[i] >= config_.explore_observations)
      a = accept_[i];
    else if (observed_[i] > 0)  // seen too few times: at least the position before it's
      a = std::max(a, accept_[i]);
    // (never seen: the position before it's, `a` as it is)
    run *= a;
    e += run;
  }
  return e;
}

double AdaptiveDepth::step_seconds(int num_seqs, int depth) const {
  const auto parts = [&](int d) {
    return cost_->target_seconds(num_seqs, 1 + d) + cost_->draft_seconds(num_seqs, d) + cost_->host_seconds(num_seqs);
  };
  if (const std::optional<double> period = cost_->period_seconds(num_seqs, depth)) return *period;
  // Depth 0 unmeasured keeps its parts, the host included: async scheduling hides that work behind
  // the device, so a plain step costs at most this (speculation looks no worse than it is).
  if (depth == 0) return parts(0);
  for (int away = 1; away < config_.num_speculative_tokens; ++away) {
    for (int d : {depth - away, depth + away}) {
      if (d < 1 || d > config_.num_speculative_tokens) continue;
      if (const std::optional<double> period = cost_->period_seconds(num_seqs, d)) {
        const double measured_parts = parts(d);
        if (measured_parts > 0.0) return parts(depth) * *period / measured_parts;
      }
    }
  }
  return parts(depth);
}

double AdaptiveDepth::tokens_per_second(int num_seqs, int depth) const {
  const double t = step_seconds(num_seqs, depth);
  return t > 0.0 ? expected_tokens(depth) / t : 0.0;
}

int AdaptiveDepth::best_depth(int num_seqs) const {
  const double plain = tokens_per_second(num_seqs, 0);
  int best = 0;
  double best_rate = plain * config_.min_gain;
  for (int d = 1; d <= config_.num_speculative_tokens; ++d) {
    const double rate = tokens_per_second(num_seqs, d);
    if (rate > best_rate) {
      best_rate = rate;
      best = d;
    }
  }
  return best;
}

int AdaptiveDepth::allowed_depth(int num_seqs) const {
  return vetoed_[static_cast<size_t>(OnlineCostModel::bucket_of(num_seqs))] ? 0 : best_depth(num_seqs);
}

int AdaptiveDepth::backed_off(int every) const {
  return std::min(config_.probe_backoff * every, std::max(config_.probe_interval, config_.max_probe_interval));
}

bool AdaptiveDepth::stretch_paid() const {
  const Stretch& s = stretch_;
  // Judged against a plain step's measured period only: one priced by its parts (its target time
  // and the host's) can be cheaper than plain decoding runs (on the H200, MTP at one request
  // priced it at 123 us where plain decoding ran 135 us a token).
  const std::optional<double> plain = cost_->period_seconds(s.num_seqs, 0);
  if (!plain) return true;
  // Too short to measure (a few steps, or none verified): the estimate the probe left fell back
  // at once, so the probe was wrong.
  if (s.timed_steps < 4 || s.verifications == 0 || s.seconds <= 0.0) return false;
  const int drafting_steps = s.steps - s.plain_steps;
  const double tokens_per_step = (s.tokens / s.verifications * drafting_steps + s.plain_steps) / s.steps;
  const double rate = tokens_per_step * s.timed_steps / s.seconds;
  return rate * *plain >= config_.keep_gain;
}

void AdaptiveDepth::judge_stretch(size_t bucket) {
  const bool paid = stretch_paid();
  LOG_DEBUG("adaptive depth: stretch of {} steps ({} plain, {} timed, {:.1f} us) over {} requests {}", stretch_.steps,
            stretch_.plain_steps, stretch_.timed_steps, 1e6 * stretch_.seconds, stretch_.num_seqs,
            paid ? "paid" : "lost: depth 0 until the next probe");
  if (!paid) {
    probe_every_[bucket] = backed_off(stretch_.every_before);
    since_probe_[bucket] = 0;
    vetoed_[bucket] = 1;
  }
  stretch_ = Stretch{};
}

int AdaptiveDepth::probe_depth(int num_seqs) const {
  num_seqs = std::max(1, num_seqs);
  // Every depth, not depth 1 alone: with a fused draft chain one draft may not pay where five do
  // (the embedded pair on the H200: 2 tokens in 301 us against 1 in 162 us, 4.1 in 497 us). A
  // probe at depth 1 would also leave positions 2..k to the estimate it is there to refresh.
  int best = 0;
  double best_rate = tokens_per_second(num_seqs, 0) * config_.min_gain;
  for (int d = 1; d <= config_.num_speculative_tokens; ++d) {
    const double t = step_seconds(num_seqs, d);
    if (t > 0.0 && (1.0 + d) / t > best_rate) {
      best_rate = (1.0 + d) / t;
      best = d;
    }
  }
  return best;
}

bool AdaptiveDepth::feeds_proposer(int num_seqs) const {
  num_seqs = std::max(1, num_seqs);
  if (probe_depth(num_seqs) == 0) return false;
  const size_t bucket = static_cast<size_t>(OnlineCostModel::bucket_of(num_seqs));
  const int every = probe_every_[bucket];
  return every <= config_.probe_interval ||
         since_probe_[bucket] + std::min(config_.feed_steps, config_.probe_interval) >= every;
}

int AdaptiveDepth::current(int num_seqs) const {
  if (!config_.adaptive) return config_.num_speculative_tokens;
  // The best depth for a batch of this many requests, not the last choice: after the tail of a
  // batch (few requests left, speculation on), the last choice would make the draft mirror the
  // prompts of a whole new batch that will not speculate.
  return allowed_depth(std::max(1, num_seqs));
}

int AdaptiveDepth::choose(int num_seqs) {
  if (!config_.adaptive) return config_.num_speculative_tokens;
  num_seqs = std::max(1, num_seqs);
  deep_probe_from_ = -1;  // the previous step's verifications are in
  // A probe from depth 0 goes on while it has steps left, the batch is of its bucket and its
  // verifications so far have not turned speculation on.
  if (probe_bucket_ >= 0 && --probe_steps_left_ > 0 && OnlineCostModel::bucket_of(num_seqs) == probe_bucket_ &&
      allowed_depth(num_seqs) == 0) {
    plain_probe_ = false;
    if (const int probe = probe_depth(num_seqs); probe > 0) return probe;
  }
  // The verdict on the previous step's probe from depth 0 (its drafts were verified since): still
  // no speculation there means probe that bucket probe_backoff times less often; speculation
  // means start afresh, for a stretch that its measurements judge.
  if (probe_bucket_ >= 0) {
    const size_t b = static_cast<size_t>(probe_bucket_);
    int& every = probe_every_[b];
    vetoed_[b] = 0;
    LOG_DEBUG("adaptive depth: probe over {} requests {}", probe_num_seqs_,
              best_depth(probe_num_seqs_) == 0 ? "found no gain" : "turned speculation on");
    if (best_depth(probe_num_seqs_) == 0) {
      every = backed_off(every);
    } else {
      if (config_.stretch_steps > 0) stretch_ = Stretch{probe_bucket_, probe_num_seqs_, every};
      every = config_.probe_interval;
    }
    probe_bucket_ = -1;
  }
  plain_probe_ = false;
  const size_t bucket = static_cast<size_t>(OnlineCostModel::bucket_of(num_seqs));
  // A stretch is judged once it has run its steps, or when the estimate ends it sooner.
  if (stretch_.bucket == static_cast<int>(bucket) &&
      (stretch_.steps >= config_.stretch_steps || best_depth(num_seqs) == 0))
    judge_stretch(bucket);
  int depth = allowed_depth(num_seqs);
  // Speculating, the bucket probes (plain and deep) every probe_interval steps: a backed-off
  // interval is for probes from depth 0, and stays for them. Where speculation came back by its
  // estimate alone (MTP at one request, H200), the backed-off interval left deep probes ~250 steps
  // apart, and the depth at 1 for ~750 steps after a stretch of text had pulled a_2 down. Reset
  // for good, the probes from depth 0 lost their backoff too: EAGLE-3 at temperature 1 then fed
  // 1.5-3.4x as many depth-0 steps (1 and 8 requests, H200), where speculation does not pay.
  const int every = depth > 0 ? std::min(probe_every_[bucket], config_.probe_interval) : probe_every_[bucket];
  if (config_.probe_interval > 0 && ++since_probe_[bucket] >= every) {
    since_probe_[bucket] = 0;
    if (depth > 0 && depth < config_.num_speculative_tokens && ++probes_while_on_[bucket] % 2 == 0) {
      deep_probe_from_ = depth;  // re-measure the positions past the chosen depth
      std::fill(probe_observed_.begin(), probe_observed_.end(), 0);
      depth = config_.num_speculative_tokens;
    } else if (depth > 0) {
      depth = 0;  // re-measure a plain decode step
      plain_probe_ = true;
    } else if (const int probe = probe_depth(num_seqs); probe > 0) {
      depth = probe;
      probe_bucket_ = static_cast<int>(bucket);
      probe_num_seqs_ = num_seqs;
      probe_steps_left_ = std::max(1, config_.probe_steps);
      std::fill(probe_observed_.begin(), probe_observed_.end(), 0);
    }
  }
  if (stretch_.bucket == static_cast<int>(bucket)) {
    ++stretch_.steps;
    stretch_.plain_steps += depth == 0 ? 1 : 0;
  }
  return depth;
}

}  // namespace specula
