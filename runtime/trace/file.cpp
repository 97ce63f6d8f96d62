// Note [trace files]: the per-rank file, written and read back.
#include "runtime/trace/file.h"

#include "runtime/checkpoint/json.h"
#include "runtime/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <set>

namespace ddp::trace {
namespace {

constexpr int kVersion = 2;

// Argument keys read from a file live as long as the process (Arg keeps a pointer).
const char* intern(const std::string& key) {
  static std::mutex mutex;
  static auto* keys = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mutex);
  return keys->insert(key).first->c_str();
}

void write_event(std::ostream& out, const TraceEvent& e) {
  out << "{\"ph\": \"" << e.phase << "\", \"track\": " << e.track << ", \"ts\": " << e.ts;
  if (e.phase == 'X') out << ", \"dur\": " << e.duration_ns;
  if (e.flow.id != 0 && e.flow.out) out << ", \"flow_out\": " << e.flow.id;
  if (e.flow.id != 0 && e.flow.in) out << ", \"flow_in\": " << e.flow.id;
  out << ", \"name\": " << json_string(e.name) << ", \"cat\": " << json_string(e.category);
  if (e.unfinished) out << ", \"unfinished\": 1";
  if (!e.args.empty()) {
    out << ", \"args\": {";
    for (size_t i = 0; i < e.args.size(); ++i) {
      out << (i == 0 ? "" : ", ") << json_string(e.args[i].key) << ": " << e.args[i].value;
    }
    out << "}";
  }
  out << "}";
}

// Reading: every field checked, so a damaged file is named, not half-merged.
class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  const json::Value& field(const json::Value& object, std::string_view key,
                           json::Value::Kind kind) const {
    const json::Value* v = object.find(key);
    DDP_CHECK(v != nullptr && v->kind == kind,
              "{}: not a ddp trace file: \"{}\" is {}, expected {} (Note [trace files])", source_,
              key, v == nullptr ? "missing" : json::kind_name(v->kind), json::kind_name(kind));
    return *v;
  }
  int64_t integer(const json::Value& o, std::string_view key) const {
    return field(o, key, json::Value::Kind::integer).integer;
  }
  std::string string(const json::Value& o, std::string_view key) const {
    return field(o, key, json::Value::Kind::string).string;
  }
  int64_t integer_or(const json::Value& o, std::string_view key, int64_t fallback) const {
    return o.find(key) == nullptr ? fallback : integer(o, key);
  }

  TraceEvent event(const json::Value& v) const {
    DDP_CHECK(v.kind == json::Value::Kind::object, "{}: an event is {}, expected an object",
              source_, json::kind_name(v.kind));
    TraceEvent e;
    const std::string ph = string(v, "ph");
    DDP_CHECK(ph == "X" || ph == "i", "{}: event phase '{}' is not one of X, i", source_, ph);
    e.phase = ph[0];
    e.track = static_cast<Track>(integer(v, "track"));
    e.ts = integer(v, "ts");
    e.duration_ns = integer_or(v, "dur", 0);
    const int64_t out = integer_or(v, "flow_out", 0), in = integer_or(v, "flow_in", 0);
    DDP_CHECK(out == 0 || in == 0 || out == in,
              "{}: an event starts flow {} and ends flow {}; one slice binds one arrow", source_,
              out, in);
    e.flow = {.id = static_cast<uint64_t>(out != 0 ? out : in), .out = out != 0, .in = in != 0};
    e.name = string(v, "name");
    e.category = string(v, "cat");
    e.unfinished = integer_or(v, "unfinished", 0) != 0;
    if (const json::Value* args = v.find("args")) {
      DDP_CHECK(args->kind == json::Value::Kind::object, "{}: \"args\" is {}, expected an object",
                source_, json::kind_name(args->kind));
      for (const auto& [key, value] : args->object) {
        DDP_CHECK(value.kind == json::Value::Kind::integer,
                  "{}: argument \"{}\" is {}, expected an integer", source_, key,
                  json::kind_name(value.kind));
        e.args.push_back({intern(key), value.integer});
      }
    }
    return e;
  }

 private:
  const std::string& source_;
};

}  // namespace

std::string json_string(std::string_view text) {
  return json::quote(valid_utf8(text));
}

std::string rank_file_name(int rank, int restart) {
  return restart == 0 ? fmt::format("rank_{}.json", rank)
                      : fmt::format("rank_{}_restart{}.json", rank, restart);
}

namespace {

// A stream into a file descriptor that keeps the errno of a failed write (an
// ofstream's failure says nothing about why).
class FileOut : public std::streambuf {
 public:
  explicit FileOut(int fd) : fd_(fd) { setp(buffer_, buffer_ + sizeof(buffer_)); }
  int error() const { return error_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    const char* p = pbase();
    size_t left = static_cast<size_t>(pptr() - pbase());
    while (left > 0 && error_ == 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) error_ = errno;
      if (n <= 0) break;
      p += n;
      left -= static_cast<size_t>(n);
    }
    setp(buffer_, buffer_ + sizeof(buffer_));
    return error_ == 0;
  }

