// Streams under stress: clients that hang up (the request must be aborted so its KV blocks are
// freed) and 1,000 streams open at once (shutdown: shutdown_test.cc).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "raw_client.h"
#include "server_fixture.h"

namespace specula::testing {
namespace {

using namespace std::chrono_literals;

TEST_F(ServerTest, ClientHangingUpMidStreamAbortsTheRequest) {
  start();
  engine_.hold_after_first(true);  // after "H" nothing more is written: only the probe can notice
  RawClient client(port_);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(client.send_post("/v1/chat/completions", chat_body(true)));
  ASSERT_TRUE(client.read_until("\"content\":\"H\"", 30s)) << client.received();
  ASSERT_EQ(engine_.requests().size(), 1u);
  std::string id = engine_.requests()[0].request_id;
  EXPECT_TRUE(engine_.aborted().empty());
  client.close_now();
  EXPECT_TRUE(eventually([&] { return engine_.aborted().count(id) == 1; }, 30s));
  EXPECT_EQ(engine_.active(), 0u);
}

TEST_F(ServerTest, StreamsAreNotCompressedEvenWhenTheClientAcceptsIt) {
  // Compressing an SSE stream buffers it: the client (node's fetch asks for gzip) would see
  // nothing until the end.
  start();
  engine_.hold_after_first(true);
  RawClient client(port_);
  ASSERT_TRUE(client.send_post("/v1/chat/completions", chat_body(true), "Accept-Encoding: gzip, deflate, br\r\n"));
  ASSERT_TRUE(client.read_until("\"content\":\"H\"", 30s)) << client.received();
  EXPECT_NE(client.received().find("Content-Type: text/event-stream\r\n"), std::string::npos) << client.received();
  EXPECT_EQ(client.received().find("Content-Encoding"), std::string::npos);
  engine_.hold_after_first(false);
  EXPECT_TRUE(client.read_until("data: [DONE]", 30s));
}

TEST_F(ServerTest, ClientHangingUpOnANonStreamedRequestAbortsIt) {
  start();
  engine_.hold_after_first(true);
  RawClient client(port_);
  ASSERT_TRUE(client.send_post("/v1/chat/completions", chat_body(false)));
  ASSERT_TRUE(eventually([&] { return engine_.started() == 1; }, 30s));
  std::string id = engine_.requests()[0].request_id;
  client.close_now();
  EXPECT_TRUE(eventually([&] { return engine_.aborted().count(id) == 1; }, 30s));
}

TEST_F(ServerTest, ClientHangingUpWhileTokensKeepComingIsNoticedWithoutAWrite) {
  // A non-streamed request writes nothing until the end, and its outputs arrive more often than
  // the idle wait (a 100 ms step against the server's 200 ms wait slice): the hang-up must still
  // be noticed before the reply is complete. Only an unfinished request is aborted
  // (GenerationRun::cancel skips finished ones), so an abort at all says it was noticed in time;
  // the deadline below is only there so that a broken probe fails rather than hangs, and a loaded
  // machine stretches the reply (the fake engine's steps are sleeps) as much as the probe.
  start();
  engine_.reply = std::string(120, 'x');
  engine_.step_delay_ms = 100;  // 120 tokens: 12 s
  RawClient client(port_);
  ASSERT_TRUE(client.send_post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 120}}));
  ASSERT_TRUE(eventually([&] { return engine_.started() == 1; }, 30s));
  std::string id = engine_.requests()[0].request_id;
  client.close_now();
  EXPECT_TRUE(eventually([&] { return engine_.aborted().count(id) == 1; }, 60s));
  EXPECT_EQ(engine_.active(), 0u);
}

TEST_F(ServerTest, ClientThatStaysIsNotAborted) {
  start();
  engine_.hold_after_first(true);
  RawClient client(port_);
  ASSERT_TRUE(client.send_post("/v1/completions", json{{"prompt", "x"}, {"stream", true}}));
  ASSERT_TRUE(client.read_until("\"text\":\"H\"", 30s));
  std::this_thread::sleep_for(2500ms);  // several probe intervals
  EXPECT_TRUE(engine_.aborted().empty());
  engine_.hold_after_first(false);
  EXPECT_TRUE(client.read_until("data: [DONE]", 30s)) << client.received();
}

TEST_F(ServerTest, HoldsAThousandConcurrentStreams) {
  constexpr int kStreams = 1000;
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  rlim_t need = 3 * kStreams;  // client and server ends of each connection, and some spare
  if (lim.rlim_cur < need) {
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need) GTEST_SKIP() << "open file limit too low";
    lim.rlim_cur = need;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
  }
  start();
  engine_.step_delay_ms = 20;
  engine_.hold_after_first(true);
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<RawClient>(port_));
    ASSERT_TRUE(clients.back()->ok()) << "connection " << i;
    ASSERT_TRUE(clients.back()->send_post("/v1/completions", json{{"prompt", "x"}, {"stream", true}}));
  }
  // Every stream is open and has received its first token while all the others are open too.
  ASSERT_TRUE(eventually([&] { return engine_.started() == kStreams; }, 60s)) << engine_.started();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(clients[i]->read_until("\"text\":\"H\"", 20s)) << "stream " << i;
  }
  engine_.hold_after_first(false);
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(clients[i]->read_until("data: [DONE]", 30s)) << "stream " << i;
    const std::string& got = clients[i]->received();
    size_t at = 0;
    for (char ch : std::string("Hello!")) {
      at = got.find(std::string("\"text\":\"") + ch + "\"", at);
      ASSERT_NE(at, std::string::npos) << "stream " << i << " lacks " << ch;
    }
  }
  EXPECT_TRUE(engine_.aborted().empty());
  EXPECT_EQ(engine_.active(), 0u);
}

}  // namespace
}  // namespace specula::testing
