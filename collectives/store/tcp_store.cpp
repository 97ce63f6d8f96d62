// TcpStore: the client side of the TCP store. One socket, one request in flight
// (calls are serialized by mutex_), blocking I/O expressed as poll() with a
// deadline so that every call ends by its timeout.
#include "collectives/store/tcp_store.h"

#include "runtime/env.h"
#include "runtime/logging.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <thread>

namespace ddp {

using store_detail::Clock;
using store_detail::UniqueFd;

namespace {

// The server answers TIMEOUT itself when a GET/WAIT expires; the client waits
// this much longer before it concludes that the server is hung.
constexpr auto kReplySlack = std::chrono::seconds(5);
constexpr auto kFirstBackoff = std::chrono::milliseconds(10);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);
constexpr auto kMaxBackoffWithBackup = std::chrono::milliseconds(100);
constexpr auto kEndpointSlice = std::chrono::milliseconds(2000);
constexpr auto kMinEndpointSlice = std::chrono::milliseconds(200);
constexpr size_t kReadChunkBytes = size_t{64} << 10;
constexpr size_t kKeysNamedInErrors = 16;

std::string seconds_text(std::chrono::milliseconds ms) {
  return fmt::format("{:g}", static_cast<double>(ms.count()) / 1000.0);
}

// "'a', 'b', 'c'" (the first kKeysNamedInErrors keys, then "and N more").
std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string text;
  for (size_t i = 0; i < keys.size() && i < kKeysNamedInErrors; ++i) {
    text += fmt::format("{}'{}'", i == 0 ? "" : ", ", keys[i]);
  }
  if (keys.size() > kKeysNamedInErrors)
    text += fmt::format(" and {} more", keys.size() - kKeysNamedInErrors);
  return text;
}

// Full jitter on top of exponential backoff, so that many ranks started at
// once do not reconnect in lockstep.
std::chrono::milliseconds jittered(std::chrono::milliseconds backoff) {
  thread_local std::minstd_rand rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> half(backoff.count() / 2, backoff.count());
  return std::chrono::milliseconds(half(rng));
}

// Connects one socket to `ai` before `deadline`; an empty UniqueFd and `error` set on failure.
UniqueFd connect_one(const addrinfo& ai, Clock::time_point deadline, std::string& error) {
  UniqueFd fd(::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC, ai.ai_protocol));
  if (!fd) {
    error = store_detail::errno_text(errno);
    return {};
  }
  store_detail::set_nonblocking(fd.get());
  if (::connect(fd.get(), ai.ai_addr, ai.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      error = store_detail::errno_text(errno);
      return {};
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int rc = 0;
    do {
      rc = ::poll(&p, 1, store_detail::poll_ms_until(deadline));
    } while (rc < 0 && errno == EINTR);
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (rc == 0) so_error = ETIMEDOUT;
    if (rc < 0) so_error = errno;
    if (rc > 0) ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      error = store_detail::errno_text(so_error);
      return {};
    }
  }
  store_detail::set_nodelay(fd.get());
  return fd;
}

}  // namespace

std::string store_secret_from_env() {
  return env::get(kStoreSecretEnv).value_or("");
}

TcpStore::TcpStore(TcpStoreOptions options)
    : options_(std::move(options)), read_buffer_(kReadChunkBytes) {
  DDP_CHECK_T(
      StoreError, options_.port > 0 && options_.port <= 65535,
      "store port {} is out of range; set MASTER_PORT (or --master-port) to a port in 1..65535",
      options_.port);
  std::lock_guard<std::mutex> lock(mutex_);
  connect_locked();
}

std::string TcpStore::where() const {
  if (!current_.empty()) return current_;
  return store_detail::endpoint(options_.host, options_.port);
}

// One attempt at the primary or the backup. With a backup each gets its own
// slice of at most kEndpointSlice (connecting and HELLO), so that one that never
// answers leaves time for the other.
bool TcpStore::try_endpoint(bool backup, Clock::time_point deadline, std::string& error) {
  if (has_backup()) {
    const auto now = Clock::now();
    deadline = std::min(now + kEndpointSlice, std::max(deadline, now + kMinEndpointSlice));
  }
  return backup ? try_connect_once(options_.backup_host, options_.backup_port, deadline, error)
                : try_connect_once(options_.host, options_.port, deadline, error);
}

