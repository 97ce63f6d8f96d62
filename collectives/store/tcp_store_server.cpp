// TcpStoreServer: one thread, poll() over the listening socket, a wake pipe and
// every client connection. Nothing here blocks: reads and writes are
// non-blocking, and GET/WAIT requests whose keys are missing are parked as
// waiters until a write makes them true or their deadline passes.
#include "collectives/store/tcp_store.h"

#include "runtime/logging.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace ddp {

using store_detail::Clock;
using store_detail::UniqueFd;

namespace store_detail {

constexpr size_t kReadChunkBytes = size_t{64} << 10;
constexpr size_t kMaxHelloBytes = size_t{64} << 10;   // frame limit before a client has said HELLO
constexpr size_t kMaxBacklogBytes = size_t{1} << 20;  // stop serving a client that does not read
constexpr auto kLingerTime = std::chrono::seconds(1);
// Note [store backup]: how long a write waits for the backup's socket to take it
// before that backup is dropped (it follows again, from a fresh copy).
constexpr auto kReplicaWait = std::chrono::seconds(1);
// How long the primary must refuse a backup whose stream ended (as an exit
// ends it) before the backup concludes that it is gone and takes over.
constexpr auto kPrimaryGoneAfter = std::chrono::milliseconds(500);

// Note [lingering close]: closing a socket whose receive queue still holds
// bytes sends RST, and the peer may then lose our final ERROR reply. So a
// rejected client goes kOpen -> kFlushing (send the ERROR) -> kDraining (write
// side shut, input read and discarded until EOF or kLingerTime) -> closed.
enum class Phase { kOpen, kFlushing, kDraining };

struct Client {
  uint64_t id = 0;
  UniqueFd fd;
  std::string peer;
  MessageParser parser;
  Bytes out;
  size_t out_offset = 0;
  bool authenticated = false;
  bool greeted = false;  // a complete first message arrived (Note [store admission])
  Clock::time_point first_message_deadline{};
  bool parked = false;  // a GET/WAIT is waiting; later requests wait behind it
  bool closed = false;
  Phase phase = Phase::kOpen;
  Clock::time_point linger_deadline{};
  // ON_CLOSE: what to set when this connection closes (Note [on close]).
  std::vector<std::pair<std::string, Bytes>> on_close;
  bool replica = false;  // a backup's REPLICATE stream (Note [store backup])

  size_t backlog() const { return out.size() - out_offset; }
  bool pending() const { return !greeted && phase == Phase::kOpen && !closed; }
  bool can_process() const {
    return phase == Phase::kOpen && !parked && backlog() < kMaxBacklogBytes;
  }
  // A paused client is still read (a little) so that its disconnect is noticed.
  bool wants_read() const {
    if (phase == Phase::kDraining) return true;
    return phase == Phase::kOpen && (can_process() || parser.buffered_bytes() < kReadChunkBytes);
  }
};

struct Waiter {
  uint64_t client = 0;
  Command command = Command::kGet;  // kGet or kWait
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

bool secrets_equal(const std::string& given, const std::string& secret) {
  if (given.size() != secret.size()) return false;
  // Constant time in the content, so the secret cannot be guessed byte by byte.
  unsigned diff = 0;
  for (size_t i = 0; i < secret.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ secret[i]);
  return diff == 0;
}

}  // namespace store_detail

using store_detail::Client;
using store_detail::Phase;
using store_detail::Waiter;

// Note [store backup]: the writes the follower thread received, for the loop to
// apply (a REPLICATE message stands for "clear": a new stream's snapshot follows).
struct TcpStoreServer::Inbox {
  std::mutex mutex;
  std::vector<Message> messages;
  std::atomic<uint64_t>* applied = nullptr;  // TcpStoreServer::applied_
};

class TcpStoreServer::Loop {
 public:
  Loop(UniqueFd listen_fd, UniqueFd wake_read, const TcpStoreServerOptions& options,
       const std::atomic<bool>& stopping, const std::atomic<bool>& promoted, Inbox& inbox)
      : listen_fd_(std::move(listen_fd)),
        wake_read_(std::move(wake_read)),
        secret_(options.secret),
        first_message_timeout_(options.first_message_timeout),
        max_pending_(std::max<size_t>(options.max_pending, 1)),
        max_clients_(std::max<size_t>(options.max_clients, 1)),
        stopping_(stopping),
        promoted_(promoted),
        inbox_(inbox),
        primary_(store_detail::endpoint(options.follow_host, options.follow_port)),
        read_buffer_(store_detail::kReadChunkBytes) {}

