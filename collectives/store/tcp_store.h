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
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

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
// Note [store backup]
// ~~~~~~~~~~~~~~~~~~~
// A store can have one backup, so that the loss of the machine hosting it is
// not the loss of the store (ddprun --rdzv-backup, docs/elastic.md). The backup
// is a TcpStoreServer started with `follow_host`/`follow_port`: it connects to
// the primary (HELLO with the secret, then REPLICATE), and the primary sends it
// every key (a SET each, then OK: in sync) and from then on every write as it
// makes it -- SET with the key's new value (an ADD or a COMPARE_SET travels as
// the value it left, so a write is applied once), DELETE -- handed to the kernel
// before the writer's reply (a backup whose socket takes no write for 1 s is
// dropped, and follows again from a fresh copy). The backup stands by meanwhile:
// it refuses every other client ("standby ..."), so clients never split between
// two stores while the primary lives. When a stream that was in sync ends, it
// connects again (the primary may have dropped it, or the link broken) and takes
// over (promoted()) only when the primary cannot be reached for 0.5 s: its
// process exited or was killed, or its machine is down. promote() makes it serve
// at once. From then on it serves the keys it mirrored; it does not follow again.
// Not covered: a partition that leaves the primary alive but out of the backup's
// reach (both serve then), and a backup dropped as too slow whose primary dies
// before it is in sync again (it has not taken over: the store is lost). A TcpStore given
// `backup_host`/`backup_port` goes to the backup when it loses the primary (Note [store failover]
// below).
struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // the only address bound; "0.0.0.0" for every interface
  int port = 0;                    // 0: an ephemeral port, see port()
  std::string secret;              // empty: accept any client
  // Note [store backup]: the primary this server backs up (empty: none, it serves
  // at once). Its `secret` is the primary's too.
  std::string follow_host{};
  int follow_port = 0;
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

  // A backup (Note [store backup]): whether it has every key of the primary and
  // follows its writes; whether it serves clients (always true for a primary).
  bool in_sync() const { return in_sync_.load(); }
  // A backup: how many of the primary's writes its loop has applied (tests).
  uint64_t applied_writes() const { return applied_.load(); }
  bool promoted() const { return promoted_.load(); }
  // A backup: serve from now on, whatever the primary does (idempotent).
  void promote();

  class Loop;    // the event loop, private to tcp_store_server.cpp
  struct Inbox;  // what the follower thread hands the loop

 private:
  void follow(TcpStoreServerOptions options);
  void wake();

  int port_ = 0;
  std::unique_ptr<Loop> loop_;
  std::unique_ptr<Inbox> inbox_;
  store_detail::UniqueFd wake_write_;  // a byte here wakes the loop (to stop, or for the inbox)
  std::atomic<bool> stopping_{false};
  std::atomic<bool> in_sync_{false};
  std::atomic<uint64_t> applied_{0};
  std::atomic<bool> promoted_{true};
  std::thread thread_;
  std::thread follower_;
};

struct TcpStoreOptions {
  std::string host;
  int port = 0;
  std::string secret;
  std::chrono::milliseconds timeout{300000};         // every call (get, wait, ...)
  std::chrono::milliseconds connect_timeout{60000};  // retrying a refused connection
  // Note [store failover]: the primary's backup (Note [store backup]); empty: none.
  std::string backup_host{};
  int backup_port = 0;
};

// A lost connection (closed, reset, garbage): the next call reconnects.
class StoreConnectionLost : public StoreError {
  using StoreError::StoreError;
};

// Note [store failover]
// ~~~~~~~~~~~~~~~~~~~~~
// A TcpStore with a backup tries the primary and the backup in turn whenever it
// connects, each attempt within 2 s (a backup on standby refuses, "standby ...",
// which counts as not there yet); once the backup served it, only the backup (a
// store on the primary's port again would be another job's). A call whose
// connection is lost (not one that timed out) is sent once more over the new
// connection: a GET or WAIT parked on a primary that died waits on, on the backup. The ON_CLOSE
// keys the client registered are registered again on every new connection, so the backup sets them
// when this client goes. A write whose reply was lost with the primary is sent again: SET,
// COMPARE_SET and DELETE leave the same state, an ADD may count twice.

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
  // reconnect after a lost connection registers it again only with a backup
  // (Note [store failover]).
  void set_on_close(const std::string& key, const Bytes& value);
  void set_on_close(const std::string& key, std::string_view value) {
    set_on_close(key, Bytes(value.begin(), value.end()));
  }
  // Whether the connection now is to the backup (Note [store failover]).
  bool on_backup() const { return on_backup_.load(); }

  // A backup's side of REPLICATE (Note [store backup]): sends it, then hands every
  // message the primary sends to `apply` (SETs, OK once in sync, SETs and DELETEs)
  // until the connection ends or `stop()` is true (asked every 100 ms).
  enum class StreamEnd { stopped, closed, reset };  // reset: the primary dropped it
  StreamEnd replicate(const std::function<void(Message&&)>& apply,
                      const std::function<bool()>& stop);

 private:
  // Sends `request` and returns the reply (never ERROR: that throws StoreError).
  // `what` names the call in errors, e.g. "get('rank0/addr')".
  Message call(const Message& request, std::chrono::milliseconds reply_timeout,
               const std::string& what, std::initializer_list<Command> expected);
  void connect_locked();
  bool try_connect_once(const std::string& host, int port, store_detail::Clock::time_point deadline,
                        std::string& error);
  bool try_endpoint(bool backup, store_detail::Clock::time_point deadline, std::string& error);
  Message exchange_locked(const Bytes& frame, store_detail::Clock::time_point deadline,
                          const std::string& what);
  bool has_backup() const { return options_.backup_port > 0; }
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
  std::atomic<bool> on_backup_{false};
  std::string current_;  // the endpoint connected to, or being tried
  bool connected_before_ = false;
  std::vector<std::pair<std::string, Bytes>> on_close_;  // registered, for a new connection
};

}  // namespace ddp
