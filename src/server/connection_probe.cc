#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace specula::server {
namespace {

// Fills a diag address from text; false for something that is not an IP address.
bool parse_addr(const std::string& text, int* family, __be32 out[4]) {
  std::memset(out, 0, 16);
  std::string addr = text;
  if (inet_pton(AF_INET, addr.c_str(), out) == 1) {
    *family = AF_INET;
    return true;
  }
  if (inet_pton(AF_INET6, addr.c_str(), out) == 1) {
    *family = AF_INET6;
    return true;
  }
  return false;
}

}  // namespace

bool tcp_peer_closed(const TcpEndpoints& conn) {
  if (conn.local_port <= 0 || conn.remote_port <= 0) return false;
  int family = 0, family2 = 0;
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  if (!parse_addr(conn.local_addr, &family, msg.req.id.idiag_src)) return false;
  if (!parse_addr(conn.remote_addr, &family2, msg.req.id.idiag_dst) || family2 != family) return false;
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;  // no NLM_F_DUMP: an exact lookup of one socket
  msg.req.sdiag_family = static_cast<__u8>(family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = htons(static_cast<uint16_t>(conn.local_port));
  msg.req.id.idiag_dport = htons(static_cast<uint16_t>(conn.remote_port));
  msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return false;
  timeval tv{0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  bool closed = false;
  if (sendto(fd, &msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) == sizeof(msg)) {
    alignas(nlmsghdr) char buf[8192];
    ssize_t len = recv(fd, buf, sizeof(buf), 0);
    if (len > 0) {
      auto* h = reinterpret_cast<nlmsghdr*>(buf);
      if (NLMSG_OK(h, static_cast<unsigned>(len))) {
        if (h->nlmsg_type == NLMSG_ERROR) {
          auto* err = static_cast<nlmsgerr*>(NLMSG_DATA(h));
          closed = err->error == -ENOENT;  // no such connection any more
        } else if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
          auto* diag = static_cast<inet_diag_msg*>(NLMSG_DATA(h));
          switch (diag->idiag_state) {
            case TCP_CLOSE_WAIT: case TCP_LAST_ACK: case TCP_CLOSING: case TCP_CLOSE: case TCP_TIME_WAIT:
              closed = true;
              break;
            default:
              break;
          }
        }
      }
    }
  }
  close(fd);
  return closed;
}

}  // namespace specula::server