  void run_guarded() {
    try {
      run();
    } catch (const std::exception& e) {
      DDP_LOG_ERROR("store server stopped after an unexpected error: {}", e.what());
    }
    clients_.clear();
    waiters_.clear();
  }

 private:
  void run();
  int next_timeout_ms() const;
  void accept_clients();
  void admit(UniqueFd fd);
  size_t count_pending() const;
  size_t close_silent_until(size_t pending_limit, const char* why);
  bool free_a_descriptor();
  void drop_silent(Client& c, const char* why);
  void on_event(Client& c, short revents);
  void read_from(Client& c);
  void process(Client& c);
  void flush(Client& c);
  void handle(Client& c, Message& m);
  bool authenticate(Client& c, const Message& m);
  void handle_add(Client& c, const Message& m);
  void start_replica(Client& c);
  void write(const std::string& key, Bytes value);
  bool erase(const std::string& key);
  void mirror(const Message& m);
  void apply_inbox();
  void handle_compare_set(Client& c, const Message& m);
  void park_or_answer(Client& c, Command command, std::vector<std::string> keys,
                      int64_t timeout_ms);
  void answer(Client& c, Command command, const std::vector<std::string>& keys);
  void notify(const std::string& key);
  void expire(Clock::time_point now);
  std::vector<std::string> missing_keys(const std::vector<std::string>& keys) const;
  void reply(Client& c, const Message& m) { encode(m, c.out); }
  void reply_error(Client& c, std::string text) { reply(c, msg::error(std::move(text))); }
  void reject(Client& c, const std::string& why);
  void refuse(Client& c, const std::string& why);
  void close(Client& c);

