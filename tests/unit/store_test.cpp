// The TCP rendezvous store: wire format, parser robustness, and a real server
// with real clients on loopback (ephemeral ports).
#include "collectives/store/store_protocol.h"
#include "collectives/store/tcp_store.h"

#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <thread>

namespace ddp {
namespace {

using namespace std::chrono_literals;
using store_detail::UniqueFd;
using Ms = std::chrono::milliseconds;

Bytes bytes_of(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

// Runs `f`, which must throw E, and returns the message.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

std::vector<Message> one_of_each() {
  return {msg::hello("s3cret"),
          msg::set("k", Bytes{0, 1, 255}),
          msg::get("k", 5000),
          msg::add("counter", -3),
          msg::wait({"a", "", "c"}, 7),
          msg::compare_set("k", {}, bytes_of("new")),
          msg::delete_key("k"),
          msg::check({"a"}),
          msg::time(),
          msg::on_close("gone/1", bytes_of("agent")),
          msg::ok(),
          msg::value({}),
          msg::integer(INT64_MIN),
          msg::timeout({"x", "y"}),
          msg::error("boom")};
}

// Everything `parser` yields until it needs more bytes.
std::vector<Message> drain(MessageParser& parser) {
  std::vector<Message> out;
  while (auto m = parser.next()) out.push_back(std::move(*m));
  return out;
}

std::string frame_error(const Bytes& bytes) {
  MessageParser parser;
  parser.feed(bytes.data(), bytes.size());
  return error_of<ProtocolError>([&] { drain(parser); });
}

TEST(StoreProtocol, RoundTripsEveryCommand) {
  Bytes stream;
  for (const Message& m : one_of_each()) encode(m, stream);
  MessageParser parser;
  parser.feed(stream.data(), stream.size());
  EXPECT_EQ(drain(parser), one_of_each());
  EXPECT_EQ(parser.buffered_bytes(), 0u);
}

TEST(StoreProtocol, ParsesByteByByte) {
  Bytes stream;
  for (const Message& m : one_of_each()) encode(m, stream);
  MessageParser parser;
  std::vector<Message> got;
  for (uint8_t byte : stream) {
    parser.feed(&byte, 1);
    for (Message& m : drain(parser)) got.push_back(std::move(m));
  }
  EXPECT_EQ(got, one_of_each());
}

TEST(StoreProtocol, WireLayoutIsLittleEndian) {
  // length 14 = command + (4 + 1) key + 8 delta
  const Bytes expected = {14,  0,    0,    0,    4,    1,    0,    0,    0,
                          'k', 0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  EXPECT_EQ(encode(msg::add("k", -2)), expected);
  EXPECT_STREQ(command_name(Command::kCompareSet), "COMPARE_SET");
  EXPECT_TRUE(is_request(Command::kCheck));
  EXPECT_FALSE(is_request(Command::kValue));
}

TEST(StoreProtocol, RejectsMalformedInput) {
  EXPECT_NE(frame_error({1, 0, 0, 0, 99}).find("unknown command 99"), std::string::npos);
  EXPECT_NE(frame_error({0, 0, 0, 0}).find("empty frame"), std::string::npos);
  // SET whose key claims 100 bytes but holds 2.
  EXPECT_NE(frame_error({7, 0, 0, 0, 2, 100, 0, 0, 0, 'a', 'b'}).find("'key' is truncated"),
            std::string::npos);
  // OK followed by a stray byte inside its frame.
  EXPECT_NE(frame_error({2, 0, 0, 0, 64, 0}).find("OK has 1 trailing bytes"), std::string::npos);
  // CHECK claiming 2^32-1 keys in 4 bytes: rejected without reserving memory for them.
  EXPECT_NE(frame_error({9, 0, 0, 0, 8, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0})
                .find("claims 4294967295 keys"),
            std::string::npos);
  // GET without its timeout.
  EXPECT_NE(frame_error({6, 0, 0, 0, 3, 1, 0, 0, 0, 'k'}).find("'number' is truncated"),
            std::string::npos);
}

TEST(StoreProtocol, RejectsOversizedFramesBeforeBufferingThem) {
  const uint32_t announced = static_cast<uint32_t>(kMaxMessageBytes) + 1;
  const Bytes header = {static_cast<uint8_t>(announced), static_cast<uint8_t>(announced >> 8),
                        static_cast<uint8_t>(announced >> 16),
                        static_cast<uint8_t>(announced >> 24)};
  MessageParser parser;
  parser.feed(header.data(), header.size());
  const std::string error = error_of<ProtocolError>([&] { parser.next(); });
  EXPECT_NE(error.find("oversized store message: 67108865 bytes announced"), std::string::npos)
      << error;
  // Poisoned: the stream cannot be resynchronised, and nothing more is kept.
  const Bytes more(1000, 0);
  parser.feed(more.data(), more.size());
  EXPECT_EQ(parser.buffered_bytes(), 0u);
  EXPECT_THROW(parser.next(), ProtocolError);

  MessageParser small(64);
  const Bytes frame = encode(msg::set("k", Bytes(100, 1)));
  small.feed(frame.data(), frame.size());
  EXPECT_THROW(small.next(), ProtocolError);
}

TEST(StoreProtocol, EncodeRefusesMessagesOver64MiB) {
  const std::string error =
      error_of<ProtocolError>([] { encode(msg::set("blob", Bytes(kMaxMessageBytes))); });
  EXPECT_NE(error.find("SET message for key 'blob'"), std::string::npos) << error;
  EXPECT_NE(error.find("64 MiB"), std::string::npos) << error;
}

// A deterministic fuzz loop: random bytes and mutated valid frames, fed in
// random chunks. The parser must yield messages or ProtocolError, and every
// message it yields must re-encode to a frame that parses back to itself.
TEST(StoreProtocol, FuzzLoopYieldsMessagesOrProtocolError) {
  std::mt19937 rng(20261122);
  const std::vector<Message> valid = one_of_each();
  int messages = 0;
  int errors = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    Bytes input;
    if (iteration % 2 == 0) {
      input.resize(rng() % 64);
      for (uint8_t& b : input) b = static_cast<uint8_t>(rng() % 4 == 0 ? rng() % 16 : rng());
    } else {
      for (int k = 0; k < 3; ++k) encode(valid[rng() % valid.size()], input);
      for (int flips = rng() % 4; flips > 0; --flips)
        input[rng() % input.size()] = static_cast<uint8_t>(rng());
      input.resize(input.size() - rng() % 3);
    }
    MessageParser parser;
    size_t fed = 0;
    try {
      while (fed < input.size()) {
        const size_t chunk = std::min<size_t>(1 + rng() % 16, input.size() - fed);
        parser.feed(input.data() + fed, chunk);
        fed += chunk;
        for (const Message& m : drain(parser)) {
          ++messages;
          const Bytes again = encode(m);
          MessageParser check;
          check.feed(again.data(), again.size());
          ASSERT_EQ(check.next(), m);
        }
      }
    } catch (const ProtocolError&) {
      ++errors;
    }
    EXPECT_LE(parser.buffered_bytes(), input.size());
  }
  EXPECT_GT(messages, 1000);
  EXPECT_GT(errors, 1000);
}

// ---- The server and its clients --------------------------------------------

TcpStoreServerOptions server_options(std::string secret = "", int port = 0) {
  TcpStoreServerOptions options;
  options.port = port;
  options.secret = std::move(secret);
  return options;
}

TcpStoreOptions client_options(int port, std::string secret = "", Ms timeout = 2000ms) {
  TcpStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.secret = std::move(secret);
  options.timeout = timeout;
  options.connect_timeout = 2000ms;
  return options;
}

// A socket bound to an ephemeral port on 127.0.0.1 (listening or not).
UniqueFd bound_socket(bool listening, int& port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  if (listening) {
    EXPECT_EQ(::listen(fd.get(), 1), 0);
  }
  port = store_detail::local_port(fd.get());
  return fd;
}

// A hand-driven connection, to send what TcpStore never would.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_.reset(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  void send(const Bytes& bytes) {
    EXPECT_EQ(::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // The next message, or nullopt when the server closed the connection.
  std::optional<Message> read(Ms timeout = 2000ms) {
    uint8_t buffer[4096];
    for (;;) {
      if (auto m = parser_.next()) return m;
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) {
        ADD_FAILURE() << "no reply from the server";
        return std::nullopt;
      }
      const ssize_t n = ::recv(fd_.get(), buffer, sizeof(buffer), 0);
      if (n <= 0) return std::nullopt;
      parser_.feed(buffer, static_cast<size_t>(n));
    }
  }

 private:
  UniqueFd fd_;
  MessageParser parser_;
};

TEST(StoreTcp, SetGetAddCompareSetDeleteCheck) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port()));
  store.set("name", "rank0");
  EXPECT_EQ(store.get_string("name"), "rank0");
  store.set("empty", Bytes{});
  EXPECT_EQ(store.get("empty"), Bytes{});

  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -7), -2);
  EXPECT_EQ(store.get_string("n"), "-2");  // counters are decimal text, as in PyTorch

  EXPECT_EQ(store.compare_set("cas", {}, bytes_of("first")),
            bytes_of("first"));  // absent + empty: set
  EXPECT_EQ(store.compare_set("cas", bytes_of("wrong"), bytes_of("x")), bytes_of("first"));
  EXPECT_EQ(store.compare_set("cas", bytes_of("first"), bytes_of("second")), bytes_of("second"));
  EXPECT_EQ(store.compare_set("absent", bytes_of("x"), bytes_of("y")), Bytes{});
  EXPECT_FALSE(store.check({"absent"}));

  EXPECT_TRUE(store.check({"name", "n", "cas"}));
  EXPECT_FALSE(store.check({"name", "nope"}));
  EXPECT_TRUE(store.delete_key("name"));
  EXPECT_FALSE(store.delete_key("name"));
  EXPECT_FALSE(store.check({"name"}));
  EXPECT_EQ(store.timeout(), 2000ms);
}

