#include "collectives/store/socket.h"

#include "collectives/store/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <system_error>

namespace ddp::store_detail {

std::string errno_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

std::string endpoint(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return endpoint(host, std::atoi(port));
}

int local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  DDP_ASSERT(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
             "getsockname failed: {}", errno_text(errno));
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  DDP_ASSERT(flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0,
             "cannot make socket non-blocking: {}", errno_text(errno));
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
               sizeof(one));  // latency only; failure is harmless
}

namespace {

// Binds and listens on one resolved address; returns the socket or sets `error`.
UniqueFd try_listen(const addrinfo& ai, int backlog, int& error) {
  UniqueFd fd(::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC, ai.ai_protocol));
  if (!fd) {
    error = errno;
    return {};
  }
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), ai.ai_addr, ai.ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
    error = errno;
    return {};
  }
  set_nonblocking(fd.get());
  return fd;
}

}  // namespace

UniqueFd listen_on(const std::string& host, int port, int backlog) {
  DDP_CHECK_T(StoreError, port >= 0 && port <= 65535,
              "cannot listen on {}: port {} is out of range; pass a port in 1..65535 (or 0 for any "
              "free port)",
              endpoint(host, port), port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  DDP_CHECK_T(StoreError, rc == 0,
              "cannot listen on {}: cannot resolve '{}': {}; pass an address of "
              "this machine (e.g. 127.0.0.1 or 0.0.0.0)",
              endpoint(host, port), host, gai_strerror(rc));
  int error = 0;
  UniqueFd fd;
  for (const addrinfo* ai = result; ai != nullptr && !fd; ai = ai->ai_next) {
    int this_error = 0;
    fd = try_listen(*ai, backlog, this_error);
    if (error == 0 || this_error == EADDRINUSE) error = this_error;
  }
  ::freeaddrinfo(result);
  if (fd) return fd;
  if (error == EADDRINUSE) {
    throw StoreError(fmt::format(
        "cannot listen on {}: Address already in use; another job (or a stale ddprun, or a "
        "second process started as rank 0) holds the port — pass another --master-port "
        "(ddprun) or MASTER_PORT, or stop it",
        endpoint(host, port)));
  }
  throw StoreError(
      fmt::format("cannot listen on {}: {}; check that the address belongs to this "
                  "machine",
                  endpoint(host, port), errno_text(error)));
}

int poll_ms_until(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

}  // namespace ddp::store_detail
