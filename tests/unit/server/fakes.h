// Test doubles for the server's unit tests: a byte-level tokenizer, a tiny chat template and an
// LLMEngine whose "model" replies with a scripted text one token per step. They let the HTTP
// layer be tested exactly without the real engine.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace specula::testing {

// Ids 0..255 are bytes; 256.. are special tokens (<s>, </s>) and added ones (<think>, </think>).
class FakeTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256, kEos = 257, kThink = 258, kEndThink = 259;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(kBos);
    for (size_t i = 0; i < text.size();) {
      bool matched = false;
      for (int32_t id = 256; id < 260; ++id) {
        std::string t = piece(id);
        if (text.substr(i, t.size()) == t) {
          ids.push_back(id);
          i += t.size();
          matched = true;
          break;
        }
      }
      if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string out;
    for (int32_t id : ids) {
      if (skip_special_tokens && is_special(id)) continue;
      out += piece(id);
    }
    return out;
  }
  int64_t vocab_size() const override { return 260; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    for (int32_t id = 0; id < 260; ++id)
      if (piece(id) == token) return id;
    return std::nullopt;
  }
  std::string id_to_token(int32_t id) const override { return id == ' ' ? "\xC4\xA0" : piece(id); }
  std::string token_bytes(int32_t id) const override { return piece(id); }
  bool is_special(int32_t id) const override { return id == kBos || id == kEos; }
  std::optional<int32_t> bos_token_id() const override { return kBos; }
  std::optional<int32_t> eos_token_id() const override { return kEos; }
  std::string bos_token() const override { return "<s>"; }
  std::string eos_token() const override { return "</s>"; }
  bool add_bos_token() const override { return true; }
  const std::string& chat_template() const override { return template_; }

  static std::string piece(int32_t id) {
    switch (id) {
      case kBos: return "<s>";
      case kEos: return "</s>";
      case kThink: return "<think>";
      case kEndThink: return "</think>";
      default: return std::string(1, static_cast<char>(id));
    }
  }

 private:
  std::string template_ = "fake";
};

// "<s>[role]content\n" per message, "[assistant]" for the generation prompt; tools, tool calls,
// tool_call_id and enable_thinking show up so tests can see they reached the template.
class FakeChatTemplate : public ChatTemplate {
 public:
  using ChatTemplate::render;
  std::string render(const nlohmann::ordered_json& ctx) const override {
    std::string out = ctx.value("bos_token", "");
    for (const auto& m : ctx["messages"]) {
      if (m["role"] == "raise") throw Error("template says no");
      out += "[" + m["role"].get<std::string>() + "]";
      if (m.contains("tool_call_id")) out += "(" + m["tool_call_id"].get<std::string>() + ")";
      if (m.contains("content") && m["content"].is_string()) out += m["content"].get<std::string>();
      if (m.contains("tool_calls")) out += "[calls:" + m["tool_calls"].dump() + "]";
      out += "\n";
    }
    if (ctx.contains("tools")) out += "[tools:" + ctx["tools"].dump() + "]";
    if (ctx.value("enable_thinking", true) == false) out += "[nothink]";
    if (ctx.value("add_generation_prompt", false)) out += "[assistant]";
    return out;
  }
};

// Replies with `reply` (default "Hello!") one byte-token per step, per choice. A prompt holding
// "ERROR" fails in the engine; hold_after_first() keeps every request after its first token
// until release(). `max_len` (set before the server starts) is max_model_len: tool definitions
// rendered into a prompt need more than the default 128 byte-tokens.
class FakeEngine : public LLMEngine {
 public:
  FakeEngine() {
    model_config_.max_position_embeddings = 128;
    worker_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() override { shutdown(); }

  std::string reply = "Hello!";
  int max_len = 128;
  std::atomic<int> step_delay_ms{1};  // set by tests while the worker runs

  const ModelConfig& model_config() const override { return model_config_; }
  const GenerationConfig& generation_config() const override { return generation_config_; }
  const Tokenizer& tokenizer() const override { return tokenizer_; }
  int max_model_len() const override { return max_len; }
  bool async_scheduling() const override { return false; }
  void start() override {}
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  std::shared_ptr<RequestStream> add_request(NewRequest request) override {
    SPECULA_CHECK(static_cast<int>(request.prompt_token_ids.size()) + request.params.max_tokens.value_or(0) <= max_len,
                  "prompt of {} tokens plus max_tokens {} exceed max_model_len {}", request.prompt_token_ids.size(),
                  request.params.max_tokens.value_or(0), max_len);
    auto stream = std::make_shared<RequestStream>();
    std::lock_guard<std::mutex> lock(mu_);
    Active a;
    a.req = request;
    a.stream = stream;
    a.produced.assign(request.params.n, 0);
    a.text = reply;
    std::string prompt = tokenizer_.decode(request.prompt_token_ids, false);
    a.fail = prompt.find("ERROR") != std::string::npos;
    requests_.push_back(request);
    active_[request.request_id] = std::move(a);
    cv_.notify_all();
    return stream;
  }

  void abort(const std::string& request_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.insert(request_id);
    active_.erase(request_id);
    cv_.notify_all();
  }

  EngineMetrics metrics() const override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineMetrics m;
    m.num_requests_running = static_cast<int64_t>(active_.size());
    m.kv_cache_usage = active_.empty() ? 0.0 : 0.5;
    m.prompt_tokens_total = 7;
    m.spec_accepted_per_pos = {3, 1};
    return m;
  }

