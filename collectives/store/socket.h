// POSIX socket helpers shared by the TCP store's client and server.
#pragma once

#include "runtime/unique_fd.h"

#include <chrono>
#include <string>

namespace ddp::store_detail {

using UniqueFd = ::ddp::UniqueFd;

// "Connection refused" for ECONNREFUSED (thread-safe, unlike strerror).
std::string errno_text(int error);
// "127.0.0.1:29500", "[::1]:29500".
std::string endpoint(const std::string& host, int port);
// The remote address of a connected socket, "?" when unknown.
std::string peer_name(int fd);
// The local port a socket is bound to.
int local_port(int fd);
void set_nonblocking(int fd);
void set_nodelay(int fd);

// A bound, listening, non-blocking socket on host:port (SO_REUSEADDR).
// Throws StoreError naming the address and the fix (port in use, bad host).
UniqueFd listen_on(const std::string& host, int port, int backlog);

using Clock = std::chrono::steady_clock;
// Milliseconds until `deadline` for poll(), rounded up, at least 0, at most INT_MAX.
int poll_ms_until(Clock::time_point deadline);

}  // namespace ddp::store_detail