  UniqueFd listen_fd_;
  UniqueFd wake_read_;
  std::string secret_;
  std::chrono::milliseconds first_message_timeout_;
  size_t max_pending_;
  size_t max_clients_;
  size_t dropped_silent_ = 0;  // since the last warning about them
  Clock::time_point last_drop_warning_{};
  Clock::time_point last_accept_warning_{};
  const std::atomic<bool>& stopping_;
  const std::atomic<bool>& promoted_;  // false: a backup on standby (Note [store backup])
  Inbox& inbox_;
  std::string primary_;             // a backup's primary, for its refusals
  std::vector<uint64_t> replicas_;  // clients that asked REPLICATE
  std::vector<uint8_t> read_buffer_;
  std::map<uint64_t, Client> clients_;
  uint64_t next_client_id_ = 1;
  std::unordered_map<std::string, Bytes> data_;
  std::vector<Waiter> waiters_;
  std::vector<uint64_t> ready_;  // clients whose processing may resume (unparked, drained)
  Clock::time_point accept_paused_until_{};
};

void TcpStoreServer::Loop::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (!stopping_.load()) {
    fds.clear();
    ids.clear();
    const bool accepting = Clock::now() >= accept_paused_until_;
    fds.push_back({wake_read_.get(), POLLIN, 0});
    fds.push_back({listen_fd_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    for (auto& [id, c] : clients_) {
      short events = c.wants_read() ? POLLIN : 0;
      if (c.backlog() > 0) events |= POLLOUT;
      fds.push_back({c.fd.get(), events, 0});
      ids.push_back(id);
    }
    const int n = ::poll(fds.data(), fds.size(), next_timeout_ms());
    if (n < 0 && errno != EINTR)
      throw StoreError(fmt::format("poll failed: {}", store_detail::errno_text(errno)));
    if (stopping_.load()) break;
    if (fds[0].revents != 0) {
      char sink[64];
      while (::read(wake_read_.get(), sink, sizeof(sink)) > 0) {
      }
    }
    apply_inbox();
    if (n > 0 && (fds[1].revents & POLLIN) != 0) accept_clients();
    for (size_t i = 2; n > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) on_event(clients_.at(ids[i - 2]), fds[i].revents);
    }
    expire(Clock::now());
    while (!ready_.empty()) {
      const uint64_t id = ready_.back();
      ready_.pop_back();
      if (auto it = clients_.find(id); it != clients_.end() && !it->second.closed)
        process(it->second);
    }
    std::erase_if(clients_, [](const auto& entry) { return entry.second.closed; });
  }
}

int TcpStoreServer::Loop::next_timeout_ms() const {
  std::optional<Clock::time_point> next;
  auto consider = [&next](Clock::time_point t) { next = next ? std::min(*next, t) : t; };
  for (const Waiter& w : waiters_) consider(w.deadline);
  for (const auto& [id, c] : clients_) {
    if (c.phase == Phase::kDraining) consider(c.linger_deadline);
    if (c.pending()) consider(c.first_message_deadline);
  }
  if (Clock::now() < accept_paused_until_) consider(accept_paused_until_);
  return next ? store_detail::poll_ms_until(*next) : -1;
}

void TcpStoreServer::Loop::accept_clients() {
  for (;;) {
    const int fd = ::accept(listen_fd_.get(), nullptr, nullptr);
    if (fd >= 0) {
      admit(UniqueFd(fd));
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    // Out of descriptors: a connection that never said anything, or one being
    // closed, makes room (Note [store admission]); else retry shortly.
    const int err = errno;
    if ((err == EMFILE || err == ENFILE) && free_a_descriptor()) continue;
    const auto now = Clock::now();
    if (now - last_accept_warning_ >= std::chrono::seconds(10)) {
      DDP_LOG_WARN("store server cannot accept a connection: {}; retrying every 100 ms",
                   store_detail::errno_text(err));
      last_accept_warning_ = now;
    }
    accept_paused_until_ = now + std::chrono::milliseconds(100);
    return;
  }
}

void TcpStoreServer::Loop::admit(UniqueFd fd) {
  ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC);
  store_detail::set_nonblocking(fd.get());
  store_detail::set_nodelay(fd.get());
  Client c;
  c.id = next_client_id_++;
  c.fd = std::move(fd);
  c.peer = store_detail::peer_name(c.fd.get());
  c.authenticated = secret_.empty();
  c.first_message_deadline = Clock::now() + first_message_timeout_;
  c.parser.set_max_message_bytes(c.authenticated ? kMaxMessageBytes : store_detail::kMaxHelloBytes);
  DDP_LOG_DEBUG("store server: client {} connected from {}", c.id, c.peer);
  const uint64_t id = c.id;
  const bool full = clients_.size() >= max_clients_;
  Client& added = clients_.emplace(id, std::move(c)).first->second;
  if (full) {
    return reject(added, fmt::format("the store already serves {} connections, its limit; close "
                                     "unused clients (or raise TcpStoreServerOptions::max_clients)",
                                     max_clients_));
  }
  close_silent_until(max_pending_, "too many connections waiting to say HELLO");
}

size_t TcpStoreServer::Loop::count_pending() const {
  size_t pending = 0;
  for (const auto& [id, c] : clients_) pending += c.pending() ? 1 : 0;
  return pending;
}

// Closes the oldest pending connections until at most `pending_limit` are left;
// returns how many it closed. clients_ is ordered by id, that is by arrival: the
// first pending one has had the longest time to greet. Its HELLO may be sitting
// unread (a burst of real clients is accepted before any is read), so it is
// read first, and one that turns out to have greeted only lowers the count.
size_t TcpStoreServer::Loop::close_silent_until(size_t pending_limit, const char* why) {
  size_t pending = count_pending();
  size_t closed = 0;
  for (auto it = clients_.begin(); it != clients_.end() && pending > pending_limit; ++it) {
    Client& c = it->second;
    if (!c.pending()) continue;
    read_from(c);
    if (c.pending()) {
      drop_silent(c, why);
      ++closed;
    }
    --pending;  // greeted, gone, or closed just now
  }
  return closed;
}

bool TcpStoreServer::Loop::free_a_descriptor() {
  const size_t pending = count_pending();
  if (pending > 0 && close_silent_until(pending - 1, "out of file descriptors") > 0) return true;
  for (auto& [id, c] : clients_) {  // else the oldest rejected one, still lingering
    if (c.phase == Phase::kDraining && !c.closed) {
      close(c);
      return true;
    }
  }
  return false;
}

void TcpStoreServer::Loop::drop_silent(Client& c, const char* why) {
  DDP_LOG_DEBUG("store server: closing client {} ({}): no first message ({})", c.id, c.peer, why);
  ++dropped_silent_;
  const auto now = Clock::now();
  if (now - last_drop_warning_ >= std::chrono::seconds(10)) {
    DDP_LOG_WARN(
        "store server: closed {} connection(s) that sent no complete first message "
        "(latest from {}: {}); store clients send HELLO as soon as they connect",
        dropped_silent_, c.peer, why);
    dropped_silent_ = 0;
    last_drop_warning_ = now;
  }
  close(c);  // at once: its descriptor is what the next client needs
}

void TcpStoreServer::Loop::on_event(Client& c, short revents) {
  if (c.closed) return;  // dropped while this poll's results were being served
  if ((revents & POLLNVAL) != 0) return close(c);
  if ((revents & POLLOUT) != 0) flush(c);
  if (!c.closed && (revents & (POLLIN | POLLHUP | POLLERR)) != 0) read_from(c);
}

void TcpStoreServer::Loop::read_from(Client& c) {
  const ssize_t n = ::recv(c.fd.get(), read_buffer_.data(), read_buffer_.size(), 0);
  if (n == 0) return close(c);  // the peer closed (or finished draining)
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) close(c);
    return;
  }
  if (c.phase == Phase::kDraining) return;  // Note [lingering close]: discard
  c.parser.feed(read_buffer_.data(), static_cast<size_t>(n));
  process(c);
}