  // ---- test controls and observations ----
  void hold_after_first(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = on;
    cv_.notify_all();
  }
  std::vector<NewRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::set<std::string> aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  size_t active() const {
    std::lock_guard<std::mutex> lock(mu_);
    return active_.size();
  }
  // Requests that have produced their first token (and, when holding, are waiting).
  size_t started() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [id, a] : active_) n += a.produced[0] > 0;
    return n;
  }

 private:
  struct Active {
    NewRequest req;
    std::shared_ptr<RequestStream> stream;
    std::vector<int> produced;
    std::string text;
    bool fail = false;
    bool sent_prompt_logprobs = false;
  };

  static PositionLogprobs logprobs_for(int32_t id, int top) {
    PositionLogprobs p;
    p.chosen = {id, -0.25f, 1};
    for (int k = 0; k < top; ++k) p.top.push_back({id + k, -0.25f - k, k + 1});
    return p;
  }

  // One step: every active request gets one more token per unfinished choice.
  void step_locked() {
    std::vector<std::string> done;
    for (auto& [id, a] : active_) {
      if (a.fail) {
        RequestOutput out;
        out.request_id = id;
        out.error = "the fake engine failed this request";
        a.stream->push(std::move(out));
        done.push_back(id);
        continue;
      }
      if (hold_ && a.produced[0] >= 1) continue;
      RequestOutput out;
      out.request_id = id;
      out.num_prompt_tokens = static_cast<int>(a.req.prompt_token_ids.size());
      if (!a.sent_prompt_logprobs && a.req.params.prompt_logprobs) {
        std::vector<std::optional<PositionLogprobs>> pl;
        for (size_t k = 0; k < a.req.prompt_token_ids.size(); ++k) {
          if (k == 0) pl.push_back(std::nullopt);
          else pl.push_back(logprobs_for(a.req.prompt_token_ids[k], *a.req.params.prompt_logprobs));
        }
        out.prompt_logprobs = std::move(pl);
      }
      a.sent_prompt_logprobs = true;
      bool all_done = true;
      for (int j = 0; j < a.req.params.n; ++j) {
        int& k = a.produced[j];
        int limit = std::min<int>(static_cast<int>(a.text.size()), a.req.params.max_tokens.value_or(1 << 20));
        if (k >= limit) continue;
        ChoiceDelta d;
        d.index = j;
        int32_t tok = static_cast<unsigned char>(a.text[k]);
        d.token_ids = {tok};
        d.text = std::string(1, a.text[k]);
        if (a.req.params.logprobs) d.logprobs = {logprobs_for(tok, *a.req.params.logprobs)};
        ++k;
        if (k == limit) d.finish_reason = k == static_cast<int>(a.text.size()) ? FinishReason::kStop : FinishReason::kLength;
        all_done = all_done && k == limit;
        out.choices.push_back(std::move(d));
      }
      out.finished = all_done;
      a.stream->push(std::move(out));
      if (all_done) done.push_back(id);
    }
    for (const auto& id : done) active_.erase(id);
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait(lock, [&] { return stop_ || !active_.empty(); });
      if (stop_) break;
      step_locked();
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms.load()));
      lock.lock();
    }
  }

  ModelConfig model_config_;
  GenerationConfig generation_config_;
  FakeTokenizer tokenizer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Active> active_;
  std::vector<NewRequest> requests_;
  std::set<std::string> aborted_;
  bool hold_ = false;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace specula::testing
