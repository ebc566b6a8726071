#include "engine/threaded_engine.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <variant>

#include "core/error.h"
#include "core/logging.h"
#include "core/thread_stacks.h"
#include "engine/stats_logger.h"
#include "engine/step_watchdog.h"

namespace specula {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct AddOp {
  NewRequest request;
  std::shared_ptr<RequestStream> stream;
};
struct AbortOp {
  std::string request_id;
};
using Op = std::variant<AddOp, AbortOp>;

class ThreadedEngine : public LLMEngine {
 public:
  explicit ThreadedEngine(EngineComponents c)
      : parts_(std::move(c)),
        core_(parts_.core_config, *parts_.executor, *parts_.tokenizer),
        stats_(parts_.backend && parts_.backend->device() == Device::kCUDA ? "GPU" : "CPU"),
        watchdog_(parts_.step_timeout_seconds, [this] { return parts_.model ? parts_.model->progress() : ""; }) {
    metrics_ = core_.metrics();
    core_.set_on_step_counted([this] { publish_metrics(); });
  }
  ~ThreadedEngine() override { shutdown(); }

  const ModelConfig& model_config() const override { return parts_.model_config; }
  const GenerationConfig& generation_config() const override { return parts_.generation_config; }
  const Tokenizer& tokenizer() const override { return *parts_.tokenizer; }
  int max_model_len() const override { return parts_.core_config.max_model_len; }
  bool async_scheduling() const override { return parts_.core_config.async_scheduling; }

  void start() override {
    std::lock_guard<std::mutex> lock(mu_);
    SPECULA_CHECK(!started_ && !stopping_, "the engine was already started");
    started_ = true;
    thread_ = std::thread([this] {
      name_current_thread("specula-engine");
      loop();
    });
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
      thread_.join();
    } else {
      drain_inbox();  // never started: end whatever was queued
      core_.abort_all();
    }
  }

  std::shared_ptr<RequestStream> add_request(NewRequest request) override {
    core_.validate(request);  // reads only the immutable config: safe on the caller's thread
    auto stream = std::make_shared<RequestStream>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      SPECULA_CHECK(!stopping_, "the engine is shutting down");
      if (active_.size() > 1024 + 2 * live_hint_) prune_active();
      auto it = active_.find(request.request_id);
      if (it != active_.end()) {
        std::shared_ptr<RequestStream> old = it->second.lock();
        SPECULA_CHECK(!old || old->done(), "request id {} is already in use", request.request_id);
      }
      active_[request.request_id] = stream;
      inbox_.push_back(AddOp{std::move(request), stream});
    }
    cv_.notify_one();
    return stream;
  }

  void abort(const std::string& request_id) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      inbox_.push_back(AbortOp{request_id});
    }
    cv_.notify_one();
  }

  EngineMetrics metrics() const override {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    return metrics_;
  }

 private:
  void prune_active() {
    for (auto it = active_.begin(); it != active_.end();) {
      std::shared_ptr<RequestStream> s = it->second.lock();
      it = !s || s->done() ? active_.erase(it) : std::next(it);
    }
    live_hint_ = active_.size();
  }

  // Applies queued requests and aborts (loop thread, or the caller after the loop ended).
  void drain_inbox() {
    std::vector<Op> ops;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ops.swap(inbox_);
    }
    for (Op& op : ops) {
      if (auto* add = std::get_if<AddOp>(&op)) {
        try {
          core_.add_request(std::move(add->request), add->stream);
        } catch (const std::exception& e) {
          RequestOutput out;
          out.request_id = add->request.request_id;
          out.error = e.what();
          out.finished = true;
          add->stream->push(std::move(out));
        }
      } else {
        core_.abort(std::get<AbortOp>(op).request_id);
      }
    }
  }

  void publish_metrics() {
    EngineMetrics m = core_.metrics();
    std::lock_guard<std::mutex> lock(metrics_mu_);
    metrics_ = std::move(m);
  }

  void loop() {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        auto has_input = [&] { return stopping_ || !inbox_.empty(); };
        if (!core_.has_unfinished_requests() && !has_input()) {
          if (std::optional<double> due = log_stats_ ? stats_.pending_deadline() : std::nullopt) {
            const auto wait = std::chrono::duration<double>(std::max(0.0, *due - now_seconds()));
            cv_.wait_for(lock, wait, has_input);
          } else {
            cv_.wait(lock, has_input);
          }
          lock.unlock();
          if (log_stats_) stats_.on_wake(now_seconds(), core_.metrics());
          lock.lock();
        }
        if (stopping_) break;
      }
      try {
        drain_inbox();
        watchdog_.step_started();
        core_.step();
        watchdog_.step_finished();
      } catch (const std::exception& e) {
        watchdog_.step_finished();
        // EngineCore isolates failures of a step; anything reaching here is a bug in the loop
        // itself. Fail what is in flight rather than take the server down.
        LOG_ERROR("engine loop error, failing all requests in flight: {}", e.what());
        core_.fail_all(std::string("engine error: ") + e.what());
      }
      publish_metrics();
      if (log_stats_) stats_.maybe_log(now_seconds(), metrics());
    }
    drain_inbox();
    core_.abort_all();
    publish_metrics();
  }

  EngineComponents parts_;
  EngineCore core_;
  StatsLogger stats_;
  StepWatchdog watchdog_;  // after parts_: it asks the model where a stuck step stands
  const bool log_stats_ = parts_.config.log_stats;  // --disable-log-stats

  std::mutex mu_;  // guards inbox_, active_, started_, stopping_
  std::condition_variable cv_;
  std::vector<Op> inbox_;
  std::unordered_map<std::string, std::weak_ptr<RequestStream>> active_;
  size_t live_hint_ = 0;
  bool started_ = false;
  bool stopping_ = false;
  std::thread thread_;

  mutable std::mutex metrics_mu_;
  EngineMetrics metrics_;
};

}  // namespace

std::unique_ptr<LLMEngine> make_threaded_engine(EngineComponents components) {
  SPECULA_CHECK(components.tokenizer && components.executor, "make_threaded_engine: missing tokenizer or executor");
  return std::make_unique<ThreadedEngine>(std::move(components));
}

}  // namespace specula