TEST(StoreTcp, ErrorReplyKeepsTheConnection) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port()));
  store.set("text", "abc");
  const std::string error = error_of<StoreError>([&] { store.add("text", 1); });
  EXPECT_NE(error.find(
                "add('text', 1) failed: add('text'): the key holds a value that is not an integer"),
            std::string::npos)
      << error;
  store.set("max", std::to_string(INT64_MAX));
  EXPECT_NE(error_of<StoreError>([&] { store.add("max", 1); }).find("overflow"), std::string::npos);
  EXPECT_EQ(store.get_string("text"), "abc");
}

TEST(StoreTcp, GetBlocksUntilAnotherClientSetsTheKey) {
  TcpStoreServer server(server_options());
  TcpStore reader(client_options(server.port()));
  TcpStore writer(client_options(server.port()));
  const auto start = std::chrono::steady_clock::now();
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    writer.set("late", "here");
  });
  EXPECT_EQ(reader.get_string("late"), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 90ms);
  later.join();
  reader.wait({"late"});  // already there: returns at once
}

// torch's Store.wait(keys, 0) waits without a limit (the store's timeout here is 2 s);
// a wait longer than the server keeps (30 days) is cut to it, not an overflow taken
// for a hung server; a negative timeout is named.
TEST(StoreTcp, AWaitOfZeroHasNoLimitAndAVeryLongOneIsCut) {
  TcpStoreServer server(server_options());
  TcpStore reader(client_options(server.port()));
  TcpStore writer(client_options(server.port()));
  std::thread later([&] {
    std::this_thread::sleep_for(2500ms);
    writer.set("zero", "here");
    writer.set("long", "here");
  });
  const auto start = std::chrono::steady_clock::now();
  reader.wait({"zero"}, 0ms);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 2400ms) << "wait(0) did not wait";
  reader.wait({"long"}, std::chrono::hours(24 * 365 * 1000));
  later.join();
  const std::string msg = test_util::value_error([&] { reader.wait({"never"}, -5ms); });
  EXPECT_NE(msg.find("store wait('never'): timeout -5 ms is negative"), std::string::npos) << msg;
}