void TcpStoreServer::Loop::process(Client& c) {
  while (c.can_process()) {
    std::optional<Message> m;
    try {
      m = c.parser.next();
    } catch (const ProtocolError& e) {
      reject(c, e.what());
      break;
    }
    if (!m) break;
    c.greeted = true;
    handle(c, *m);
  }
  flush(c);
}

void TcpStoreServer::Loop::flush(Client& c) {
  if (c.closed) return;
  const bool was_paused = c.backlog() >= store_detail::kMaxBacklogBytes;
  while (c.backlog() > 0) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_offset, c.backlog(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close(c);
      break;
    }
    c.out_offset += static_cast<size_t>(n);
  }
  if (c.closed) return;
  if (c.backlog() == 0) {
    c.out.clear();
    c.out_offset = 0;
  } else if (c.out_offset >= store_detail::kMaxBacklogBytes) {
    c.out.erase(c.out.begin(), c.out.begin() + static_cast<std::ptrdiff_t>(c.out_offset));
    c.out_offset = 0;
  }
  if (c.phase == Phase::kFlushing && c.backlog() == 0) {
    ::shutdown(c.fd.get(), SHUT_WR);
    c.phase = Phase::kDraining;
    c.linger_deadline = Clock::now() + store_detail::kLingerTime;
  } else if (was_paused && c.can_process()) {
    ready_.push_back(c.id);
  }
}

