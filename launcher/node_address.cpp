#include "launcher/node_address.h"

#include "launcher/options.h"
#include "launcher/process.h"
#include "launcher/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <thread>

namespace ddp::launcher {

using Clock = std::chrono::steady_clock;

std::vector<std::string> resolve_host(const std::string& host, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    error = ::gai_strerror(rc);
    return {};
  }
  std::vector<std::string> out;
  for (const addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char text[NI_MAXHOST] = {};
    if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof(text), nullptr, 0,
                      NI_NUMERICHOST) == 0)
      out.emplace_back(text);
  }
  ::freeaddrinfo(result);
  return out;
}

bool is_loopback_address(const std::string& numeric) {
  in_addr v4{};
  if (::inet_pton(AF_INET, numeric.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, numeric.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

bool names_loopback_on_purpose(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  return host == "localhost" || ::inet_pton(AF_INET, host.c_str(), &v4) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

namespace {

std::vector<std::string> resolve_with_retries(const std::string& host,
                                              std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  bool said = false;
  for (;;) {
    std::string error;
    auto addresses = resolve_host(host, error);
    if (!addresses.empty()) return addresses;
    if (const int sig = SignalPipe::stop_signal()) throw Interrupted(sig);
    if (Clock::now() >= deadline) {
      throw LaunchError(fmt::format(
          "node 0 cannot resolve '{}' (--master-addr or --rdzv-endpoint's HOST) within {:g} s: "
          "{}. Pass a name or address of this machine that the other nodes can reach; "
          "--rdzv-timeout sets the wait",
          host, std::chrono::duration<double>(timeout).count(), error));
    }
    if (!said) {
      say(fmt::format("cannot resolve '{}' yet ({}); retrying for up to {:g} s (--rdzv-timeout)",
                      host, error, std::chrono::duration<double>(timeout).count()));
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace

void check_node0_address(const LaunchOptions& o, std::chrono::milliseconds timeout) {
  if (o.nnodes == 1 || o.node_rank != 0) return;
  // Node 0 connects to its own store by this name, whatever --rdzv-bind binds.
  const std::string host = rdzv_store_host(o);
  const auto addresses = resolve_with_retries(host, timeout);
  if (!o.rdzv_bind.empty() || names_loopback_on_purpose(host)) return;
  DDP_CHECK_T(UsageError, !is_loopback_address(addresses.front()),
              "'{}' (--master-addr, or --rdzv-endpoint's HOST) resolves to {} on this machine, a "
              "loopback address the other "
              "{} node(s) cannot reach, so the agents' store would wait --rdzv-timeout for them "
              "in vain (Debian maps the host's own name to 127.0.1.1 in /etc/hosts); pass "
              "--rdzv-bind 0.0.0.0 to bind every interface, or --master-addr with this node's "
              "routable address",
              host, addresses.front(), o.nnodes - 1);
}

}  // namespace ddp::launcher
