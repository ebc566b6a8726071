// Streams under stress: clients that hang up (the request must be aborted so its KV blocks are
// freed), 1,000 streams open at once, and shutdown with streams in flight.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "server_fixture.h"

namespace specula::testing {
namespace {

using namespace std::chrono_literals;

// A raw HTTP/1.1 client socket, so a test can hang up at a moment of its choosing.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawClient() { close_now(); }
  bool ok() const { return ok_; }
  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send_post(const std::string& path, const json& body, const std::string& extra_headers = "") {
    std::string b = body.dump();
    std::string req = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                      extra_headers +
                      "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b;
    return ::send(fd_, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
  }
  // Reads until `marker` has arrived (true) or the deadline passes / the peer closes (false).
  bool read_until(const std::string& marker, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (received_.find(marker) == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return received_.find(marker) != std::string::npos;
      received_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  const std::string& received() const { return received_; }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string received_;
};

template <class F>
bool eventually(F cond, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return cond();
}

json chat_body(bool stream) {
  return {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stream", stream}};
}

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

TEST_F(ServerTest, ShutdownWithStreamsInFlightAbortsThemAndReturns) {
  start();
  engine_.hold_after_first(true);
  RawClient a(port_), b(port_);
  ASSERT_TRUE(a.send_post("/v1/chat/completions", chat_body(true)));
  ASSERT_TRUE(b.send_post("/v1/completions", json{{"prompt", "x"}}));
  ASSERT_TRUE(a.read_until("\"content\":\"H\"", 30s));
  ASSERT_TRUE(eventually([&] { return engine_.started() == 2; }, 30s));
  auto t0 = std::chrono::steady_clock::now();
  stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(engine_.aborted().size(), 2u);
  EXPECT_EQ(engine_.active(), 0u);
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