bool TcpStoreServer::Loop::authenticate(Client& c, const Message& m) {
  if (m.command == Command::kHello && store_detail::secrets_equal(m.text, secret_)) {
    c.authenticated = true;
    c.parser.set_max_message_bytes(kMaxMessageBytes);
    return true;
  }
  reject(c, fmt::format(
                "wrong or missing secret from {}: this store requires HELLO with the run's secret "
                "as the first message. Set DDP_STORE_SECRET to the same value for every rank "
                "(ddprun does this for the ranks it starts).",
                c.peer));
  return false;
}

void TcpStoreServer::Loop::handle(Client& c, Message& m) {
  if (!promoted_.load()) {  // Note [store backup]: TcpStore tries the primary again
    DDP_LOG_DEBUG("store server: standby: refusing the connection from {}", c.peer);
    return refuse(c, fmt::format("standby: this is the backup of the store at {}; it serves "
                                 "only once that store is gone",
                                 primary_));
  }
  if (!c.authenticated && !authenticate(c, m)) return;
  switch (m.command) {
    case Command::kHello:
      if (secret_.empty() || store_detail::secrets_equal(m.text, secret_))
        return reply(c, msg::ok());
      return reject(c, fmt::format("wrong or missing secret from {} in a repeated HELLO", c.peer));
    case Command::kSet:
      write(m.key, std::move(m.value));
      return reply(c, msg::ok());
    case Command::kGet:
      return park_or_answer(c, m.command, {m.key}, m.number);
    case Command::kWait:
      return park_or_answer(c, m.command, std::move(m.keys), m.number);
    case Command::kAdd:
      return handle_add(c, m);
    case Command::kCompareSet:
      return handle_compare_set(c, m);
    case Command::kDelete:
      return reply(c, msg::integer(erase(m.key) ? 1 : 0));
    case Command::kCheck:
      return reply(c, msg::integer(missing_keys(m.keys).empty() ? 1 : 0));
    case Command::kTime:
      return reply(c, msg::integer(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now().time_since_epoch())
                                       .count()));
    case Command::kOnClose:
      if (c.replica) return reject(c, "ON_CLOSE on a REPLICATE stream");
      c.on_close.emplace_back(std::move(m.key), std::move(m.value));
      return reply(c, msg::ok());
    case Command::kReplicate:
      return start_replica(c);
    default:
      return reject(c, fmt::format("unexpected {} message from a client; clients send requests "
                                   "(HELLO, SET, GET, ADD, WAIT, COMPARE_SET, DELETE, CHECK, "
                                   "TIME, ON_CLOSE, REPLICATE)",
                                   command_name(m.command)));
  }
}

void TcpStoreServer::Loop::handle_add(Client& c, const Message& m) {
  int64_t value = 0;
  if (auto it = data_.find(m.key); it != data_.end()) {
    const char* begin = reinterpret_cast<const char*>(it->second.data());
    const char* end = begin + it->second.size();
    auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc() || ptr != end || begin == end) {
      return reply_error(c, fmt::format("add('{}'): the key holds a value that is not an integer "
                                        "({} bytes); use a separate key for counters",
                                        m.key, it->second.size()));
    }
  }
  if (__builtin_add_overflow(value, m.number, &value)) {
    return reply_error(
        c, fmt::format("add('{}', {}): the counter would overflow int64", m.key, m.number));
  }
  const std::string text = std::to_string(value);
  write(m.key, Bytes(text.begin(), text.end()));
  reply(c, msg::integer(value));
}

void TcpStoreServer::Loop::handle_compare_set(Client& c, const Message& m) {
  auto it = data_.find(m.key);
  const bool matches = it == data_.end() ? m.value.empty() : it->second == m.value;
  if (!matches) {
    return reply(c, msg::value(it == data_.end() ? Bytes{} : it->second));
  }
  write(m.key, m.desired);
  reply(c, msg::value(m.desired));
}