// Note [store failover]: with a backup, the primary and the backup in turn --
// only the backup once it served this client (a primary gone does not come
// back; a new store on its port would be another job's).
void TcpStore::connect_locked() {
  const auto deadline = Clock::now() + options_.connect_timeout;
  auto backoff = std::chrono::duration_cast<std::chrono::milliseconds>(kFirstBackoff);
  std::string error = "not attempted", backup_error = "not attempted";
  for (int attempt = 1;; ++attempt) {
    bool backup = on_backup_.load();
    bool connected = try_endpoint(backup, deadline, backup ? backup_error : error);
    if (!connected && has_backup() && !on_backup_.load()) {
      backup = true;
      connected = try_endpoint(backup, deadline, backup_error);
    }
    if (connected) {
      const bool moved = backup != on_backup_.load();
      on_backup_.store(backup);
      if (attempt > 1 || moved)
        DDP_LOG_DEBUG("connected to the store at {} after {} attempts", where(), attempt);
      if (moved && backup)
        DDP_LOG_WARN("the store at {} is gone: its backup at {} serves now",
                     store_detail::endpoint(options_.host, options_.port), where());
      if (has_backup() && connected_before_) {
        for (const auto& [key, value] : on_close_) {
          exchange_locked(encode(msg::on_close(key, value)), Clock::now() + options_.timeout,
                          fmt::format("set_on_close('{}')", key));
        }
      }
      connected_before_ = true;
      return;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(jittered(backoff), deadline - now));
    // With a backup, often: it serves within a second of the primary's loss.
    backoff = std::min(backoff * 2, std::chrono::duration_cast<std::chrono::milliseconds>(
                                        has_backup() ? kMaxBackoffWithBackup : kMaxBackoff));
  }
  if (has_backup()) {
    throw StoreError(fmt::format(
        "cannot connect to the store at {} nor to its backup at {} after {} s: {}; the backup: {}",
        store_detail::endpoint(options_.host, options_.port),
        store_detail::endpoint(options_.backup_host, options_.backup_port),
        seconds_text(options_.connect_timeout), error, backup_error));
  }
  throw StoreError(fmt::format(
      "cannot connect to the store at {} after {} s: {}. Is MASTER_ADDR/MASTER_PORT right and is "
      "rank 0 / ddprun running?",
      where(), seconds_text(options_.connect_timeout), error));
}

// One attempt: resolve, connect, HELLO. Returns false (with `error`) for what a
// retry may fix (a backup on standby too); throws StoreError when the server
// refuses the secret.
bool TcpStore::try_connect_once(const std::string& host, int port, Clock::time_point deadline,
                                std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  current_ = store_detail::endpoint(host, port);  // where() in this attempt's errors
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &result); rc != 0) {
    error = fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc));
    return false;
  }
  for (const addrinfo* ai = result; ai != nullptr && !fd_; ai = ai->ai_next) {
    fd_ = connect_one(*ai, deadline, error);
  }
  ::freeaddrinfo(result);
  if (!fd_) return false;
  parser_.reset();
  Message reply;
  try {
    // With a backup, within the attempt's slice: a primary that takes connections
    // but never answers must not hold the client for its whole call timeout.
    const auto handshake_deadline = has_backup() ? deadline : Clock::now() + options_.timeout;
    send_all(encode(msg::hello(options_.secret)), handshake_deadline, "HELLO");
    reply = read_reply(handshake_deadline, "HELLO");
  } catch (const StoreError& e) {
    fd_.reset();
    error = e.what();
    return false;
  }
  if (reply.command != Command::kOk) {
    fd_.reset();
    const std::string text =
        reply.command == Command::kError ? reply.text : command_name(reply.command);
    if (text.starts_with("standby:")) {  // Note [store backup]: not serving yet
      error = fmt::format("{}: {}", store_detail::endpoint(host, port), text);
      return false;
    }
    throw StoreError(fmt::format("the store at {} refused this client: {}",
                                 store_detail::endpoint(host, port), text));
  }
  return true;
}

