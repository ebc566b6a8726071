#include "server/generation.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/logging.h"
#include "engine/llm_engine.h"
#include "server/api_error.h"

namespace specula::server {
namespace {

using namespace std::chrono_literals;

// How long one wait on a stream lasts before the shutdown flag and the client are checked again.
constexpr auto kWaitSlice = 200ms;
// Probing the client's connection costs a netlink round trip: only this often while idle.
constexpr auto kProbeInterval = 1s;

double seconds(GenerationRun::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

GenerationRun::GenerationRun(ServerState& state, std::string id, Clock::time_point arrival, ClientGone client_gone)
    : state_(state), id_(std::move(id)), arrival_(arrival), client_gone_(std::move(client_gone)), last_probe_(arrival) {
  state_.active_runs.fetch_add(1);
}

GenerationRun::~GenerationRun() {
  if (unfinished_ > 0) cancel();
  state_.active_runs.fetch_sub(1);
}

void GenerationRun::submit(std::vector<std::vector<int32_t>> prompts, const std::vector<SamplingParams>& params) {
  SPECULA_ASSERT(prompts.size() == params.size() && !prompts.empty());
  n_ = params.front().n;
  prompts_.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts_[i].request_id = prompts.size() == 1 ? id_ : fmt::format("{}-{}", id_, i);
    prompts_[i].token_ids = std::move(prompts[i]);
    for (int j = 0; j < n_; ++j) {
      Choice c;
      c.index = static_cast<int>(i) * n_ + j;
      c.prompt = static_cast<int>(i);
      choices_.push_back(std::move(c));
    }
  }
  for (size_t i = 0; i < prompts_.size(); ++i) {
    NewRequest req{prompts_[i].request_id, prompts_[i].token_ids, params[i]};
    try {
      prompts_[i].stream = state_.engine.add_request(std::move(req));
    } catch (const Error& e) {
      for (size_t k = 0; k < i; ++k) state_.engine.abort(prompts_[k].request_id);
      unfinished_ = 0;
      throw bad_request(e.what());
    }
    ++unfinished_;
  }
}

void GenerationRun::cancel() {
  for (auto& p : prompts_) {
    if (p.finished || !p.stream) continue;
    state_.engine.abort(p.request_id);
    p.finished = true;
    for (auto& c : choices_) {
      if (c.prompt == &p - prompts_.data() && c.finish_reason == FinishReason::kNone) {
        c.finish_reason = FinishReason::kAbort;
        state_.metrics.count_finished(FinishReason::kAbort);
      }
    }
  }
  unfinished_ = 0;
  cancelled_ = true;
}

bool GenerationRun::next(Update* update) {
  while (unfinished_ > 0 && !error_) {
    if (state_.stopping.load()) {
      stopped_by_shutdown_ = true;
      cancel();
      return false;
    }
    // Checked on a clock, not only when idle: a non-streamed request whose tokens keep coming
    // never writes to its client before the end, so nothing else would notice a hang-up.
    auto now = Clock::now();
    if (client_gone_ && now - last_probe_ >= kProbeInterval) {
      last_probe_ = now;
      if (client_gone_()) {
        LOG_INFO("Client for request {} disconnected; aborting it", id_);
        cancel();
        return false;
      }
    }
    // Take whatever is ready from any prompt's stream; block (a slice) on one when nothing is.
    size_t count = prompts_.size();
    for (size_t k = 0; k < count; ++k) {
      size_t i = (rr_ + k) % count;
      Prompt& p = prompts_[i];
      if (p.finished) continue;
      bool only_one = unfinished_ == 1;
      if (p.stream->pop(&update->output, only_one ? std::chrono::milliseconds(kWaitSlice) : 0ms)) {
        rr_ = i + 1;
        update->prompt = static_cast<int>(i);
        apply(static_cast<int>(i), &update->output);
        return true;
      }
      if (only_one) break;
    }
    if (unfinished_ > 1) {
      // Several streams and none ready: wait briefly on the first unfinished one.
      for (size_t i = 0; i < count; ++i) {
        if (prompts_[i].finished) continue;
        if (prompts_[i].stream->pop(&update->output, 20ms)) {
          rr_ = i + 1;
          update->prompt = static_cast<int>(i);
          apply(static_cast<int>(i), &update->output);
          return true;
        }
        break;
      }
    }
  }
  return false;
}

void GenerationRun::apply(int prompt_index, RequestOutput* out) {
  auto now = Clock::now();
  Prompt& p = prompts_[prompt_index];
  if (out->error) {
    error_ = *out->error;
    p.finished = true;
    --unfinished_;
    cancel();  // the others cannot be answered either
    return;
  }
  if (out->prompt_logprobs) p.prompt_logprobs = out->prompt_logprobs;
  if (out->num_cached_tokens > 0) p.num_cached_tokens = out->num_cached_tokens;
  bool new_tokens = false;
  for (auto& delta : out->choices) {
    if (delta.index < 0 || delta.index >= n_) continue;  // not ours; ignore rather than crash
    Choice& c = choices_[prompt_index * n_ + delta.index];
    delta.index = c.index;  // global from here on
    if (!delta.token_ids.empty()) {
      new_tokens = true;
      if (c.last_token_at) state_.metrics.observe_inter_token(seconds(now - *c.last_token_at));
      c.last_token_at = now;
      p.generated_tokens += static_cast<int>(delta.token_ids.size());
      c.token_ids.insert(c.token_ids.end(), delta.token_ids.begin(), delta.token_ids.end());
    }
    c.text += delta.text;
    c.logprobs.insert(c.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
    if (delta.finish_reason != FinishReason::kNone && c.finish_reason == FinishReason::kNone) {
      c.finish_reason = delta.finish_reason;
      c.stop_reason = delta.stop_reason;
      state_.metrics.count_finished(delta.finish_reason);
    }
  }
  if (new_tokens && !p.saw_first_token) {
    p.saw_first_token = true;
    state_.metrics.observe_ttft(seconds(now - arrival_));
  }
  if (out->finished && !p.finished) {
    p.finished = true;
    --unfinished_;
    state_.metrics.observe_request_done(seconds(now - arrival_), static_cast<int>(p.token_ids.size()),
                                        p.generated_tokens);
    if (out->times) state_.metrics.observe_request_phases(*out->times);
  }
}

int GenerationRun::prompt_tokens() const {
  int total = 0;
  for (const auto& p : prompts_) total += static_cast<int>(p.token_ids.size());
  return total;
}

int GenerationRun::completion_tokens() const {
  int total = 0;
  for (const auto& c : choices_) total += static_cast<int>(c.token_ids.size());
  return total;
}

int GenerationRun::cached_tokens() const {
  int total = 0;
  for (const auto& p : prompts_) total += p.num_cached_tokens;
  return total;
}

}  // namespace specula::server