  int fd_;
  int error_ = 0;
  char buffer_[1 << 16];
};

}  // namespace

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DDP_CHECK(fd >= 0, "cannot write {}: {}", temporary, std::strerror(errno));
  int error = 0;
  try {
    auto buffer = std::make_unique<FileOut>(fd);  // 64 KiB: not on a signal thread's stack
    std::ostream out(buffer.get());
    write(out);
    out.flush();
    error = buffer->error() != 0 ? buffer->error() : (out.good() ? 0 : EIO);
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    ::unlink(temporary.c_str());
    throw Error(fmt::format("cannot write {}: {}", temporary, std::strerror(error)));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    error = errno;
    ::unlink(temporary.c_str());
    throw Error(fmt::format("cannot rename {} to {}: {}", temporary, path, std::strerror(error)));
  }
}

// UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates, nothing past U+10FFFF.
std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto continuation = [&](size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = byte(i);
    size_t length = 0;
    if (c < 0x80) {
      length = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      length = continuation(i + 1) ? 2 : 0;
    } else if (c >= 0xE0 && c <= 0xEF) {
      const unsigned char low = c == 0xE0 ? 0xA0 : 0x80, high = c == 0xED ? 0x9F : 0xBF;
      const bool second = i + 1 < text.size() && byte(i + 1) >= low && byte(i + 1) <= high;
      length = second && continuation(i + 2) ? 3 : 0;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const unsigned char low = c == 0xF0 ? 0x90 : 0x80, high = c == 0xF4 ? 0x8F : 0xBF;
      const bool second = i + 1 < text.size() && byte(i + 1) >= low && byte(i + 1) <= high;
      length = second && continuation(i + 2) && continuation(i + 3) ? 4 : 0;
    }
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
      continue;
    }
    out.append(text.substr(i, length));
    i += length;
  }
  return out;
}

void write_rank_file(std::ostream& out, const Snapshot& s) {
  out << "{\"format\": \"ddp-trace\", \"version\": " << kVersion << ", \"rank\": " << s.rank.rank
      << ", \"world_size\": " << s.rank.world_size << ", \"run_id\": " << json_string(s.rank.run_id)
      << ", \"restart\": " << s.rank.restart << ", \"launcher\": " << json_string(s.rank.launcher)
      << ", \"backend\": " << json_string(s.rank.backend) << ", \"pid\": " << s.pid
      << ", \"host\": " << json_string(s.host) << ", \"taken_ns\": " << s.taken_ns
      << ", \"dropped\": " << s.dropped << ",\n\"clock\": [";
  for (size_t i = 0; i < s.clock.size(); ++i) {
    const ClockSample& c = s.clock[i];
    out << (i == 0 ? "" : ", ") << "{\"local_ns\": " << c.local_ns
        << ", \"offset_ns\": " << c.offset_ns << ", \"error_ns\": " << c.error_ns
        << ", \"reference\": " << json_string(c.reference) << "}";
  }
  out << "],\n\"tracks\": [";
  for (size_t i = 0; i < s.tracks.size(); ++i) {
    const TrackInfo& t = s.tracks[i];
    out << (i == 0 ? "" : ", ") << "{\"id\": " << t.id << ", \"name\": " << json_string(t.name)
        << ", \"os_tid\": " << t.os_tid << "}";
  }
  out << "],\n\"events\": [";
  for (size_t i = 0; i < s.events.size(); ++i) {
    out << (i == 0 ? "\n" : ",\n");
    write_event(out, s.events[i]);
  }
  out << "\n]}\n";
}

Snapshot parse_rank_file(std::string_view text, const std::string& source) {
  json::Value doc;
  try {
    doc = json::parse(text);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  const Reader read(source);
  DDP_CHECK(doc.kind == json::Value::Kind::object && doc.find("format") != nullptr &&
                read.string(doc, "format") == "ddp-trace",
            "{}: not a ddp trace file (no \"format\": \"ddp-trace\"; Note [trace files])", source);
  const int64_t version = read.integer(doc, "version");
  DDP_CHECK(version == kVersion,
            "{}: trace file version {}, this ddp reads version {}; merge it with the ddprun of the "
            "ddp that wrote it",
            source, version, kVersion);
  Snapshot s;
  s.rank.rank = static_cast<int>(read.integer(doc, "rank"));
  s.rank.world_size = static_cast<int>(read.integer(doc, "world_size"));
  s.rank.run_id = read.string(doc, "run_id");
  s.rank.restart = static_cast<int>(read.integer(doc, "restart"));
  s.rank.launcher = read.string(doc, "launcher");
  s.rank.backend = read.string(doc, "backend");
  s.pid = read.integer(doc, "pid");
  s.host = read.string(doc, "host");
  s.taken_ns = read.integer(doc, "taken_ns");
  s.dropped = read.integer(doc, "dropped");
  for (const json::Value& c : read.field(doc, "clock", json::Value::Kind::array).array) {
    s.clock.push_back({.local_ns = read.integer(c, "local_ns"),
                       .offset_ns = read.integer(c, "offset_ns"),
                       .error_ns = read.integer(c, "error_ns"),
                       .reference = read.string(c, "reference")});
  }
  for (const json::Value& t : read.field(doc, "tracks", json::Value::Kind::array).array) {
    s.tracks.push_back({.id = static_cast<Track>(read.integer(t, "id")),
                        .name = read.string(t, "name"),
                        .os_tid = read.integer(t, "os_tid")});
  }
  for (const json::Value& e : read.field(doc, "events", json::Value::Kind::array).array) {
    s.events.push_back(read.event(e));
  }
  return s;
}

}  // namespace ddp::trace