void TcpStore::fail_connection(const std::string& what, const std::string& why) {
  fd_.reset();
  parser_.reset();
  throw StoreConnectionLost(fmt::format(
      "store {} failed: lost the connection to the store at {}: {}. Did rank 0 / ddprun exit? "
      "Check its log.",
      what, where(), why));
}

void TcpStore::send_all(const Bytes& bytes, Clock::time_point deadline, const std::string& what) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_.get(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      fail_connection(what, store_detail::errno_text(errno));
    pollfd p{fd_.get(), POLLOUT, 0};
    if (::poll(&p, 1, store_detail::poll_ms_until(deadline)) == 0) {
      fd_.reset();
      parser_.reset();
      throw StoreTimeoutError(fmt::format(
          "store {} timed out sending to the store at {}: the server is not reading (hung or "
          "overloaded?); the next call reconnects",
          what, where()));
    }
  }
}

Message TcpStore::read_reply(Clock::time_point deadline, const std::string& what) {
  for (;;) {
    try {
      if (std::optional<Message> reply = parser_.next()) return std::move(*reply);
    } catch (const ProtocolError& e) {
      fail_connection(what, e.what());
    }
    pollfd p{fd_.get(), POLLIN, 0};
    const int rc = ::poll(&p, 1, store_detail::poll_ms_until(deadline));
    if (rc == 0) {
      fd_.reset();
      parser_.reset();
      throw StoreTimeoutError(fmt::format(
          "store {} got no reply from the store at {} in time; the server may be hung or "
          "overloaded; the next call reconnects",
          what, where()));
    }
    if (rc < 0) {
      if (errno == EINTR) continue;
      fail_connection(what, store_detail::errno_text(errno));
    }
    const ssize_t n = ::recv(fd_.get(), read_buffer_.data(), read_buffer_.size(), 0);
    if (n == 0) fail_connection(what, "the server closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      fail_connection(what, store_detail::errno_text(errno));
    }
    parser_.feed(read_buffer_.data(), static_cast<size_t>(n));
  }
}

Message TcpStore::exchange_locked(const Bytes& frame, Clock::time_point deadline,
                                  const std::string& what) {
  send_all(frame, deadline, what);
  return read_reply(deadline, what);
}

Message TcpStore::call(const Message& request, std::chrono::milliseconds reply_timeout,
                       const std::string& what, std::initializer_list<Command> expected) {
  const Bytes frame = encode(request);  // throws (naming the key) when over 64 MiB
  std::lock_guard<std::mutex> lock(mutex_);
  if (!fd_) connect_locked();
  Message reply;
  try {
    reply = exchange_locked(frame, Clock::now() + reply_timeout, what);
  } catch (const StoreConnectionLost& e) {
    if (!has_backup()) throw;
    // Note [store failover]: once more, on whichever of the two serves now.
    DDP_LOG_DEBUG("store {}: {}; connecting again", what, e.what());
    connect_locked();
    reply = exchange_locked(frame, Clock::now() + reply_timeout, what);
  }
  if (reply.command == Command::kError)
    throw StoreError(fmt::format("store {} failed: {}", what, reply.text));
  if (std::find(expected.begin(), expected.end(), reply.command) == expected.end()) {
    fail_connection(
        what, fmt::format("unexpected {} reply; is the server a ddp store of the same version?",
                          command_name(reply.command)));
  }
  return reply;
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  call(msg::set(key, value), options_.timeout, fmt::format("set('{}')", key), {Command::kOk});
}

namespace {
// The longest wait the server keeps: longer ones are cut to it here too, so that a
// reply's deadline cannot overflow the clock.
constexpr std::chrono::milliseconds kLongestWait{kMaxTimeoutMs};
}  // namespace

Bytes TcpStore::get(const std::string& key) {
  const auto timeout = std::min(options_.timeout, kLongestWait);
  Message reply = call(msg::get(key, timeout.count()), timeout + kReplySlack,
                       fmt::format("get('{}')", key), {Command::kValue, Command::kTimeout});
  if (reply.command == Command::kTimeout) {
    throw StoreTimeoutError(fmt::format(
        "store get('{}') timed out after {} s: no rank set the key. A rank may have failed or not "
        "reached this point yet; check the other ranks' logs, or raise the timeout (DDP_TIMEOUT_S) "
        "if startup is slow.",
        key, seconds_text(timeout)));
  }
  return std::move(reply.value);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return call(msg::add(key, delta), options_.timeout, fmt::format("add('{}', {})", key, delta),
              {Command::kInt})
      .number;
}