// Note [store backup]: every key now, OK, then every write as it is made.
void TcpStoreServer::Loop::start_replica(Client& c) {
  if (c.replica) return reject(c, "REPLICATE sent twice on one connection");
  // Closing a replica must set nothing: a write inside mirror() would nest.
  if (!c.on_close.empty()) return reject(c, "REPLICATE on a connection that registered ON_CLOSE");
  DDP_LOG_DEBUG("store server: client {} ({}) replicates {} keys", c.id, c.peer, data_.size());
  c.replica = true;
  for (const auto& [key, value] : data_) encode(msg::set(key, value), c.out);
  reply(c, msg::ok());
  replicas_.push_back(c.id);
}

// Every write goes through here: the backups get it before the writer's reply.
void TcpStoreServer::Loop::write(const std::string& key, Bytes value) {
  Bytes& stored = data_[key];
  stored = std::move(value);
  if (!replicas_.empty()) mirror(msg::set(key, stored));
  notify(key);
}

bool TcpStoreServer::Loop::erase(const std::string& key) {
  if (data_.erase(key) == 0) return false;
  if (!replicas_.empty()) mirror(msg::delete_key(key));
  return true;
}

// The write is in the kernel toward each backup before the writer gets its
// reply: a backup whose socket does not take it within kReplicaWait (a stopped
// or far too slow backup) is dropped, and follows again from a fresh copy.
void TcpStoreServer::Loop::mirror(const Message& m) {
  std::erase_if(replicas_, [this, &m](uint64_t id) {
    auto it = clients_.find(id);
    if (it == clients_.end() || it->second.closed) return true;
    Client& r = it->second;
    encode(m, r.out);
    flush(r);
    const auto deadline = Clock::now() + store_detail::kReplicaWait;
    while (!r.closed && r.backlog() > 0) {
      pollfd p{r.fd.get(), POLLOUT, 0};
      const int rc = ::poll(&p, 1, store_detail::poll_ms_until(deadline));
      if (rc == 0 || (rc < 0 && errno != EINTR)) break;
      flush(r);
    }
    if (r.closed) return true;
    if (r.backlog() == 0) return false;
    DDP_LOG_WARN(
        "store server: its backup at {} took no write for {} s: dropped; it follows "
        "again from a fresh copy",
        r.peer, std::chrono::duration<double>(store_detail::kReplicaWait).count());
    // Reset, not closed: the backup must not take this for the primary's exit.
    const linger reset{.l_onoff = 1, .l_linger = 0};
    ::setsockopt(r.fd.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    close(r);  // a replica registers no ON_CLOSE: nothing is written here
    return true;
  });
}

// A backup's loop: the primary's writes that the follower thread received.
void TcpStoreServer::Loop::apply_inbox() {
  std::vector<Message> messages;
  {
    std::lock_guard<std::mutex> lock(inbox_.mutex);
    messages.swap(inbox_.messages);
  }
  for (Message& m : messages) {
    if (m.command == Command::kReplicate) {
      data_.clear();
    } else if (m.command == Command::kSet) {
      write(m.key, std::move(m.value));
      inbox_.applied->fetch_add(1);
    } else if (m.command == Command::kDelete) {
      erase(m.key);
      inbox_.applied->fetch_add(1);
    }
  }
}

std::vector<std::string> TcpStoreServer::Loop::missing_keys(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!data_.contains(key)) missing.push_back(key);
  }
  return missing;
}

void TcpStoreServer::Loop::answer(Client& c, Command command,
                                  const std::vector<std::string>& keys) {
  if (command == Command::kGet) return reply(c, msg::value(data_.at(keys[0])));
  reply(c, msg::ok());  // WAIT
}

void TcpStoreServer::Loop::park_or_answer(Client& c, Command command, std::vector<std::string> keys,
                                          int64_t timeout_ms) {
  std::vector<std::string> missing = missing_keys(keys);
  if (missing.empty()) return answer(c, command, keys);
  if (timeout_ms <= 0) return reply(c, msg::timeout(std::move(missing)));
  const auto timeout = std::chrono::milliseconds(std::min(timeout_ms, kMaxTimeoutMs));
  c.parked = true;
  waiters_.push_back({c.id, command, std::move(keys), Clock::now() + timeout});
}