// Note [on close]: a client's ON_CLOSE keys appear when its connection ends, and
// wake another client already waiting for them; a client that is still
// connected sets nothing.
TEST(StoreTcp, OnCloseKeysAreSetWhenTheConnectionCloses) {
  TcpStoreServer server(server_options());
  TcpStore watcher(client_options(server.port()));
  auto agent = std::make_unique<TcpStore>(client_options(server.port()));
  agent->set_on_close("gone/1", "node 1");
  agent->set_on_close("gone/any", "1");
  agent->set("beat", "1");
  EXPECT_FALSE(watcher.check({"gone/1"}));  // registered, not set
  std::thread waiting([&] { watcher.wait({"gone/1", "gone/any"}, 5s); });
  std::this_thread::sleep_for(50ms);
  agent.reset();  // as the agent's process dying: the kernel closes the socket
  waiting.join();
  EXPECT_EQ(watcher.get_string("gone/1"), "node 1");
  EXPECT_EQ(watcher.get_string("gone/any"), "1");
  EXPECT_EQ(watcher.get_string("beat"), "1");
}

TEST(StoreTcp, GetTimeoutNamesTheKey) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port(), "", 200ms));
  const std::string error = error_of<StoreTimeoutError>([&] { store.get("never"); });
  EXPECT_NE(error.find("store get('never') timed out after 0.2 s: no rank set the key"),
            std::string::npos)
      << error;
  store.set("after", "ok");  // the connection is still usable
  EXPECT_EQ(store.get_string("after"), "ok");
}

