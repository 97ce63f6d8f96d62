// The TCP rendezvous store: a server (hosted by ddprun on node 0, or by rank 0)
// and a client that implements Store. Wire format: store_protocol.h; user
// documentation and design decisions: docs/store.md.
//
//   TcpStoreServer server({.port = 29500, .secret = store_secret_from_env()});
//   TcpStore store({.host = "127.0.0.1", .port = server.port(), .secret =
//   store_secret_from_env()}); store.set("rank0/addr", "10.0.0.1:4000"); std::string addr =
//   store.get_string("rank0/addr");  // blocks until set, or StoreTimeoutError
//
// The secret: when the server's secret is non-empty, every connection must
// first send HELLO with the same secret, else it is answered ERROR("wrong or
// missing secret ...") and disconnected. An empty server secret accepts any
// client (fine on a trusted single host; set DDP_STORE_SECRET across nodes).
#pragma once

#include "collectives/store/socket.h"
#include "collectives/store/store.h"
#include "collectives/store/store_protocol.h"
#include "runtime/env.h"

#include <atomic>
#include <chrono>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace ddp {

inline constexpr const char* kStoreSecretEnv = env::kStoreSecret;

// DDP_STORE_SECRET, or "" when unset (then servers accept any client).
std::string store_secret_from_env();

// Note [store admission]: the store's port is reachable by anything on the
// network, so a connection must earn its place. Until a connection has sent a
// complete first message (HELLO, which TcpStore sends right after connecting)
// it is "pending": it is closed when first_message_timeout passes, and when
// more than max_pending connections are pending, or the process is out of
// descriptors, the oldest pending one is closed to make room. Real clients
// greet within milliseconds, so idle or garbage-sending connections can delay
// a rendezvous by at most first_message_timeout, never block it. Connections
// past max_clients are refused with an ERROR naming the limit.
struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // the only address bound; "0.0.0.0" for every interface
  int port = 0;                    // 0: an ephemeral port, see port()
  std::string secret;              // empty: accept any client
  int backlog = 128;
  std::chrono::milliseconds first_message_timeout{5000};
  size_t max_pending = 256;  // connections that have not sent a first message yet
  size_t max_clients = 16384;
};

// Serves the store from one background thread (poll() over every connection).
// GET and WAIT requests whose keys are missing are parked and answered when the
// keys appear, or with TIMEOUT when the request's own timeout passes.
// Malformed, oversized or unauthenticated input is answered ERROR and that
// connection is closed; the server and its other clients carry on.
class TcpStoreServer {
 public:
  // Binds and listens before returning; throws StoreError when it cannot (for
  // example "Address already in use").
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();  // stop()
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Closes every connection (blocked clients see the connection close) and joins
  // the thread. Idempotent.
  void stop();

  class Loop;  // the event loop, private to tcp_store_server.cpp

 private:
  int port_ = 0;
  std::unique_ptr<Loop> loop_;
  store_detail::UniqueFd wake_write_;  // a byte here wakes the loop to stop
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

struct TcpStoreOptions {
  std::string host;
  int port = 0;
  std::string secret;
  std::chrono::milliseconds timeout{300000};         // every call (get, wait, ...)
  std::chrono::milliseconds connect_timeout{60000};  // retrying a refused connection
};

// The client. Connects in the constructor, retrying refused connections with
// backoff until connect_timeout (so ranks may start before the server); throws
// StoreError when it cannot. Thread-safe: calls are serialized on one socket.
// A call that gets no reply in time throws StoreTimeoutError naming the key(s)
// and reconnects on the next call; a lost connection throws StoreError.
class TcpStore : public Store {
 public:
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override = default;

  using Store::set;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys,
            std::optional<std::chrono::milliseconds> timeout = std::nullopt) override;
  // When the key is absent and `expected` is non-empty nothing is set and the
  // result is empty (the key still has no value).
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  // The server's steady clock (TIME), for aligning the ranks' timelines (Note
  // [trace clocks] in runtime/trace/clock.h).
  int64_t server_time_ns();
  // ON_CLOSE: the server sets `key` = `value` when this client's connection
  // closes, however it closes (Note [on close] in tcp_store_server.cpp). A
  // reconnect after a lost connection does not register it again.
  void set_on_close(const std::string& key, const Bytes& value);
  void set_on_close(const std::string& key, std::string_view value) {
    set_on_close(key, Bytes(value.begin(), value.end()));
  }

 private:
  // Sends `request` and returns the reply (never ERROR: that throws StoreError).
  // `what` names the call in errors, e.g. "get('rank0/addr')".
  Message call(const Message& request, std::chrono::milliseconds reply_timeout,
               const std::string& what, std::initializer_list<Command> expected);
  void connect_locked();
  bool try_connect_once(store_detail::Clock::time_point deadline, std::string& error);
  void send_all(const Bytes& bytes, store_detail::Clock::time_point deadline,
                const std::string& what);
  Message read_reply(store_detail::Clock::time_point deadline, const std::string& what);
  [[noreturn]] void fail_connection(const std::string& what, const std::string& why);
  std::string where() const;

  TcpStoreOptions options_;
  std::mutex mutex_;
  store_detail::UniqueFd fd_;
  MessageParser parser_;
  Bytes read_buffer_;
};

}  // namespace ddp
