// Graceful shutdown: new requests get 503 at once; requests in flight may finish within
// --shutdown-timeout, then end with a 503 (whole responses) or an error event and [DONE]
// (streams); a client trickling its headers cannot hold the exit.
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "raw_client.h"
#include "server_fixture.h"

namespace specula::testing {
namespace {

using namespace std::chrono_literals;

TEST_F(ServerTest, ShutdownEndsStreamsWithAnErrorEventAndWholeResponsesWith503) {
  start();
  engine_.hold_after_first(true);
  RawClient a(port_), b(port_);
  ASSERT_TRUE(a.send_post("/v1/chat/completions", chat_body(true)));
  ASSERT_TRUE(b.send_post("/v1/completions", json{{"prompt", "x"}}));
  ASSERT_TRUE(a.read_until("\"content\":\"H\"", 5s));
  ASSERT_TRUE(eventually([&] { return engine_.started() == 2; }, 5s));
  const auto t0 = std::chrono::steady_clock::now();
  auto stopped = std::async(std::launch::async, [this] { stop(); });
  // The stream: an OpenAI-shaped error event, then [DONE].
  ASSERT_TRUE(a.read_until("data: [DONE]", 5s)) << a.received();
  EXPECT_NE(a.received().find("\"code\":503"), std::string::npos) << a.received();
  EXPECT_NE(a.received().find("shutting down"), std::string::npos) << a.received();
  // The whole response: 503, which the openai clients retry (a 4xx they would not).
  ASSERT_TRUE(b.read_until("shutting down", 5s)) << b.received();
  EXPECT_EQ(b.received().rfind("HTTP/1.1 503", 0), 0u) << b.received();
  stopped.get();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);  // a hang check: the drain here is 0
  EXPECT_EQ(engine_.aborted().size(), 2u);
  EXPECT_EQ(engine_.active(), 0u);
}

TEST_F(ServerTest, RequestsInFlightFinishWithinTheDrainAndNewOnesGet503) {
  shutdown_timeout_ = 10s;
  start();
  engine_.hold_after_first(true);
  RawClient a(port_);
  ASSERT_TRUE(a.send_post("/v1/chat/completions", chat_body(true)));
  ASSERT_TRUE(a.read_until("\"content\":\"H\"", 5s));
  auto stopped = std::async(std::launch::async, [this] { stop(); });
  // Draining: a new request is refused at once, while the one in flight goes on. (Wait on /health:
  // a completion sent before the drain began would be held with the first.)
  ASSERT_TRUE(eventually([&] { return get("/health").status == 503; }, 5s));
  EXPECT_EQ(post("/v1/completions", json{{"prompt", "x"}}).status, 503);
  engine_.hold_after_first(false);
  ASSERT_TRUE(a.read_until("data: [DONE]", 5s)) << a.received();
  EXPECT_NE(a.received().find("\"finish_reason\":\"stop\""), std::string::npos) << a.received();
  EXPECT_EQ(a.received().find("shutting down"), std::string::npos) << a.received();
  stopped.get();  // returns once the stream has finished, well before the 10 s drain
  EXPECT_TRUE(engine_.aborted().empty());
}

TEST_F(ServerTest, AClientTricklingItsHeadersDoesNotHoldTheExit) {
  connection_join_timeout_ = 300ms;
  start();
  auto slow = std::make_unique<RawClient>(port_);
  ASSERT_TRUE(slow->send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    while (trickling.load()) {
      if (!slow->send_raw("X")) break;
      std::this_thread::sleep_for(100ms);
    }
  });
  std::this_thread::sleep_for(200ms);
  server_->shutdown();
  thread_.join();  // serve() returns although the slow connection is still open
  EXPECT_EQ(server_->abandoned_connections(), 1u);
  trickling = false;
  trickle.join();
  // Its thread still runs inside the server: the server must outlive it, as the CLI's _Exit makes
  // sure. Here the process keeps both (the socket open, the server alive) until it ends.
  (void)slow.release();
  (void)server_.release();
}

}  // namespace
}  // namespace specula::testing