TEST(StoreTcp, WaitTimeoutNamesTheMissingKeys) {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port()));
  store.set("rank0", "up");
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of<StoreTimeoutError>([&] {
    store.wait({"rank0", "rank1", "rank2"}, 200ms);
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_NE(
      error.find(
          "store wait timed out after 0.2 s; missing keys: 'rank1', 'rank2' (2 of 3 waited for)"),
      std::string::npos)
      << error;
  EXPECT_GE(elapsed, 190ms);
  EXPECT_LT(elapsed, 2000ms);
}

TEST(StoreTcp, WaitReturnsWhenTheLastKeyAppears) {
  TcpStoreServer server(server_options());
  TcpStore waiter(client_options(server.port()));
  TcpStore writer(client_options(server.port()));
  std::thread later([&] {
    writer.set("a", "1");
    std::this_thread::sleep_for(50ms);
    writer.add("b", 1);
  });
  waiter.wait({"a", "b"}, 2000ms);
  later.join();
  EXPECT_EQ(waiter.get_string("b"), "1");
}

TEST(StoreTcp, SixteenClientsAddConcurrently) {
  TcpStoreServer server(server_options());
  constexpr int kClients = 16;
  constexpr int kAdds = 100;
  std::vector<std::vector<int64_t>> seen(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      TcpStore store(client_options(server.port()));
      for (int k = 0; k < kAdds; ++k) seen[i].push_back(store.add("counter", 1));
    });
  }
  for (std::thread& t : threads) t.join();
  TcpStore store(client_options(server.port()));
  EXPECT_EQ(store.add("counter", 0), kClients * kAdds);
  std::set<int64_t> all;
  for (const auto& values : seen) all.insert(values.begin(), values.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kClients * kAdds));  // every add saw a distinct value
}

TEST(StoreTcp, ClientMayStartBeforeTheServer) {
  int port = 0;
  { UniqueFd probe = bound_socket(false, port); }  // a free port, released for the server
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>(server_options("", port));
  });
  const auto start = std::chrono::steady_clock::now();
  TcpStore store(client_options(port));  // refused at first, retried with backoff
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  starter.join();
  store.set("k", "v");
  EXPECT_EQ(store.get_string("k"), "v");
}

TEST(StoreTcp, PortInUseSaysWhatToDo) {
  TcpStoreServer first(server_options());
  const std::string error =
      error_of<StoreError>([&] { TcpStoreServer second(server_options("", first.port())); });
  EXPECT_EQ(error,
            fmt::format("cannot listen on 127.0.0.1:{}: Address already in use; another job (or "
                        "a stale ddprun, or a second process started as rank 0) holds the port — "
                        "pass another --master-port (ddprun) or MASTER_PORT, or stop it",
                        first.port()));
}

TEST(StoreTcp, ConnectionRefusedSaysWhatToCheck) {
  int port = 0;
  UniqueFd not_listening = bound_socket(false, port);  // connecting here is refused
  TcpStoreOptions options = client_options(port);
  options.connect_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of<StoreError>([&] { TcpStore store(options); });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(error,
            fmt::format("cannot connect to the store at 127.0.0.1:{} after 0.3 s: Connection "
                        "refused. Is MASTER_ADDR/MASTER_PORT right and is rank 0 / ddprun running?",
                        port));
  EXPECT_GE(elapsed, 290ms);
  EXPECT_LT(elapsed, 2000ms);
}

TEST(StoreTcp, WrongOrMissingSecretIsRejected) {
  TcpStoreServer server(server_options("s3cret"));
  const std::string error =
      error_of<StoreError>([&] { TcpStore store(client_options(server.port(), "guess")); });
  EXPECT_NE(error.find("refused this client: wrong or missing secret"), std::string::npos) << error;
  EXPECT_NE(error.find("DDP_STORE_SECRET"), std::string::npos) << error;

  RawClient no_hello(server.port());  // skips HELLO: answered ERROR, then closed
  no_hello.send(encode(msg::set("k", bytes_of("v"))));
  const auto reply = no_hello.read();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->command, Command::kError);
  EXPECT_NE(reply->text.find("wrong or missing secret"), std::string::npos) << reply->text;
  EXPECT_FALSE(no_hello.read().has_value());

  TcpStore store(client_options(server.port(), "s3cret"));
  EXPECT_FALSE(store.check({"k"}));  // the rejected SET was not applied
}

