// Whether the client of an HTTP request is still connected, asked of the kernel by the TCP
// connection's addresses (NETLINK_SOCK_DIAG exact lookup). cpp-httplib 0.11 gives a handler no
// way to see its socket, and a half-closed TCP socket stays writable, so without this a client
// that hangs up while its request waits (or a non-streamed request generates) would go unnoticed
// until the server writes to it.
#pragma once

#include <string>

namespace specula::server {

struct TcpEndpoints {
  std::string local_addr;
  int local_port = -1;
  std::string remote_addr;
  int remote_port = -1;
};

// True when the connection is gone or the peer has closed its side (CLOSE_WAIT and later states).
// False while it is established, and whenever the kernel cannot be asked (unknown = keep going).
bool tcp_peer_closed(const TcpEndpoints& conn);

}  // namespace specula::server
