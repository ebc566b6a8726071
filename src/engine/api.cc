#include "engine/api.h"

namespace specula {

std::string finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNone: break;
  }
  return "";
}

void RequestStream::push(RequestOutput out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (out.finished || out.error) final_pushed_ = true;
    queue_.push_back(std::move(out));
  }
  cv_.notify_all();
}

bool RequestStream::pop(RequestOutput* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  // After the final output has been taken nothing else can arrive: do not make the caller wait.
  cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || final_pushed_; });
  if (queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return final_pushed_;
}

}  // namespace specula