TEST(StoreTcp, EmptySecretAcceptsAnyClient) {
  TcpStoreServer server(server_options(""));
  TcpStore with_secret(client_options(server.port(), "anything"));
  with_secret.set("k", "v");
  RawClient raw(server.port());  // no HELLO at all
  raw.send(encode(msg::get("k", 0)));
  const auto reply = raw.read();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(*reply, msg::value(bytes_of("v")));
}

void expect_rejected(int port, const Bytes& bytes, const std::string& expected_text) {
  RawClient raw(port);
  raw.send(bytes);
  auto reply = raw.read();
  if (reply && reply->command == Command::kOk) reply = raw.read();  // the answer to HELLO
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->command, Command::kError);
  EXPECT_NE(reply->text.find(expected_text), std::string::npos) << reply->text;
  EXPECT_FALSE(raw.read().has_value()) << "the server should close the connection";
}

TEST(StoreTcp, ServerSurvivesMalformedAndOversizedMessages) {
  TcpStoreServer server(server_options("s3cret"));
  TcpStore store(client_options(server.port(), "s3cret"));
  store.set("alive", "yes");
  std::thread blocked([&] {
    TcpStore waiter(client_options(server.port(), "s3cret"));
    EXPECT_EQ(waiter.get_string("later"), "set");  // parked across all the abuse below
  });
  expect_rejected(server.port(), {1, 0, 0, 0, 99}, "unknown command 99");
  expect_rejected(server.port(), {0xFF, 0xFF, 0xFF, 0x7F},
                  "oversized store message");  // before HELLO
  Bytes hello = encode(msg::hello("s3cret"));
  Bytes big = hello;
  big.insert(big.end(), {0x01, 0x00, 0x00, 0x05});  // 80 MiB announced after HELLO
  expect_rejected(server.port(), big, "the limit is 67108864 bytes (64 MiB)");
  Bytes truncated = hello;
  truncated.insert(truncated.end(), {7, 0, 0, 0, 2, 100, 0, 0, 0, 'a', 'b'});
  expect_rejected(server.port(), truncated, "'key' is truncated");
  Bytes reply_as_request = hello;
  encode(msg::ok(), reply_as_request);
  expect_rejected(server.port(), reply_as_request, "unexpected OK message");
  {
    RawClient vanishes(server.port());
    vanishes.send({5, 0, 0});
  }  // half a header, then gone

  EXPECT_EQ(store.get_string("alive"), "yes");
  TcpStore fresh(client_options(server.port(), "s3cret"));
  fresh.set("later", "set");
  blocked.join();
}

// Note [store admission]: a connection that says nothing is closed at the
// first-message deadline; one that said HELLO stays.
TEST(StoreTcp, SilentConnectionsAreClosedAtTheFirstMessageDeadline) {
  TcpStoreServerOptions options = server_options("s3cret");
  options.first_message_timeout = 200ms;
  TcpStoreServer server(options);
  RawClient silent(server.port());
  RawClient half(server.port());
  half.send({5, 0, 0});  // half a frame header, then nothing
  TcpStore greeted(client_options(server.port(), "s3cret"));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(silent.read(5000ms).has_value()) << "the silent connection should be closed";
  EXPECT_FALSE(half.read(5000ms).has_value()) << "the half-frame connection should be closed";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4000ms);
  std::this_thread::sleep_for(300ms);
  greeted.set("still", "here");  // past the deadline, the greeted client is served
  EXPECT_EQ(greeted.get_string("still"), "here");
}

TEST(StoreTcp, TooManySilentConnectionsCloseTheOldest) {
  TcpStoreServerOptions options = server_options("s3cret");
  options.max_pending = 3;
  TcpStoreServer server(options);
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 5; ++i) silent.push_back(std::make_unique<RawClient>(server.port()));
  TcpStore store(client_options(server.port(), "s3cret"));  // itself pending for a moment
  store.set("k", "v");
  // The oldest made room for the newer ones (each arrival past 3 closes one).
  EXPECT_FALSE(silent[0]->read(2000ms).has_value());
  EXPECT_FALSE(silent[1]->read(2000ms).has_value());
  silent[4]->send(encode(msg::hello("s3cret")));
  const auto reply = silent[4]->read();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->command, Command::kOk);
  EXPECT_EQ(store.get_string("k"), "v");
}