void TcpStoreServer::Loop::notify(const std::string& key) {
  std::erase_if(waiters_, [&](const Waiter& w) {
    if (std::find(w.keys.begin(), w.keys.end(), key) == w.keys.end()) return false;
    if (!missing_keys(w.keys).empty()) return false;
    Client& c = clients_.at(w.client);
    answer(c, w.command, w.keys);
    c.parked = false;
    ready_.push_back(c.id);  // flushes the answer and serves requests queued behind it
    return true;
  });
}

void TcpStoreServer::Loop::expire(Clock::time_point now) {
  std::erase_if(waiters_, [&](Waiter& w) {
    if (w.deadline > now) return false;
    Client& c = clients_.at(w.client);
    reply(c, msg::timeout(missing_keys(w.keys)));
    c.parked = false;
    ready_.push_back(c.id);
    return true;
  });
  for (auto& [id, c] : clients_) {
    if (c.phase == Phase::kDraining && !c.closed && c.linger_deadline <= now) close(c);
    if (c.pending() && c.first_message_deadline <= now) drop_silent(c, "first-message deadline");
  }
}

void TcpStoreServer::Loop::reject(Client& c, const std::string& why) {
  DDP_LOG_WARN("store server: closing the connection from {}: {}", c.peer, why);
  refuse(c, why);
}

// ERROR(why), then the lingering close, without a warning.
void TcpStoreServer::Loop::refuse(Client& c, const std::string& why) {
  reply_error(c, why);
  c.phase = Phase::kFlushing;
  flush(c);
}

// Note [on close]: a client's ON_CLOSE keys are set when its connection ends,
// however it ends (the peer closed it, its process died and the kernel closed
// it, a protocol error): ddprun's agents learn so at once that another agent is
// gone (launcher/rendezvous.h). A machine that vanishes without closing its
// connections is seen only by a heartbeat. Stopping the server sets nothing.
void TcpStoreServer::Loop::close(Client& c) {
  if (c.closed) return;
  DDP_LOG_DEBUG("store server: client {} ({}) disconnected", c.id, c.peer);
  c.closed = true;
  c.fd.reset();
  std::erase_if(waiters_, [&c](const Waiter& w) { return w.client == c.id; });
  for (auto& [key, value] : c.on_close) write(key, std::move(value));
  c.on_close.clear();
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) {
  UniqueFd listen_fd = store_detail::listen_on(options.host, options.port, options.backlog);
  port_ = store_detail::local_port(listen_fd.get());
  int pipe_fds[2];
  DDP_CHECK_T(StoreError, ::pipe(pipe_fds) == 0, "store server cannot create its wake pipe: {}",
              store_detail::errno_text(errno));
  UniqueFd wake_read(pipe_fds[0]);
  wake_write_.reset(pipe_fds[1]);
  for (int fd : pipe_fds) {
    store_detail::set_nonblocking(fd);
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  inbox_ = std::make_unique<Inbox>();
  inbox_->applied = &applied_;
  promoted_.store(options.follow_port == 0);
  loop_ = std::make_unique<Loop>(std::move(listen_fd), std::move(wake_read), options, stopping_,
                                 promoted_, *inbox_);
  thread_ = std::thread([this] { loop_->run_guarded(); });
  if (options.follow_port > 0) follower_ = std::thread([this, options] { follow(options); });
  DDP_LOG_DEBUG("store server listening on {}{}", store_detail::endpoint(options.host, port_),
                options.secret.empty() ? " (no secret: any client is accepted)" : "");
}

TcpStoreServer::~TcpStoreServer() {
  stop();
}

void TcpStoreServer::stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  wake();
  thread_.join();
  if (follower_.joinable()) follower_.join();
  loop_.reset();  // closes the listening socket and every connection
}

