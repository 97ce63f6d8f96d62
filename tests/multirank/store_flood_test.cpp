// The store under a connection flood (Note [store admission]), in real
// processes: the server runs in a child with a small descriptor limit (as a
// login shell's 1024 would be for a big flood), 500 connections that never
// speak and 1 MB of random bytes arrive first, then 4 ranks rendezvous. Without
// admission control the flood holds every descriptor and the ranks time out.
#include "collectives/store/tcp_store.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>

namespace ddp {
namespace {

using namespace std::chrono_literals;
using store_detail::UniqueFd;
using Clock = std::chrono::steady_clock;

constexpr const char* kSecret = "flood-test-secret";

// A store server in a forked child with RLIMIT_NOFILE = `max_fds`; it serves
// until the parent closes the pipe.
class ServerProcess {
 public:
  explicit ServerProcess(rlim_t max_fds) {
    int to_parent[2];
    int from_parent[2];
    EXPECT_EQ(::pipe(to_parent), 0);
    EXPECT_EQ(::pipe(from_parent), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(to_parent[0]);
      ::close(from_parent[1]);
      const rlimit limit{max_fds, max_fds};
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(3);
      TcpStoreServerOptions options;
      options.secret = kSecret;
      // Longer than the test's bound: only admission control (closing the
      // oldest silent connection) can let the ranks in in time.
      options.first_message_timeout = std::chrono::seconds(60);
      TcpStoreServer server(options);
      const int port = server.port();
      if (::write(to_parent[1], &port, sizeof(port)) != sizeof(port)) ::_exit(4);
      char byte;
      while (::read(from_parent[0], &byte, 1) > 0) {
      }
      server.stop();
      ::_exit(0);
    }
    ::close(to_parent[1]);
    ::close(from_parent[0]);
    keep_alive_.reset(from_parent[1]);
    EXPECT_EQ(::read(to_parent[0], &port_, sizeof(port_)), static_cast<ssize_t>(sizeof(port_)));
    ::close(to_parent[0]);
  }
  ~ServerProcess() {
    keep_alive_.reset();
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  UniqueFd keep_alive_;
};

// Starts a connection without waiting for it (the server may not accept it soon).
UniqueFd connect_nonblocking(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));  // EINPROGRESS
  return fd;
}

// Sends up to `bytes` random bytes within `budget`; returns how many went out
// (the server closes the connection once it sees they are not a message).
size_t send_garbage(int port, size_t bytes, std::chrono::milliseconds budget) {
  UniqueFd fd = connect_nonblocking(port);
  std::mt19937 gen(7);
  std::vector<uint8_t> chunk(64 << 10);
  size_t sent = 0;
  const auto deadline = Clock::now() + budget;
  while (sent < bytes && Clock::now() < deadline) {
    for (auto& b : chunk) b = static_cast<uint8_t>(gen());
    pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    const ssize_t n =
        ::send(fd.get(), chunk.data(), std::min(chunk.size(), bytes - sent), MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINPROGRESS && errno != ENOTCONN) break;
    if (n > 0) sent += static_cast<size_t>(n);
  }
  return sent;
}

// Every rank sets its key, waits for all, then counts itself in; rank 0 checks
// the count. Returns the seconds the whole rendezvous took, or -1 on failure.
double rendezvous_seconds(int port, int world) {
  const auto start = Clock::now();
  auto results =
      test::spawn_ranks(world,
                        [port](int rank, int size) {
                          TcpStoreOptions options;
                          options.host = "127.0.0.1";
                          options.port = port;
                          options.secret = kSecret;
                          options.timeout = 20000ms;
                          options.connect_timeout = 20000ms;
                          TcpStore store(options);
                          store.set("rank/" + std::to_string(rank), std::to_string(rank * 10));
                          std::vector<std::string> keys;
                          for (int r = 0; r < size; ++r)
                            keys.push_back("rank/" + std::to_string(r));
                          store.wait(keys);
                          for (int r = 0; r < size; ++r) {
                            if (store.get_string(keys[r]) != std::to_string(r * 10)) return 2;
                          }
                          if (store.add("arrived", 1) == size) store.set("all", "yes");
                          return store.get_string("all") == "yes" ? 0 : 3;
                        },
                        {.timeout = 60000ms});
  for (const auto& r : results) {
    if (!r.ok()) {
      ADD_FAILURE() << r.describe();
      return -1;
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(StoreFlood, FourRanksRendezvousAfterIdleConnectionsAndGarbage) {
  constexpr int kWorld = 4;
  constexpr int kIdle = 500;
  double usual = 0;
  {
    ServerProcess quiet(256);
    usual = rendezvous_seconds(quiet.port(), kWorld);
    ASSERT_GE(usual, 0);
  }
  ServerProcess server(256);  // fewer descriptors than the flood has connections
  std::vector<UniqueFd> idle;
  for (int i = 0; i < kIdle; ++i) idle.push_back(connect_nonblocking(server.port()));
  const size_t garbage = send_garbage(server.port(), size_t{1} << 20, 5000ms);
  const double flooded = rendezvous_seconds(server.port(), kWorld);
  std::printf(
      "store flood: rendezvous of %d ranks %.3f s quiet, %.3f s after %d idle connections "
      "and %zu random bytes\n",
      kWorld, usual, flooded, kIdle, garbage);
  ASSERT_GE(flooded, 0) << "the ranks could not rendezvous behind the flood";
  // Generous: the usual time is milliseconds; without closing the oldest
  // silent connections it is the ranks' 20 s timeout.
  EXPECT_LT(flooded, usual + 3.0);
}

}  // namespace
}  // namespace ddp
