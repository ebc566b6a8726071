// The LLMEngine loop thread: requests from many threads, aborts, duplicate ids, shutdown with work
// in flight, and the stats line.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/stats_logger.h"
#include "engine/threaded_engine.h"
#include "engine_fakes.h"

namespace specula {
namespace {

using testing::FakeModel;
using testing::FakeTokenizer;

struct Built {
  std::unique_ptr<LLMEngine> engine;
  FakeModel* model = nullptr;
};

Built make_engine(int num_blocks = 128, int max_seqs = 8) {
  EngineComponents c;
  c.core_config.max_model_len = 128;
  c.core_config.max_num_seqs = max_seqs;
  c.core_config.max_num_batched_tokens = 32;
  c.core_config.block_size = 4;
  c.core_config.num_blocks = num_blocks;
  c.core_config.vocab_size = FakeTokenizer::kVocab;
  c.core_config.eos_token_ids = {FakeTokenizer::kEos};
  c.tokenizer = std::make_unique<FakeTokenizer>();
  c.backend = make_cpu_backend(1);
  auto model = std::make_unique<FakeModel>(*c.backend);
  Built b;
  b.model = model.get();
  c.model = std::move(model);
  c.sampler = make_cpu_sampler(*c.backend);
  ModelRunnerConfig rc;
  rc.max_num_seqs = max_seqs;
  rc.max_num_batched_tokens = 32;
  rc.max_model_len = 128;
  rc.block_size = 4;
  rc.num_blocks = num_blocks;
  c.executor = std::make_unique<ModelRunner>(*c.model, *c.backend, *c.sampler, rc);
  b.engine = make_threaded_engine(std::move(c));
  return b;
}

SamplingParams greedy(int n) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = n;
  return p;
}

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back((i * 5 + salt * 11) % 60);
  return p;
}

// Reads a stream to its end; returns (tokens of choice 0, finish reason, error).
struct Drained {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::optional<std::string> error;
  bool finished = false;
};
Drained drain(RequestStream& s) {
  Drained d;
  RequestOutput o;
  while (s.pop(&o, std::chrono::seconds(30))) {
    if (o.error) d.error = o.error;
    for (const ChoiceDelta& c : o.choices) {
      d.tokens.insert(d.tokens.end(), c.token_ids.begin(), c.token_ids.end());
      if (c.finish_reason != FinishReason::kNone) d.finish = c.finish_reason;
    }
    if (o.finished) {
      d.finished = true;
      break;
    }
  }
  return d;
}

// Holds the fake model's forwards from the `from`-th on until the test opens it: a request is then
// surely still running when the test acts on it, however slowly the test thread gets scheduled.
// The gate opens itself when the test ends (declared after the engine, it goes first), so that a
// failed assertion does not leave the loop thread blocked in a forward that shutdown waits for.
class ForwardGate {
 public:
  ForwardGate(FakeModel* m, int from) : state_(std::make_shared<State>()) {
    m->fail_on_forward = [state = state_, from](int n) {
      if (n >= from) {
        std::unique_lock<std::mutex> lock(state->mu);
        state->cv.wait(lock, [&] { return state->open; });
      }
      return false;
    };
  }
  ~ForwardGate() { open(); }
  void open() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->open = true;
    }
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  std::shared_ptr<State> state_;
};

// Polls the engine's metrics until `done` holds (the loop publishes them after its step).
template <class Done>
EngineMetrics settled(LLMEngine& engine, Done done) {
  EngineMetrics m = engine.metrics();
  for (int i = 0; i < 6000 && !done(m); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = engine.metrics();
  }
  return m;
}

TEST(ThreadedEngine, ServesRequestsFromManyThreads) {
  Built b = make_engine();
  b.engine->start();
  std::atomic<int> wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const int salt = t * 10 + i;
        auto prompt = prompt_of(3 + salt % 17, salt);
        auto stream = b.engine->add_request(NewRequest{"c" + std::to_string(salt), prompt, greedy(6 + i)});
        Drained d = drain(*stream);
        if (!d.finished || d.tokens != b.model->reference_greedy(prompt, 6 + i)) wrong += 1;
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(wrong.load(), 0);
  const EngineMetrics m = settled(*b.engine, [](const EngineMetrics& m) { return m.request_success_total >= 40; });
  EXPECT_EQ(m.request_success_total, 40);
  EXPECT_EQ(m.num_requests_running + m.num_requests_waiting, 0);
  b.engine->shutdown();
}

// A client that reads the metrics once its response ended sees that response counted (the loop
// publishes a step's counts before its outputs reach the streams; /metrics relies on it).
TEST(ThreadedEngine, MetricsCountAResponseBeforeItArrives) {
  Built b = make_engine();
  b.engine->start();
  int64_t prompt_tokens = 0;
  for (int i = 0; i < 30; ++i) {
    auto prompt = prompt_of(3 + i % 7, i);
    prompt_tokens += static_cast<int64_t>(prompt.size());
    Drained d = drain(*b.engine->add_request(NewRequest{"m" + std::to_string(i), prompt, greedy(4)}));
    ASSERT_TRUE(d.finished);
    const EngineMetrics m = b.engine->metrics();
    ASSERT_EQ(m.generation_tokens_total, 4 * (i + 1)) << "request " << i;
    ASSERT_EQ(m.prompt_tokens_total, prompt_tokens) << "request " << i;
  }
  b.engine->shutdown();
}