void TcpStore::wait(const std::vector<std::string>& keys,
                    std::optional<std::chrono::milliseconds> timeout) {
  if (keys.empty()) return;
  DDP_CHECK(!timeout || timeout->count() >= 0,
            "store wait({}): timeout {} ms is negative; pass a duration, or 0 to wait without a "
            "limit (as torch's Store.wait)",
            quoted_keys(keys), timeout ? timeout->count() : 0);
  auto limit = timeout.value_or(options_.timeout);
  // torch's 0 (kNoTimeout) waits without a limit: the longest wait the server keeps.
  if (limit.count() == 0 || limit > kLongestWait) limit = kLongestWait;
  const Message reply =
      call(msg::wait(keys, limit.count()), limit + kReplySlack,
           fmt::format("wait({})", quoted_keys(keys)), {Command::kOk, Command::kTimeout});
  if (reply.command == Command::kTimeout) {
    throw StoreTimeoutError(fmt::format(
        "store wait timed out after {} s; missing keys: {} ({} of {} waited for). A rank may have "
        "failed or not reached this point yet; check the other ranks' logs, or raise the timeout "
        "(DDP_TIMEOUT_S) if startup is slow.",
        seconds_text(limit), quoted_keys(reply.keys), reply.keys.size(), keys.size()));
  }
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return call(msg::compare_set(key, expected, desired), options_.timeout,
              fmt::format("compare_set('{}')", key), {Command::kValue})
      .value;
}

bool TcpStore::delete_key(const std::string& key) {
  return call(msg::delete_key(key), options_.timeout, fmt::format("delete_key('{}')", key),
              {Command::kInt})
             .number != 0;
}

int64_t TcpStore::server_time_ns() {
  return call(msg::time(), options_.timeout, "time()", {Command::kInt}).number;
}

void TcpStore::set_on_close(const std::string& key, const Bytes& value) {
  call(msg::on_close(key, value), options_.timeout, fmt::format("set_on_close('{}')", key),
       {Command::kOk});
  std::lock_guard<std::mutex> lock(mutex_);
  on_close_.emplace_back(key, value);
}

TcpStore::StreamEnd TcpStore::replicate(const std::function<void(Message&&)>& apply,
                                        const std::function<bool()>& stop) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!fd_) connect_locked();
  send_all(encode(msg::replicate()), Clock::now() + options_.timeout, "REPLICATE");
  for (;;) {
    for (;;) {
      std::optional<Message> m;
      try {
        m = parser_.next();
      } catch (const ProtocolError&) {
        fd_.reset();
        return StreamEnd::reset;  // garbage: not a primary that exited
      }
      if (!m) break;
      if (m->command == Command::kError) {
        fd_.reset();
        throw StoreError(fmt::format("the store at {} refused REPLICATE: {}", where(), m->text));
      }
      apply(std::move(*m));
    }
    if (stop()) return StreamEnd::stopped;
    pollfd p{fd_.get(), POLLIN, 0};
    const int rc = ::poll(&p, 1, 100);
    if (rc == 0 || (rc < 0 && errno == EINTR)) continue;
    const ssize_t n = rc < 0 ? -1 : ::recv(fd_.get(), read_buffer_.data(), read_buffer_.size(), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) {
      // A process that exits closes with FIN (this side sent nothing unread); a
      // primary that drops a backup resets the connection (Note [store backup]).
      const bool reset = n < 0 && errno == ECONNRESET;
      fd_.reset();
      parser_.reset();
      return reset ? StreamEnd::reset : StreamEnd::closed;
    }
    parser_.feed(read_buffer_.data(), static_cast<size_t>(n));
  }
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return call(msg::check(keys), options_.timeout, fmt::format("check({})", quoted_keys(keys)),
              {Command::kInt})
             .number != 0;
}

}  // namespace ddp