void TcpStoreServer::wake() {
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_write_.get(), &byte, 1);
}

void TcpStoreServer::promote() {
  if (!promoted_.exchange(true))
    DDP_LOG_INFO("store server on port {}: the backup serves from now on", port_);
  wake();
}

// Note [store backup]: the follower thread. Connects to the primary until it is
// in sync and hands the loop what the primary sends. When a stream that was in
// sync ends as a primary's exit does (closed, not reset: a primary that drops a
// slow backup resets the connection), the primary may be gone -- or the link
// broke: so it connects again, and takes over only once the primary has refused
// connections for kPrimaryGoneAfter (its port is closed: the process is gone). A
// connection that times out says nothing (a lost SYN, a full accept queue, a
// machine gone silent): it keeps trying, on standby. Before the first sync the
// primary may not be up yet: it keeps trying too.
void TcpStoreServer::follow(TcpStoreServerOptions options) {
  const std::string primary = store_detail::endpoint(options.follow_host, options.follow_port);
  const std::string refused = store_detail::errno_text(ECONNREFUSED);
  bool was_synced = false;   // the last stream was in sync and ended as an exit does
  bool ever_synced = false;  // then a refusal cannot be the secret's
  bool refusing = false;     // since refused_since
  Clock::time_point refused_since{};
  while (!stopping_.load() && !promoted_.load()) {
    bool synced = false, connected = false;
    auto end = TcpStore::StreamEnd::closed;
    std::string error;
    try {
      TcpStore store({.host = options.follow_host,
                      .port = options.follow_port,
                      .secret = options.secret,
                      .timeout = std::chrono::milliseconds(2000),
                      .connect_timeout = std::chrono::milliseconds(was_synced ? 100 : 1000)});
      connected = true;
      refusing = false;
      const auto push = [this](Message&& m) {
        std::lock_guard<std::mutex> lock(inbox_->mutex);
        inbox_->messages.push_back(std::move(m));
        wake();  // the loop drains the pipe: one byte per message is fine
      };
      push(msg::replicate());  // a fresh snapshot follows: clear
      const auto apply = [&](Message&& m) {
        if (m.command == Command::kOk) {
          synced = true;
          in_sync_.store(true);
        } else if ((m.command == Command::kSet || m.command == Command::kDelete) &&
                   !promoted_.load()) {  // once promoted it serves its own writes
          push(std::move(m));
        }
      };
      const auto stop = [this] { return stopping_.load() || promoted_.load(); };
      end = store.replicate(apply, stop);
      if (end == TcpStore::StreamEnd::stopped) break;
    } catch (const StoreError& e) {
      error = e.what();
      if (!ever_synced && error.find("refused this client") != std::string::npos) {
        DDP_LOG_ERROR("store backup: the store at {} refused it: {}; it stays on standby", primary,
                      error);
        break;  // the secret differs: trying again cannot help
      }
      DDP_LOG_DEBUG("store backup: cannot follow the store at {}: {}", primary, error);
    }
    in_sync_.store(false);
    if (stopping_.load()) break;
    if (connected) {
      was_synced = synced && end == TcpStore::StreamEnd::closed;
      ever_synced = ever_synced || synced;
      if (!was_synced) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (!was_synced) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    const auto now = Clock::now();
    if (error.find(refused) == std::string::npos) {
      refusing = false;  // inconclusive
    } else if (!refusing) {
      refusing = true;
      refused_since = now;
    } else if (now - refused_since >= store_detail::kPrimaryGoneAfter) {
      DDP_LOG_INFO(
          "store backup: the primary store at {} refuses connections ({} s after its "
          "stream ended): taking over",
          primary, std::chrono::duration<double>(store_detail::kPrimaryGoneAfter).count());
      promote();
      break;
    }
  }
  in_sync_.store(false);
}

}  // namespace ddp