TEST(ThreadedEngine, RejectsBadRequestsSynchronously) {
  Built b = make_engine();
  ForwardGate gate(b.model, 1);  // "dup" must still be running when its id is reused
  b.engine->start();
  SamplingParams bad = greedy(4);
  bad.temperature = -1.0f;
  EXPECT_THROW(b.engine->add_request(NewRequest{"x", {1, 2}, bad}), Error);
  EXPECT_THROW(b.engine->add_request(NewRequest{"y", prompt_of(100, 0), greedy(100)}), Error);
  auto s = b.engine->add_request(NewRequest{"dup", {1, 2, 3}, greedy(50)});
  EXPECT_THROW(b.engine->add_request(NewRequest{"dup", {1, 2, 3}, greedy(5)}), Error);
  gate.open();
  EXPECT_EQ(drain(*s).tokens.size(), 50u);
  // Finished: the id can be used again.
  auto again = b.engine->add_request(NewRequest{"dup", {1, 2, 3}, greedy(2)});
  EXPECT_EQ(drain(*again).tokens.size(), 2u);
}

TEST(ThreadedEngine, AbortEndsTheStreamAndFreesTheBlocks) {
  Built b = make_engine();
  ForwardGate gate(b.model, 2);  // the prefill's first token comes out; the next step waits
  b.engine->start();
  auto s = b.engine->add_request(NewRequest{"long", prompt_of(10, 1), greedy(100)});
  RequestOutput first;
  ASSERT_TRUE(s->pop(&first, std::chrono::seconds(30)));
  b.engine->abort("long");
  b.engine->abort("unknown-id");  // ignored
  gate.open();
  Drained d = drain(*s);
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(d.finish, FinishReason::kAbort);
  EXPECT_LT(d.tokens.size(), 99u);
  const EngineMetrics m = settled(*b.engine, [](const EngineMetrics& m) { return m.kv_cache_usage == 0; });
  EXPECT_EQ(m.kv_cache_usage, 0.0);
}

TEST(ThreadedEngine, ShutdownAbortsWhatIsInFlight) {
  Built b = make_engine(/*num_blocks=*/64, /*max_seqs=*/2);
  ForwardGate gate(b.model, 1);
  b.engine->start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 5; ++i)
    streams.push_back(b.engine->add_request(NewRequest{"r" + std::to_string(i), prompt_of(8, i), greedy(120)}));
  // Shut down while the first step is held; open the gate once the engine refuses new requests
  // for that reason (until then, reusing "r0" is refused because r0 is still running).
  std::thread stopper([&] { b.engine->shutdown(); });
  for (bool stopping = false; !stopping;) {
    try {
      b.engine->add_request(NewRequest{"r0", prompt_of(8, 0), greedy(120)});
      ADD_FAILURE() << "r0's id was reused while it was running";
      break;
    } catch (const Error& e) {
      stopping = std::string(e.what()).find("shutting down") != std::string::npos;
    }
  }
  gate.open();
  stopper.join();
  for (auto& s : streams) {
    Drained d = drain(*s);
    EXPECT_TRUE(d.finished);
    EXPECT_EQ(d.finish, FinishReason::kAbort);
  }
  EXPECT_THROW(b.engine->add_request(NewRequest{"late", {1}, greedy(1)}), Error);
}

TEST(ThreadedEngine, NeverStartedEngineEndsQueuedRequestsOnShutdown) {
  Built b = make_engine();
  auto s = b.engine->add_request(NewRequest{"q", {1, 2}, greedy(3)});
  b.engine.reset();  // destructor shuts down
  EXPECT_TRUE(s->done());
}

TEST(StatsLogger, FormatsTheVllmLine) {
  StatsLogger logger("GPU");
  EngineMetrics m;
  logger.on_wake(100.0, m);
  m.prompt_tokens_total = 1230;
  m.generation_tokens_total = 4560;
  m.num_requests_running = 3;
  m.kv_cache_usage = 0.012;
  m.prefix_cache_queries = 200;
  m.prefix_cache_hits = 100;
  EXPECT_EQ(logger.format(100.0, m),
            "Engine 000: Avg prompt throughput: 12.3 tokens/s, Avg generation throughput: 45.6 tokens/s, "
            "Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 50.0%");
  logger.maybe_log(105.0, m);
  EXPECT_EQ(logger.pending_deadline(), std::optional<double>(110.0));
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

TEST(RequestStream, PopAfterTheFinalOutputReturnsAtOnce) {
  RequestStream s;
  RequestOutput o;
  o.finished = true;
  s.push(o);
  RequestOutput got;
  EXPECT_TRUE(s.pop(&got, std::chrono::milliseconds(0)));
  EXPECT_TRUE(got.finished);
  // Were it to wait for more outputs, it would wait the whole 2 minutes.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(s.pop(&got, std::chrono::minutes(2)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::minutes(1));
  EXPECT_TRUE(s.done());
}

}  // namespace
}  // namespace specula