TEST(StoreTcp, ConnectionsPastTheLimitAreRefusedByName) {
  TcpStoreServerOptions options = server_options("");
  options.max_clients = 2;
  TcpStoreServer server(options);
  TcpStore first(client_options(server.port()));
  TcpStore second(client_options(server.port()));
  first.set("k", "v");
  RawClient third(server.port());
  third.send(encode(msg::get("k", 0)));
  const auto reply = third.read();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->command, Command::kError);
  EXPECT_NE(reply->text.find("serves 2 connections, its limit"), std::string::npos) << reply->text;
  EXPECT_EQ(second.get_string("k"), "v");
}

TEST(StoreTcp, StopReleasesABlockedClientPromptly) {
  auto server = std::make_unique<TcpStoreServer>(server_options());
  TcpStore store(client_options(server->port(), "", 10000ms));
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server->stop();
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of<StoreError>([&] { store.get("never"); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2000ms);
  EXPECT_NE(error.find("lost the connection to the store"), std::string::npos) << error;
  stopper.join();
  server->stop();  // idempotent
}

TEST(StoreTcp, SecretComesFromTheEnvironment) {
  ::unsetenv(kStoreSecretEnv);
  EXPECT_EQ(store_secret_from_env(), "");
  ::setenv(kStoreSecretEnv, "from-env", 1);
  EXPECT_EQ(store_secret_from_env(), "from-env");
  ::unsetenv(kStoreSecretEnv);
}

// Note [store backup]
TcpStoreServerOptions backup_options(int primary_port, std::string secret = "") {
  TcpStoreServerOptions options = server_options(std::move(secret));
  options.follow_host = "127.0.0.1";
  options.follow_port = primary_port;
  return options;
}

TcpStoreOptions failover_options(int port, int backup_port, std::string secret = "") {
  TcpStoreOptions options = client_options(port, std::move(secret), 5000ms);
  options.backup_host = "127.0.0.1";
  options.backup_port = backup_port;
  return options;
}

// Waits up to 5 s for `condition`; whether it came.
template <typename F>
bool eventually(F&& condition) {
  for (int i = 0; i < 500; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

TEST(StoreBackup, MirrorsEveryKeyAndWriteAndTakesOverWhenThePrimaryStops) {
  auto primary = std::make_unique<TcpStoreServer>(server_options("s3cret"));
  TcpStore writer(client_options(primary->port(), "s3cret"));
  writer.set("before", "snapshot");  // there before the backup: comes in the snapshot
  writer.set("doomed", "x");
  TcpStoreServer backup(backup_options(primary->port(), "s3cret"));
  ASSERT_TRUE(eventually([&] { return backup.in_sync(); })) << "the backup never got in sync";
  EXPECT_FALSE(backup.promoted());
  // On standby it refuses clients, by name, so that none splits from the primary.
  TcpStoreOptions direct = client_options(backup.port(), "s3cret");
  direct.connect_timeout = 200ms;
  const std::string refused = error_of<StoreError>([&] { TcpStore early(direct); });
  EXPECT_NE(refused.find("standby: this is the backup of the store at 127.0.0.1:" +
                         std::to_string(primary->port())),
            std::string::npos)
      << refused;
  // Every kind of write, each applied once.
  writer.set("after", "streamed");
  EXPECT_EQ(writer.add("counter", 5), 5);
  EXPECT_EQ(writer.add("counter", 2), 7);
  writer.compare_set("cas", {}, bytes_of("first"));
  writer.compare_set("cas", bytes_of("wrong"), bytes_of("never"));  // no write
  EXPECT_TRUE(writer.delete_key("doomed"));
  auto agent = std::make_unique<TcpStore>(client_options(primary->port(), "s3cret"));
  agent->set_on_close("node/1/closed", "1");
  agent.reset();
  ASSERT_TRUE(eventually([&] { return writer.check({"node/1/closed"}); }));
  primary->stop();  // as node 0's ddprun dying: the stream ends
  ASSERT_TRUE(eventually([&] { return backup.promoted(); })) << "the backup did not take over";
  TcpStore reader(client_options(backup.port(), "s3cret"));
  EXPECT_EQ(reader.get_string("before"), "snapshot");
  EXPECT_EQ(reader.get_string("after"), "streamed");
  EXPECT_EQ(reader.add("counter", 0), 7);
  EXPECT_EQ(reader.get_string("cas"), "first");
  EXPECT_FALSE(reader.check({"doomed"}));
  EXPECT_EQ(reader.get_string("node/1/closed"), "1");
}

// Note [store failover]: a client parked in a GET on the primary when it dies gets
// its answer from the backup, and its ON_CLOSE keys move with it.
TEST(StoreBackup, ClientsGoToTheBackupWithTheirWaitsAndOnCloseKeys) {
  auto primary = std::make_unique<TcpStoreServer>(server_options());
  const int primary_port = primary->port();
  TcpStoreServer backup(backup_options(primary_port));
  ASSERT_TRUE(eventually([&] { return backup.in_sync(); }));
  auto agent = std::make_unique<TcpStore>(failover_options(primary_port, backup.port()));
  agent->set_on_close("node/2/closed", "1");
  TcpStore waiter(failover_options(primary_port, backup.port()));
  EXPECT_FALSE(waiter.on_backup());
  std::string got;
  std::thread waiting([&] { got = waiter.get_string("membership"); });
  std::this_thread::sleep_for(100ms);  // parked on the primary
  primary.reset();
  ASSERT_TRUE(eventually([&] { return backup.promoted(); }));
  TcpStore authority(failover_options(primary_port, backup.port()));  // the primary is gone
  authority.set("membership", "2,3");
  waiting.join();
  EXPECT_EQ(got, "2,3");
  EXPECT_TRUE(waiter.on_backup());
  EXPECT_TRUE(authority.on_backup());
  EXPECT_EQ(agent->get_string("membership"), "2,3");  // its first call after the loss moves it
  EXPECT_TRUE(agent->on_backup());
  EXPECT_FALSE(authority.check({"node/2/closed"}));
  agent.reset();  // registered again on the backup: it sets the key
  ASSERT_TRUE(eventually([&] { return authority.check({"node/2/closed"}); }))
      << "the ON_CLOSE key was not registered again on the backup";
}

// The backup's host takes over itself when the primary is alive but silent.
TEST(StoreBackup, PromoteServesAtOnceAndStopsFollowing) {
  TcpStoreServer primary(server_options());
  TcpStore writer(client_options(primary.port()));
  writer.set("epoch", "4");
  TcpStoreServer backup(backup_options(primary.port()));
  ASSERT_TRUE(eventually([&] { return backup.in_sync(); }));
  backup.promote();
  TcpStore reader(client_options(backup.port()));
  EXPECT_EQ(reader.get_string("epoch"), "4");
  ASSERT_TRUE(eventually([&] { return !backup.in_sync(); })) << "it still follows the primary";
  writer.set("epoch", "5");  // the primary's writes no longer reach it
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(reader.get_string("epoch"), "4");
}

// A backup given the wrong secret never gets in sync and never serves.
TEST(StoreBackup, AWrongSecretKeepsTheBackupOnStandby) {
  TcpStoreServer primary(server_options("right"));
  TcpStoreServer backup(backup_options(primary.port(), "wrong"));
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(backup.in_sync());
  EXPECT_FALSE(backup.promoted());
}

// The follower's writes are applied as they come, not when a client happens to
// wake the backup's loop.
TEST(StoreBackup, MirroredWritesAreAppliedAsTheyCome) {
  TcpStoreServer primary(server_options());
  TcpStoreServer backup(backup_options(primary.port()));
  ASSERT_TRUE(eventually([&] { return backup.in_sync(); }));
  TcpStore writer(client_options(primary.port()));
  const uint64_t before = backup.applied_writes();
  for (int i = 0; i < 100; ++i) writer.set("k" + std::to_string(i), "v");
  EXPECT_TRUE(eventually([&] { return backup.applied_writes() - before == 100; }))
      << "applied " << backup.applied_writes() - before << " of 100";
}

// A write is acknowledged only once the backup's socket took it, however large.
TEST(StoreBackup, AnAcknowledgedLargeWriteIsOnTheBackup) {
  auto primary = std::make_unique<TcpStoreServer>(server_options());
  TcpStoreServer backup(backup_options(primary->port()));
  ASSERT_TRUE(eventually([&] { return backup.in_sync(); }));
  TcpStore writer(client_options(primary->port()));
  writer.set("big", std::string(size_t{16} << 20, 'x'));
  writer.set("after", "1");
  primary.reset();
  ASSERT_TRUE(eventually([&] { return backup.promoted(); }));
  TcpStore reader(client_options(backup.port()));
  EXPECT_EQ(reader.get("big").size(), size_t{16} << 20);
  EXPECT_EQ(reader.get_string("after"), "1");
}

// A TCP relay to `target` whose current connection the test can cut; it takes
// new connections until it is destroyed, or until the target refuses one (then
// it closes its port, so that connections to it are refused too).
class Relay {
 public:
  explicit Relay(int target) : target_(target) {
    listen_ = bound_socket(true, port_);
    worker_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    worker_.join();
  }
  int port() const { return port_; }
  void cut() { cut_ = true; }

 private:
  void run() {
    while (!stop_) {
      pollfd p{listen_.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      UniqueFd in(::accept(listen_.get(), nullptr, nullptr));
      UniqueFd out(::socket(AF_INET, SOCK_STREAM, 0));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(target_));
      if (!in) continue;
      if (::connect(out.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        listen_.reset();  // the target is gone: refuse as it does
        return;
      }
      cut_ = false;
      char buf[65536];
      while (!stop_ && !cut_) {
        pollfd q[2] = {{in.get(), POLLIN, 0}, {out.get(), POLLIN, 0}};
        if (::poll(q, 2, 20) <= 0) continue;
        const int from = q[0].revents != 0 ? in.get() : out.get();
        const int to = from == in.get() ? out.get() : in.get();
        const ssize_t n = ::read(from, buf, sizeof(buf));
        if (n <= 0 || ::write(to, buf, static_cast<size_t>(n)) != n) break;
      }
    }
  }

  int target_;
  int port_ = 0;
  UniqueFd listen_;
  std::atomic<bool> stop_{false}, cut_{false};
  std::thread worker_;
};

// The stream breaks while the primary lives: the backup follows again instead of
// taking over (two stores would serve), and takes over once the primary is gone.
TEST(StoreBackup, ABrokenStreamToALivePrimaryIsFollowedAgain) {
  auto primary = std::make_unique<TcpStoreServer>(server_options());
  Relay relay(primary->port());
  TcpStoreServer backup(backup_options(relay.port()));
  ASSERT_TRUE(eventually([&] { return backup.in_sync(); }));
  TcpStore writer(client_options(primary->port()));
  writer.set("epoch", "1");
  relay.cut();  // it follows again at once (epoch 2 can only come through a new stream)
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(backup.promoted()) << "it took over from a primary that lives";
  ASSERT_TRUE(eventually([&] { return backup.in_sync(); })) << "it did not follow again";
  writer.set("epoch", "2");
  primary.reset();
  ASSERT_TRUE(eventually([&] { return backup.promoted(); }));
  TcpStore reader(client_options(backup.port()));
  EXPECT_EQ(reader.get_string("epoch"), "2");
}

// Note [store backup]: a primary that exits closes the stream; one that drops a
// too slow backup resets it, which the backup must not take for an exit.
TEST(StoreBackup, TheStreamsEndTellsAnExitFromADrop) {
  for (const bool drop : {false, true}) {
    int port = 0;
    UniqueFd listener = bound_socket(true, port);
    std::thread primary([&] {
      UniqueFd c(::accept(listener.get(), nullptr, nullptr));
      MessageParser parser;
      uint8_t buf[4096];
      for (int seen = 0; seen < 2;) {  // HELLO, then REPLICATE
        const ssize_t n = ::recv(c.get(), buf, sizeof(buf), 0);
        ASSERT_GT(n, 0);
        parser.feed(buf, static_cast<size_t>(n));
        while (auto m = parser.next()) {
          ++seen;
          if (m->command == Command::kHello) {
            const Bytes ok = encode(msg::ok());
            ASSERT_EQ(::send(c.get(), ok.data(), ok.size(), MSG_NOSIGNAL),
                      static_cast<ssize_t>(ok.size()));
          }
        }
      }
      Bytes out;
      encode(msg::set("k", bytes_of("v")), out);
      encode(msg::ok(), out);
      ASSERT_EQ(::send(c.get(), out.data(), out.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(out.size()));
      std::this_thread::sleep_for(200ms);  // read before the end
      if (drop) {
        const linger reset{.l_onoff = 1, .l_linger = 0};
        ::setsockopt(c.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
      }
    });
    TcpStore follower(client_options(port));
    int sets = 0, oks = 0;
    const auto end = follower.replicate(
        [&](Message&& m) {
          sets += m.command == Command::kSet ? 1 : 0;
          oks += m.command == Command::kOk ? 1 : 0;
        },
        [] { return false; });
    primary.join();
    EXPECT_EQ(sets, 1);
    EXPECT_EQ(oks, 1);
    EXPECT_EQ(end, drop ? TcpStore::StreamEnd::reset : TcpStore::StreamEnd::closed)
        << (drop ? "a drop" : "an exit");
  }
}

}  // namespace
}  // namespace ddp
